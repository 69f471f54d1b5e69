"""AlexNet, Krizhevsky, Sutskever & Hinton 2012, "ImageNet Classification with Deep
Convolutional Neural Networks" (NeurIPS), §3 and Fig. 2, scaled for 28–64-pixel images."""

import math
import numbers
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models import layers
from models.vision import pooling

# Channels of conv1 … conv5: the single-tower widths of Krizhevsky 2014 ("One weird
# trick for parallelizing convolutional neural networks"), as in torchvision.
CONV_FEATURES = (64, 192, 384, 256, 256)
# The paper's 4096-unit dense layers see a 6×6×256 = 9,216 feature map; here the map
# is 4×4×256 = 4,096 on 28–32-pixel images, so the dense layers shrink by four.
DENSE_FEATURES = (1024, 1024)


class AlexNet(nn.Module):
  """AlexNet (Krizhevsky et al. 2012) on images x_BxHxWxC, channels last; ReLU throughout:

    h = maxpool(φ(conv1 x)),  h = maxpool(φ(conv2 h)),
    h = maxpool(φ(conv5 φ(conv4 φ(conv3 h)))),
    h = φ(W₆ dropout(flatten h)),  h = φ(W₇ dropout(h)),  logits = W₈ h.

  Max pooling is the paper's overlapping 3×3 window with stride 2 (§3.4), here with
  'SAME' padding. Scaling for 28–64-pixel inputs (the paper's are 224×224):
  conv1 is 3×3 with stride 1 (paper: 11×11, stride 4), conv2 5×5 and conv3–5 3×3
  as in the paper, all 'SAME'; so a 28/32/64-pixel image reaches the dense layers
  as a 4×4 / 4×4 / 8×8 map. Channel widths are `CONV_FEATURES` (one tower instead
  of the paper's two) and the dense widths `DENSE_FEATURES`, both times
  `width_multiplier`. Local response normalisation (§3.3) is left out, as in most
  reimplementations since batch normalisation.

  Attributes:
    num_classes: number K of logits.
    width_multiplier: factor on every convolution and hidden dense width.
    dropout_rate: inverted dropout before the first two dense layers, in
      training only (§4.2 uses 0.5).
    dtype: compute dtype (a dtype or its name); parameters and logits are float32.
  """
  num_classes: int
  width_multiplier: float = 1.0
  dropout_rate: float = 0.5
  dtype: Any = jnp.float32

  def __post_init__(self):
    if not isinstance(self.num_classes, int) or self.num_classes < 1:
      raise ValueError(f'AlexNet num_classes must be a positive integer, got {self.num_classes!r}.')
    if (not isinstance(self.width_multiplier, (int, float))
        or not math.isfinite(self.width_multiplier) or self.width_multiplier <= 0):
      raise ValueError(f'AlexNet width_multiplier must be a positive number, got {self.width_multiplier!r}.')
    if not (isinstance(self.dropout_rate, numbers.Real) and 0 <= self.dropout_rate < 1):
      raise ValueError(f'AlexNet dropout_rate must lie in [0, 1), got {self.dropout_rate!r}.')
    super().__post_init__()

  def _width(self, features: int) -> int:
    return max(1, round(features * self.width_multiplier))

  @nn.compact
  def __call__(self, x_BxHxWxC: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    conv = lambda features, size: nn.Conv(self._width(features), (size, size), padding='SAME',
                                          dtype=self.dtype, param_dtype=jnp.float32)
    pool = lambda h: pooling.max_pool(h, (3, 3), strides=(2, 2), padding='SAME')
    if x_BxHxWxC.ndim != 4:
      raise ValueError(f'AlexNet needs images of shape (B, H, W, C), got shape {x_BxHxWxC.shape}.')
    layers.check_input_width(self, 'Conv_0', x_BxHxWxC.shape[-1], 'AlexNet')
    h = pool(nn.relu(conv(CONV_FEATURES[0], 3)(x_BxHxWxC)))
    h = pool(nn.relu(conv(CONV_FEATURES[1], 5)(h)))
    for features in CONV_FEATURES[2:]:
      h = nn.relu(conv(features, 3)(h))
    h = pool(h)
    h_BxF = h.reshape(x_BxHxWxC.shape[0], -1)
    # The first dense layer has one row per feature of the map the images of `init` gave.
    rows = layers.init_width(self, 'Dense_0')
    if rows is not None and rows != h_BxF.shape[-1]:
      height, width = x_BxHxWxC.shape[1:3]
      raise ValueError(f'AlexNet image size {height}×{width} gives a '
                       f'{h.shape[1]}×{h.shape[2]}×{h.shape[3]} map ({h_BxF.shape[-1]} '
                       f'features) before the dense layers, but they were made for {rows} at '
                       f'init; give images of the size it was initialised with.')
    for features in DENSE_FEATURES:
      h_BxF = nn.Dropout(self.dropout_rate, deterministic=not train)(h_BxF)
      h_BxF = nn.relu(nn.Dense(self._width(features), dtype=self.dtype, param_dtype=jnp.float32)(h_BxF))
    logits_BxK = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32)(h_BxF)
    return logits_BxK.astype(jnp.float32)
