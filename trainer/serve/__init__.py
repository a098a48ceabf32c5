"""`python -m trainer.serve`: a delivered model behind Vertex AI's custom-container
prediction contract (docs/serving.md). Runs in the serving container, never beside training:
it reads the task from the model's own files, batches the instances of concurrent requests
into one forward pass, and answers health 503 until the model is loaded and warmed."""
