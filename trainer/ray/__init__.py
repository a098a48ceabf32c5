"""`python -m trainer.ray`: the same training run as a Ray Train job on an existing Ray
cluster (Ray on Vertex AI, or any other). The run's configuration is resolved and checked
here, once, as the CustomJob launcher does; each Ray Train worker then runs the one training
core, `trainer.training.run.train`. docs/ray.md says how to use it."""
