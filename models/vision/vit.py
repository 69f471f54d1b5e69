"""Vision Transformer, Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words: Transformers
for Image Recognition at Scale" (ICLR), §3.1 and eqs. 1–4.

An H×W×C image is cut into N = (H/P)(W/P) patches of P×P pixels, row-major, each
flattened to x_p^i ∈ R^{P²C}; they become tokens through one linear map E ∈ R^{P²C×D},
and a Transformer encoder (pre-LN) reads them:

  z_0 = [x_class; x_p^1 E; x_p^2 E; …; x_p^N E] + E_pos      E_pos ∈ R^{(N+1)×D}   (1)
  z'_l = MSA(LN(z_{l−1})) + z_{l−1},   l = 1 … L                                 (2)
  z_l = MLP(LN(z'_l)) + z'_l,          l = 1 … L                                 (3)
  y = LN(z_L^0)                                                                  (4)
  logits = y W_head + b_head

x_class is a learned token whose final state z_L^0 summarises the image. With
`pool='mean'` there is no class token and y = (1/N) Σ_i LN(z_L)^i (the paper's
"global average pooling" variant, App. D.3). x_p^i E is computed as a convolution
with kernel = stride = P, the same map on every patch.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models import layers
from models.attention import kinds
from models.attention.core import IN_ATTENTION
from models.transformer.blocks import TransformerBlock, layer_norm
from models.transformer.gpt import check_transformer_options, embed_positions

POOLS = ('cls', 'mean')


class ViT(nn.Module):
  """Vision Transformer (see module doc) on images x_BxHxWxC, channels last.

  Attributes:
    num_classes: number K of logits.
    patch_size: P; the image height and width must be multiples of P.
    num_layers, features, num_heads: L pre-LN blocks of width D with N heads.
    mlp_dim: the MLP's hidden width (default 4·D, as ViT-B/L/H).
    pool: 'cls' (eq. 4: the class token's final state) or 'mean' (the mean of
      the patch tokens' final states; no class token).
    positions: 'learned' (the paper's E_pos, 1-D over the row-major patch
      order, N(0, 0.02²)), 'sinusoidal' (fixed, Vaswani et al. 2017), 'rotary'
      or 'alibi' (inside attention, 1-D over the same order) or 'none' (the
      encoder then sees the patches as a set).
    attention: the self-attention's kind (models/attention/kinds.py), default 'exact';
      'linformer' then takes images of at most as many patches as those `init` saw.
    attention_options: that kind's options, e.g. {'num_features': 128} for 'performer'.
    dropout_rate: dropout after every dense layer but the qkv projections and on z_0 (App.
      B.1): on the output of every sub-layer (MSA and MLP) before its residual sum, and on the
      MLP's hidden units.
    use_bias: biases in the projections and LayerNorms.
    dtype: compute dtype; parameters, LayerNorms and logits are float32.
  """
  num_classes: int
  patch_size: int = 4
  num_layers: int = 6
  features: int = 128
  num_heads: int = 4
  mlp_dim: int | None = None
  pool: str = 'cls'
  positions: str = 'learned'
  attention: str = 'exact'
  attention_options: Any = ()
  dropout_rate: float = 0.0
  use_bias: bool = True
  dtype: Any = jnp.float32

  def __post_init__(self):
    check_transformer_options('ViT', self)
    for option in ('num_classes', 'patch_size'):
      value = getattr(self, option)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'ViT {option} must be a positive integer, got {value!r}.')
    if self.pool not in POOLS:
      raise ValueError(f'ViT pool={self.pool!r}; allowed: {", ".join(POOLS)}.')
    super().__post_init__()

  @property
  def rng_streams(self) -> tuple[str, ...]:
    """Random streams the model draws from while training, besides dropout."""
    return kinds.stream_names(self.attention)

  @nn.compact
  def __call__(self, images_BxHxWxC, *, train: bool = False):
    if images_BxHxWxC.ndim != 4:
      raise ValueError(f'ViT needs images of shape (B, H, W, C), got shape {images_BxHxWxC.shape}.')
    batch, height, width, _ = images_BxHxWxC.shape
    p = self.patch_size
    if height % p or width % p:
      raise ValueError(f'ViT image size {height}×{width} is not divisible by patch_size={p}; '
                       f'use a patch size that divides both sides or resize the images.')
    layers.check_input_width(self, 'patch_embed', images_BxHxWxC.shape[-1], 'ViT')
    patches_BxhxwxD = nn.Conv(
        self.features, (p, p), strides=(p, p), padding='VALID', use_bias=self.use_bias,
        dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                 (None, None, None, 'embed')),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
        name='patch_embed')(images_BxHxWxC.astype(self.dtype))
    x_BxNxD = patches_BxhxwxD.reshape(batch, -1, self.features)  # row-major patch order
    if self.pool == 'cls':
      x_class_1x1xD = self.param('class_token', nn.with_logical_partitioning(
          nn.initializers.zeros, (None, None, 'embed')), (1, 1, self.features))
      x_class_Bx1xD = jnp.broadcast_to(x_class_1x1xD, (batch, 1, self.features))
      x_BxNxD = jnp.concatenate([x_class_Bx1xD.astype(self.dtype), x_BxNxD], axis=1)
    if self.positions == 'learned' and self.has_variable('params', 'position_embed'):
      # The learned table has one row per token of the images `init` saw.
      table_length = nn.unbox(self.get_variable('params', 'position_embed'))['embedding'].shape[0]
      if table_length != x_BxNxD.shape[1]:
        cls = 1 if self.pool == 'cls' else 0
        raise ValueError(f'ViT image size {height}×{width} gives {x_BxNxD.shape[1] - cls} patches '
                         f'of {p}×{p}, but its learned positions were made for '
                         f'{table_length - cls} at init; give images of the size it was '
                         f'initialised with.')
    max_length = x_BxNxD.shape[1]
    if self.attention == 'linformer' and self.has_variable('params', 'block0'):
      # Linformer's projections have one column per token of the images `init` saw; fewer
      # tokens use their first columns (models/attention/linformer.py), more have none.
      block0 = nn.unbox(self.get_variable('params', 'block0'))
      max_length = block0['self_attention']['attend']['projections']['proj_e'].shape[1]
      if x_BxNxD.shape[1] > max_length:
        cls = 1 if self.pool == 'cls' else 0
        raise ValueError(f'ViT image size {height}×{width} gives {x_BxNxD.shape[1] - cls} patches '
                         f'of {p}×{p}, but its Linformer projections were made for at most '
                         f'{max_length - cls} at init; give images of at most that many patches.')
    x_BxNxD = embed_positions(x_BxNxD, self.positions, x_BxNxD.shape[1])
    x_BxNxD = nn.Dropout(self.dropout_rate, deterministic=not train)(x_BxNxD)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, ('batch', 'length', 'embed'))

    positions = self.positions if self.positions in IN_ATTENTION else 'none'
    for layer in range(self.num_layers):
      x_BxNxD = TransformerBlock(self.num_heads, self.mlp_dim or 4 * self.features,
                                 self.dropout_rate, pre_norm=True, positions=positions,
                                 attention=self.attention,
                                 attention_options=self.attention_options,
                                 max_length=max_length, use_bias=self.use_bias,
                                 dtype=self.dtype, mlp_hidden_dropout=True,
                                 name=f'block{layer}')(x_BxNxD, train=train)
    x_BxNxD = layer_norm(self.use_bias, 'final_norm')(x_BxNxD)
    y_BxD = x_BxNxD[:, 0] if self.pool == 'cls' else jnp.mean(x_BxNxD, axis=1)
    logits_BxK = nn.Dense(
        self.num_classes, use_bias=self.use_bias, dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', None)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
        name='head')(y_BxD)
    return logits_BxK.astype(jnp.float32)
