"""operators of the TAO SLURM provider."""
