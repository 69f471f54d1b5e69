"""Sequence models: autoregressive networks over a time axis."""
