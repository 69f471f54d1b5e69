"""Vision models: convolutional networks over images (batch, height, width, channels)."""
