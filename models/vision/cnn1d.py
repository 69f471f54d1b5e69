"""A 1-D convolutional classifier for sequences of scalars (e.g. MNIST-1D).

Layer l: h^l_t = ReLU(BN(Σ_j W^l_j h^{l−1}_{s·t + j − p} + b^l)), a strided 1-D
convolution (batch normalisation, Ioffe & Szegedy 2015, optional). The last feature
map becomes the classifier's input: flattened (`pooling='flatten'`, every position
has its own weights), or pooled over positions, z_c = (1/T) Σ_t h_{t,c} (`'mean'`)
or max_t h_{t,c} (`'max'`); then optional inverted dropout and a linear layer to the
logits. The defaults are the convolutional baseline of Greydanus 2020 ("Scaling down
deep learning", MNIST-1D): three convolutions of 25 channels, kernels 5, 3, 3,
stride 2 and padding 1, so a length-40 signal becomes 19, 10 and then 5 positions.
"""

import numbers
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from models import layers as layers_lib

POOLINGS = ('flatten', 'mean', 'max')


class CNN1D(nn.Module):
  """Strided 1-D convolutions with ReLU, then a dense layer to the class logits.

  Attributes:
    num_classes: number of output logits.
    channels: output channels of each convolution.
    kernel_sizes: kernel size of each convolution (as many as `channels`).
    strides: stride of each convolution (as many as `channels`).
    padding: zeros added at both ends before each convolution.
    pooling: 'flatten' | 'mean' | 'max': how the last feature map reaches the head.
    batch_norm: batch normalisation between each convolution (then bias-free) and
      its ReLU; running averages with momentum 0.9, ε = 1e-5, as in ResNet.
    batch_norm_axis_name: mapped axis over which batch statistics are averaged
      (set by the train library under shard_map/pmap, `None` under jit).
    dropout_rate: inverted dropout on the classifier's input.
    dtype: compute dtype; parameters and logits are float32.
  """
  num_classes: int = 10
  channels: Sequence[int] = (25, 25, 25)
  kernel_sizes: Sequence[int] = (5, 3, 3)
  strides: Sequence[int] = (2, 2, 2)
  padding: int = 1
  pooling: str = 'flatten'
  batch_norm: bool = False
  batch_norm_axis_name: str | None = None
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def __post_init__(self):
    for name in ('channels', 'kernel_sizes', 'strides'):
      values = getattr(self, name)
      if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValueError(f'CNN1D {name} must be a sequence with one integer per convolution, '
                         f'got {values!r}.')
    layers = len(self.channels)
    if not layers or len(self.kernel_sizes) != layers or len(self.strides) != layers:
      raise ValueError(f'CNN1D needs as many kernel_sizes and strides as channels, got '
                       f'{len(self.channels)}, {len(self.kernel_sizes)} and {len(self.strides)}.')
    for name in ('channels', 'kernel_sizes', 'strides'):
      values = getattr(self, name)
      if not all(isinstance(v, int) and v > 0 for v in values):
        raise ValueError(f'CNN1D {name} must be positive integers, got {tuple(values)}.')
    if not isinstance(self.padding, int) or self.padding < 0:
      raise ValueError(f'CNN1D padding must be an integer >= 0, got {self.padding!r}.')
    if self.pooling not in POOLINGS:
      raise ValueError(f'Unknown CNN1D pooling {self.pooling!r}; allowed: {", ".join(POOLINGS)}.')
    if not (isinstance(self.dropout_rate, numbers.Real) and 0 <= self.dropout_rate < 1):
      raise ValueError(f'CNN1D dropout_rate must lie in [0, 1), got {self.dropout_rate!r}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxT: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    if x_BxT.ndim not in (2, 3):
      raise ValueError(f'CNN1D needs sequences of shape (B, T) or (B, T, C), got shape '
                       f'{x_BxT.shape}.')
    h_BxTxC = x_BxT.reshape(x_BxT.shape[0], -1, 1) if x_BxT.ndim == 2 else x_BxT
    layers_lib.check_input_width(self, 'Conv_0', h_BxTxC.shape[-1], 'CNN1D')
    for features, kernel, stride in zip(self.channels, self.kernel_sizes, self.strides):
      h_BxTxC = nn.Conv(features, (kernel,), strides=(stride,), padding=((self.padding, self.padding),),
                        use_bias=not self.batch_norm, dtype=self.dtype, param_dtype=jnp.float32)(h_BxTxC)
      if self.batch_norm:
        h_BxTxC = nn.BatchNorm(use_running_average=not train, axis_name=self.batch_norm_axis_name,
                               momentum=0.9, epsilon=1e-5, dtype=self.dtype,
                               param_dtype=jnp.float32)(h_BxTxC)
      h_BxTxC = nn.relu(h_BxTxC)
      if h_BxTxC.shape[1] == 0:  # mean pooling would return NaN, the others fail elsewhere
        raise ValueError(f'CNN1D: an input of length {x_BxT.shape[1]} leaves no positions after '
                         f'the convolutions (kernel_sizes={tuple(self.kernel_sizes)}, strides='
                         f'{tuple(self.strides)}, padding={self.padding}); give longer inputs or '
                         'smaller kernels or strides.')
    if self.pooling == 'flatten':
      z_BxD = h_BxTxC.reshape(h_BxTxC.shape[0], -1)
    elif self.pooling == 'mean':
      z_BxD = h_BxTxC.mean(axis=1)
    else:
      z_BxD = h_BxTxC.max(axis=1)
    # Flattened, the head has one row per position and channel of the inputs of `init`.
    rows = layers_lib.init_width(self, 'Dense_0')
    if rows is not None and rows != z_BxD.shape[-1]:
      raise ValueError(f'CNN1D: an input of length {x_BxT.shape[1]} leaves {h_BxTxC.shape[1]} '
                       f'positions of {h_BxTxC.shape[2]} channels ({z_BxD.shape[-1]} features) '
                       f'for the head, but it was made for {rows} at init; give inputs of the '
                       f'length it was initialised with.')
    if self.dropout_rate > 0:
      z_BxD = nn.Dropout(self.dropout_rate, deterministic=not train)(z_BxD)
    logits = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32)(z_BxD)
    return logits.astype(jnp.float32)
