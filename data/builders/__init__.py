"""TFDS builders of the data sets prepared on this machine, one module each."""
