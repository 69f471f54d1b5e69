"""Residual networks, He, Zhang, Ren & Sun 2016, "Deep Residual Learning for Image
Recognition" (CVPR): the ImageNet ResNet-18/34/50 (§3.4, Table 1) and the CIFAR-10
ResNet-20 … 110 (§4.2, Table 6)."""

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from models import layers
from models.vision import pooling

BLOCKS = ('basic', 'bottleneck')
SHORTCUTS = ('A', 'B')
# The bottleneck block's last 1×1 convolution widens its 3×3 width by four (Fig. 5).
BOTTLENECK_EXPANSION = 4
# He initialisation, fan-out mode (He et al. 2015, "Delving Deep into Rectifiers"), as torchvision.
_HE_NORMAL = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


class _Block(nn.Module):
  """What the two block kinds share: conv–BN layers and the shortcut."""
  features: int
  strides: int = 1
  shortcut: str = 'B'
  zero_init_residual: bool = False
  batch_norm_axis_name: str | None = None
  dtype: Any = jnp.float32

  def conv(self, features, size, strides=1, name=None):
    return nn.Conv(features, (size, size), strides=(strides, strides), padding=[(size // 2, size // 2)] * 2,
                   use_bias=False, kernel_init=_HE_NORMAL, dtype=self.dtype, param_dtype=jnp.float32, name=name)

  def norm(self, train, zero_scale=False, name=None):
    scale_init = nn.initializers.zeros if zero_scale else nn.initializers.ones
    return nn.BatchNorm(use_running_average=not train, axis_name=self.batch_norm_axis_name, momentum=0.9,
                        epsilon=1e-5, scale_init=scale_init, dtype=self.dtype, param_dtype=jnp.float32,
                        name=name)

  def project(self, x_BxHxWxC, out_features, train):
    """The identity if the shape is kept; otherwise option A or B of §3.3."""
    s = self.strides
    if s == 1 and x_BxHxWxC.shape[-1] == out_features:
      return x_BxHxWxC
    if self.shortcut == 'B':  # W_s x: a strided 1×1 convolution and BN (eq. 2).
      return self.norm(train, name='shortcut_norm')(self.conv(out_features, 1, s, name='shortcut_conv')(x_BxHxWxC))
    # Option A: keep every s-th pixel and pad the new channels with zeros; no parameters.
    in_features = x_BxHxWxC.shape[-1]
    if out_features < in_features:
      raise ValueError(f'ResNet shortcut A cannot narrow {in_features} channels to {out_features}; use B.')
    x_BxhxwxC = x_BxHxWxC[:, ::s, ::s, :]
    return jnp.pad(x_BxhxwxC, ((0, 0), (0, 0), (0, 0), (0, out_features - in_features)))


class BasicBlock(_Block):
  """y = ReLU(F(x) + shortcut(x)), F = BN∘conv3×3∘ReLU∘BN∘conv3×3 (He et al. 2016, Fig. 5 left)."""

  @nn.compact
  def __call__(self, x_BxHxWxC: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    h = nn.relu(self.norm(train)(self.conv(self.features, 3, self.strides)(x_BxHxWxC)))
    h = self.norm(train, zero_scale=self.zero_init_residual)(self.conv(self.features, 3)(h))
    return nn.relu(h + self.project(x_BxHxWxC, self.features, train))


class BottleneckBlock(_Block):
  """y = ReLU(F(x) + shortcut(x)), F = 1×1 (width) → 3×3 (width) → 1×1 (4·width), each
  followed by BN and all but the last by ReLU (He et al. 2016, Fig. 5 right). The
  stride sits on the 3×3 convolution ("ResNet v1.5", as torchvision; the paper puts
  it on the first 1×1); the parameter count is the same."""

  @nn.compact
  def __call__(self, x_BxHxWxC: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    out_features = self.features * BOTTLENECK_EXPANSION
    h = nn.relu(self.norm(train)(self.conv(self.features, 1)(x_BxHxWxC)))
    h = nn.relu(self.norm(train)(self.conv(self.features, 3, self.strides)(h)))
    h = self.norm(train, zero_scale=self.zero_init_residual)(self.conv(out_features, 1)(h))
    return nn.relu(h + self.project(x_BxHxWxC, out_features, train))


class ResNet(nn.Module):
  """Residual network (He et al. 2016) on images x_BxHxWxC, channels last:

    stem → stage 1 → … → stage S → global average pool → logits = W h + b,

  stage s being `stage_sizes[s]` blocks of width `stage_widths[s]`, the first of
  which strides by 2 (except in stage 1) and so changes the shape. Every convolution
  is bias-free and followed by BatchNorm (momentum 0.9, ε = 1e-5; the running
  statistics live in the 'batch_stats' collection, one per channel).

  The ImageNet stem is a 7×7/2 convolution, BN, ReLU and a 3×3/2 max pool;
  `small_input_stem` replaces it by a 3×3/1 convolution, BN and ReLU, no pool, for
  32×32 images (the CIFAR network of §4.2, whose stem is 16 wide).

  A shortcut that changes the shape is option A (stride, then zero-pad the new
  channels; no parameters) or option B (1×1 convolution + BN projection) of §3.3.
  The identity is used wherever the shape is kept.

  Attributes:
    num_classes: number K of logits.
    stage_sizes: blocks per stage.
    block: 'basic' (two 3×3) or 'bottleneck' (1×1, 3×3, 1×1 with expansion 4).
    stage_widths: width of every stage (the bottleneck's 3×3 width).
    stem_width: output channels of the stem convolution.
    small_input_stem: the 3×3/1 stem without max pool, for 32×32 images.
    shortcut: 'A' or 'B', for the shortcuts that change the shape.
    zero_init_residual: initialise the last BN scale γ of every block to 0, so
      every block starts as ReLU(shortcut(x)): the identity where the block keeps the
      shape (Goyal et al. 2017).
    batch_norm_axis_name: mapped axis over which batch statistics are averaged
      (set by the train library under shard_map/pmap, `None` under jit).
    dtype: compute dtype (a dtype or its name); parameters and logits are float32.
  """
  num_classes: int
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  block: str = 'basic'
  stage_widths: Sequence[int] = (64, 128, 256, 512)
  stem_width: int = 64
  small_input_stem: bool = False
  shortcut: str = 'B'
  zero_init_residual: bool = False
  batch_norm_axis_name: str | None = None
  dtype: Any = jnp.float32

  def __post_init__(self):
    name = type(self).__name__
    for option in ('num_classes', 'stem_width'):
      value = getattr(self, option)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} {option} must be a positive integer, got {value!r}.')
    for option in ('stage_sizes', 'stage_widths'):
      value = getattr(self, option)
      if (isinstance(value, str) or not isinstance(value, Sequence) or not value
          or not all(isinstance(v, int) and v >= 1 for v in value)):
        raise ValueError(f'{name} {option} must be a non-empty sequence of positive integers, got {value!r}.')
    if len(self.stage_sizes) != len(self.stage_widths):
      raise ValueError(f'{name} needs one width per stage, got stage_sizes={tuple(self.stage_sizes)} '
                       f'and stage_widths={tuple(self.stage_widths)}.')
    if self.block not in BLOCKS:
      raise ValueError(f'{name} block must be one of {", ".join(BLOCKS)}, got {self.block!r}.')
    if self.shortcut not in SHORTCUTS:
      raise ValueError(f'{name} shortcut must be one of {", ".join(SHORTCUTS)}, got {self.shortcut!r}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxHxWxC: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    if x_BxHxWxC.ndim != 4:
      raise ValueError(f'{type(self).__name__} needs images of shape (B, H, W, C), got shape '
                       f'{x_BxHxWxC.shape}.')
    size, strides = (3, 1) if self.small_input_stem else (7, 2)
    layers.check_input_width(self, 'stem_conv', x_BxHxWxC.shape[-1], type(self).__name__)
    h = nn.Conv(self.stem_width, (size, size), strides=(strides, strides), padding=[(size // 2, size // 2)] * 2,
                use_bias=False, kernel_init=_HE_NORMAL, dtype=self.dtype, param_dtype=jnp.float32,
                name='stem_conv')(x_BxHxWxC)
    h = nn.BatchNorm(use_running_average=not train, axis_name=self.batch_norm_axis_name, momentum=0.9,
                     epsilon=1e-5, dtype=self.dtype, param_dtype=jnp.float32, name='stem_norm')(h)
    h = nn.relu(h)
    if not self.small_input_stem:
      h = pooling.max_pool(h, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    block_cls = BasicBlock if self.block == 'basic' else BottleneckBlock
    block = functools.partial(block_cls, shortcut=self.shortcut, zero_init_residual=self.zero_init_residual,
                              batch_norm_axis_name=self.batch_norm_axis_name, dtype=self.dtype)
    for stage, (num_blocks, width) in enumerate(zip(self.stage_sizes, self.stage_widths)):
      for index in range(num_blocks):
        strides = 2 if stage > 0 and index == 0 else 1
        h = block(width, strides, name=f'stage{stage + 1}_block{index + 1}')(h, train=train)
    h_BxC = pooling.global_avg_pool(h.astype(jnp.float32))
    logits_BxK = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32, name='head')(h_BxC)
    return logits_BxK.astype(jnp.float32)


# Presets: subclasses whose defaults are the paper's networks, so that the registry
# (which reads the dataclass fields) builds them from a name and `num_classes`.

class ResNet18(ResNet):
  """ResNet-18 (He et al. 2016, Table 1): basic blocks [2, 2, 2, 2], widths 64–512."""
  stage_sizes: Sequence[int] = (2, 2, 2, 2)


class ResNet34(ResNet):
  """ResNet-34 (He et al. 2016, Table 1): basic blocks [3, 4, 6, 3], widths 64–512."""
  stage_sizes: Sequence[int] = (3, 4, 6, 3)


class ResNet50(ResNet):
  """ResNet-50 (He et al. 2016, Table 1): bottleneck blocks [3, 4, 6, 3], widths 64–512 (×4 out)."""
  stage_sizes: Sequence[int] = (3, 4, 6, 3)
  block: str = 'bottleneck'


class CifarResNet(ResNet):
  """CIFAR-10 ResNet with 6n + 2 layers (He et al. 2016, §4.2): a 3×3 convolution of 16
  channels, three stages of n basic blocks of 16, 32 and 64 channels on 32×32, 16×16
  and 8×8 maps, global average pooling and the output layer.

  The default shortcut here is option B (projection), the usual choice today; the
  paper's CIFAR networks (and the parameter counts of its Table 6) use option A.
  """
  stage_sizes: Sequence[int] = (3, 3, 3)
  stage_widths: Sequence[int] = (16, 32, 64)
  stem_width: int = 16
  small_input_stem: bool = True


class ResNet20(CifarResNet):
  """ResNet-20 for CIFAR-10 (He et al. 2016, §4.2): n = 3 basic blocks per stage."""
  stage_sizes: Sequence[int] = (3, 3, 3)


class ResNet32(CifarResNet):
  """ResNet-32 for CIFAR-10 (He et al. 2016, §4.2): n = 5 basic blocks per stage."""
  stage_sizes: Sequence[int] = (5, 5, 5)


class ResNet44(CifarResNet):
  """ResNet-44 for CIFAR-10 (He et al. 2016, §4.2): n = 7 basic blocks per stage."""
  stage_sizes: Sequence[int] = (7, 7, 7)


class ResNet56(CifarResNet):
  """ResNet-56 for CIFAR-10 (He et al. 2016, §4.2): n = 9 basic blocks per stage."""
  stage_sizes: Sequence[int] = (9, 9, 9)


class ResNet110(CifarResNet):
  """ResNet-110 for CIFAR-10 (He et al. 2016, §4.2): n = 18 basic blocks per stage."""
  stage_sizes: Sequence[int] = (18, 18, 18)
