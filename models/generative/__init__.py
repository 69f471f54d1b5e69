"""Generative models: autoencoders and VAEs, diffusion (DDPM, score SDEs, cold, discrete)."""
