"""Transformers: blocks, GPT, BERT, ViT and the encoder–decoder."""
