"""Attention: scaled dot-product, masks, multi-head attention and positions."""
