"""Transformers: blocks, GPT, BERT and the encoder–decoder (ViT, built of the same
blocks, is in models/vision/vit.py)."""
