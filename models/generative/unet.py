"""U-Net noise predictor for diffusion models (Ronneberger, Fischer & Brox 2015, "U-Net"),
in the form of Ho, Jain & Abbeel 2020, "Denoising Diffusion Probabilistic Models", App. B:
Wide-ResNet blocks with group normalisation, a sinusoidal time embedding and self-attention
at low resolution. Sized by default for 28×28 Fashion-MNIST (28 → 14 → 7 and back).

  e   = Dense(SiLU(Dense(PE(s·t))))                       time embedding, width 4C
  h⁰  = conv3×3(x)
  down, level l = 0 … L−1:   h ← [Attn ∘] Res_l(h, e)  (num_res_blocks times), then
                             h ← conv3×3/2(h) (not after the last level); every h is kept
  middle:                    h ← Res(Attn(Res(h, e)), e)   (Attn if that size is listed)
  up, level l = L−1 … 0:     h ← [Attn ∘] Res_l([h, skip], e)  (num_res_blocks + 1 times,
                             skip = the kept activations, last in first out), then
                             h ← conv3×3(nearest-neighbour ×2 upsampling of h) (not at l = 0)
  ε̂   = conv3×3(SiLU(GroupNorm(h)))                      kernel and bias initialised to 0

  Res(x, e) = shortcut(x) + conv3×3(Dropout(SiLU(GN(conv3×3(SiLU(GN(x))) + Dense(SiLU(e))))))
  Attn(x)   = x + MultiHead(GN(x)) over the H·W positions

with PE the Transformer's sinusoidal embedding (Vaswani et al. 2017, §3.5) of the scaled time
s·t, and shortcut(x) = x, or a 1×1 convolution where the width changes. The output layer
starts at zero, so the untrained network predicts ε̂ = 0 (Ho et al.'s released model does the
same); the other layers keep Flax's default initialisation.
"""

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.attention import positions as positions_lib
from models.attention.core import MultiHeadAttention


