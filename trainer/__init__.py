"""Fine-tune Hugging Face models on Vertex AI worker pools with accelerate + DeepSpeed."""
