"""triggers of the TAO SLURM provider."""
