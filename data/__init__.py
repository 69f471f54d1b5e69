"""Data sets, input pipelines, augmentation and tokenizers."""

from data.datasets import info, load

__all__ = ['info', 'load']
