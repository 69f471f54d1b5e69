"""Vision models: convolutional networks and the Vision Transformer over images (batch,
height, width, channels), and a 1-D convolutional network over signals (batch, length)."""