def sinusoidal_embedding(t_B: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
  """[B, dim]: [sin(t ω_0), …, sin(t ω_{d/2−1}), cos(t ω_0), …, cos(t ω_{d/2−1})],
  ω_i = max_period^(−2i/dim) (Vaswani et al. 2017, §3.5, with t in place of the position).

  The frequencies are those of `positions.sinusoidal`; only the layout differs (sines then
  cosines, as in Ho et al. 2020, instead of interleaved), which a Dense layer after it
  does not care about. t may be an integer step or a real number.
  """
  pe_BxD = positions_lib.sinusoidal(jnp.asarray(t_B), dim, max_period)
  sin_cos_BxKx2 = pe_BxD.reshape(pe_BxD.shape[0], dim // 2, 2)
  return jnp.concatenate([sin_cos_BxKx2[..., 0], sin_cos_BxKx2[..., 1]], axis=-1)


def _conv(features: int, size: int, dtype, name: str, strides: int = 1, zero: bool = False):
  init = {'kernel_init': nn.initializers.zeros, 'bias_init': nn.initializers.zeros} if zero else {}
  return nn.Conv(features, (size, size), strides=(strides, strides),
                 padding=[(size // 2, size // 2)] * 2, dtype=dtype, param_dtype=jnp.float32,
                 name=name, **init)


def _norm(num_groups: int, dtype, name: str):
  return nn.GroupNorm(num_groups, epsilon=1e-6, dtype=dtype, param_dtype=jnp.float32, name=name)


class ResidualBlock(nn.Module):
  """Wide-ResNet block with the time embedding added after its first convolution
  (Zagoruyko & Komodakis 2016; Ho et al. 2020, App. B):

    h = conv3×3(SiLU(GN(x))) + Dense(SiLU(e))       (the same shift at every pixel)
    y = shortcut(x) + conv3×3(Dropout(SiLU(GN(h))))

  shortcut(x) = x if x already has `features` channels, else a 1×1 convolution.
  """
  features: int
  num_groups: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxHxWxC, emb_BxE, *, train: bool = False):
    h = _conv(self.features, 3, self.dtype, 'conv1')(
        nn.silu(_norm(self.num_groups, self.dtype, 'norm1')(x_BxHxWxC)))
    shift_BxF = nn.Dense(self.features, dtype=self.dtype, param_dtype=jnp.float32,
                         name='time_proj')(nn.silu(emb_BxE))
    h = h + shift_BxF[:, None, None, :]
    h = nn.silu(_norm(self.num_groups, self.dtype, 'norm2')(h))
    h = nn.Dropout(self.dropout_rate, deterministic=not train)(h)
    h_BxHxWxF = _conv(self.features, 3, self.dtype, 'conv2')(h)
    shortcut = x_BxHxWxC
    if x_BxHxWxC.shape[-1] != self.features:
      shortcut = _conv(self.features, 1, self.dtype, 'shortcut')(x_BxHxWxC)
    return shortcut + h_BxHxWxF


class AttentionBlock(nn.Module):
  """y = x + MultiHead(GN(x)): self-attention over the H·W positions of a feature map, each
  position a token of width C (Ho et al. 2020, App. B; Vaswani et al. 2017, §3.2.2). The
  attention is `models/attention/core.py`'s, with projections W^Q, W^K, W^V, W^O of [C, C]."""
  num_heads: int
  num_groups: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxHxWxC):
    batch, height, width, channels = x_BxHxWxC.shape
    h_BxTxC = _norm(self.num_groups, self.dtype, 'norm')(x_BxHxWxC).reshape(
        batch, height * width, channels)
    out_BxTxC = MultiHeadAttention(self.num_heads, dtype=self.dtype, name='attention')(h_BxTxC)
    return x_BxHxWxC + out_BxTxC.reshape(x_BxHxWxC.shape).astype(x_BxHxWxC.dtype)


class UNet(nn.Module):
  """Diffusion U-Net ε̂(x_t, t) (see the module doc): the same shape as x (or
  `out_channels` channels), in the compute dtype.

  Attributes:
    channels: the base width C (level l has width C·channel_mults[l]; the time
      embedding is PE of width C, then 4C).
    channel_mults: one width multiplier per resolution level; every level but the last
      halves the height and width, so they must be divisible by 2^(L−1).
    num_res_blocks: residual blocks per level on the way down (one more on the way up).
    attention_resolutions: the heights (28, 14, 7 … for 28×28 images) of the levels that
      get self-attention after every residual block; the middle counts as the lowest level.
    num_heads: attention heads (Ho et al. use 1).
    dropout_rate: dropout inside every residual block while training (rng 'dropout').
    out_channels: output channels (None: the input's); e.g. C·K for K logits per pixel in
      discrete diffusion.
    num_groups: groups of every GroupNorm; must divide `channels` and every level's width.
    time_scale: t is multiplied by it before the embedding. Integer steps t = 0 … 999 (Ho
      et al.) want 1; continuous t ∈ [0, 1] wants ~1000, so that the fastest frequency
      turns by many radians across the range of t and nearby times stay distinguishable.
    dtype: compute dtype; parameters are float32.
  """
  channels: int = 32
  channel_mults: Sequence[int] = (1, 2, 2)
  num_res_blocks: int = 1
  attention_resolutions: Sequence[int] = (7,)
  num_heads: int = 1
  dropout_rate: float = 0.0
  out_channels: int | None = None
  num_groups: int = 8
  time_scale: float = 1.0
  dtype: Any = jnp.float32

  def __post_init__(self):
    for option in ('channels', 'num_res_blocks', 'num_heads', 'num_groups'):
      value = getattr(self, option)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'UNet {option} must be a positive integer, got {value!r}.')
    if self.channels % 2:
      raise ValueError(f'UNet channels={self.channels} must be even (the width of the '
                       f'sinusoidal time embedding).')
    for option in ('channel_mults', 'attention_resolutions'):
      value = getattr(self, option)
      if not all(isinstance(v, int) and v >= 1 for v in value) or (
          option == 'channel_mults' and not value):
        raise ValueError(f'UNet {option} must be a sequence of positive integers, got {value!r}.')
    widths = [self.channels * mult for mult in self.channel_mults]
    # The first level's GroupNorms also see conv_in's output, `channels` wide (alone in the
    # first block, concatenated in the last).
    if any(width % self.num_groups for width in [self.channels] + widths):
      raise ValueError(f'UNet num_groups={self.num_groups} must divide every level width '
                       f'{tuple(widths)} and channels={self.channels}, the width of the first '
                       f'convolution\'s output.')
    if any(width % self.num_heads for width in widths):
      raise ValueError(f'UNet num_heads={self.num_heads} must divide every level width '
                       f'{tuple(widths)}.')
    if not 0 <= self.dropout_rate < 1:
      raise ValueError(f'UNet dropout_rate must lie in [0, 1), got {self.dropout_rate!r}.')
    if self.out_channels is not None and (not isinstance(self.out_channels, int)
                                          or self.out_channels < 1):
      raise ValueError(f'UNet out_channels must be None or a positive integer, '
                       f'got {self.out_channels!r}.')
    super().__post_init__()

  def _check_inputs(self, x_BxHxWxC, t_B):
    if x_BxHxWxC.ndim != 4:
      raise ValueError(f'UNet input of shape {x_BxHxWxC.shape} must be [B, H, W, C].')
    batch, height, width = x_BxHxWxC.shape[:3]
    factor = 2 ** (len(self.channel_mults) - 1)
    if height % factor or width % factor:
      raise ValueError(f'UNet input size {height}×{width} is not allowed with '
                       f'{len(self.channel_mults)} levels; height and width must be multiples '
                       f'of {factor}.')
    if jnp.shape(t_B) != (batch,):
      raise ValueError(f'UNet times of shape {jnp.shape(t_B)} must be [B] = ({batch},).')
    heights = [height // 2 ** level for level in range(len(self.channel_mults))]
    unused = sorted(set(self.attention_resolutions) - set(heights))
    if unused:
      raise ValueError(f'UNet attention_resolutions lists {unused[0]}, which no level has; '
                       f'the level heights are {tuple(heights)}.')

  @nn.compact
  def __call__(self, x_BxHxWxC, t_B, *, train: bool = False):
    self._check_inputs(x_BxHxWxC, t_B)
    layers.check_input_width(self, 'conv_in', x_BxHxWxC.shape[-1], 'UNet')
    dtype, groups = self.dtype, self.num_groups
    levels = len(self.channel_mults)

    emb_BxC = sinusoidal_embedding(jnp.asarray(t_B, jnp.float32) * self.time_scale, self.channels)
    emb_Bx4C = nn.Dense(4 * self.channels, dtype=dtype, param_dtype=jnp.float32,
                        name='time_dense1')(emb_BxC)
    emb_Bx4C = nn.Dense(4 * self.channels, dtype=dtype, param_dtype=jnp.float32,
                        name='time_dense2')(nn.silu(emb_Bx4C))

    def res_block(h, width, name):
      return ResidualBlock(width, groups, self.dropout_rate, dtype, name=name)(
          h, emb_Bx4C, train=train)

    def maybe_attend(h, name):
      if h.shape[1] not in self.attention_resolutions:
        return h
      return AttentionBlock(self.num_heads, groups, dtype, name=name)(h)

    h = _conv(self.channels, 3, dtype, 'conv_in')(x_BxHxWxC)
    skips = [h]
    for level, mult in enumerate(self.channel_mults):
      for index in range(self.num_res_blocks):
        h = res_block(h, self.channels * mult, f'down{level}_block{index}')
        h = maybe_attend(h, f'down{level}_attention{index}')
        skips.append(h)
      if level < levels - 1:
        h = _conv(h.shape[-1], 3, dtype, f'down{level}_downsample', strides=2)(h)
        skips.append(h)

    width = h.shape[-1]
    h = res_block(h, width, 'middle_block0')
    h = maybe_attend(h, 'middle_attention')
    h = res_block(h, width, 'middle_block1')

    for level in reversed(range(levels)):
      for index in range(self.num_res_blocks + 1):
        h = jnp.concatenate([h, skips.pop()], axis=-1)
        h = res_block(h, self.channels * self.channel_mults[level], f'up{level}_block{index}')
        h = maybe_attend(h, f'up{level}_attention{index}')
      if level > 0:
        h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)
        h = _conv(h.shape[-1], 3, dtype, f'up{level}_upsample')(h)

    h = nn.silu(_norm(groups, dtype, 'norm_out')(h))
    out_channels = self.out_channels or x_BxHxWxC.shape[-1]
    return _conv(out_channels, 3, dtype, 'conv_out', zero=True)(h)
