"""sensors of the TAO SLURM provider."""
