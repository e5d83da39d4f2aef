"""hooks of the TAO SLURM provider."""
