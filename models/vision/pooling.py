"""Pooling for the vision family: max, average and global average pooling.

Inputs are channels-last, `x_BxHxWxC`. Window position (i, j) with window
k_h × k_w and strides s_h, s_w reduces the patch
x[b, i·s_h : i·s_h + k_h, j·s_w : j·s_w + k_w, c]:

  max pooling:     y[b, i, j, c] = max_{a<k_h, b'<k_w} x[b, i·s_h + a, j·s_w + b', c]
  average pooling: y[b, i, j, c] = (1 / |window|) Σ_{a, b'} x[b, i·s_h + a, j·s_w + b', c]

(max pooling as in Zhou & Chellappa 1988 and Ranzato et al. 2007; global average
pooling as in Lin, Chen & Yan 2014, "Network in Network").

Padding follows `flax.linen.pool` (XLA's `reduce_window`):
  - 'VALID': no padding, output size ⌊(n − k)/s⌋ + 1;
  - 'SAME': output size ⌈n/s⌉; the total padding max((⌈n/s⌉ − 1)·s + k − n, 0)
    is split with the smaller half before (low = total // 2) and the rest after;
  - explicit ((p_lo, p_hi), (q_lo, q_hi)): output size ⌊(n + p_lo + p_hi − k)/s⌋ + 1.
Max pooling pads with −∞, so padding never wins a max. Average pooling pads with
zeros and, by default (`count_include_pad=True`), divides by the full window size
k_h·k_w, so windows that overlap the border are pulled towards zero; pass
`count_include_pad=False` to divide by the number of real (unpadded) inputs.
"""

from typing import Sequence, Union

import flax.linen as nn
import jax.numpy as jnp

Padding = Union[str, Sequence[tuple[int, int]]]


def max_pool(x_BxHxWxC: jnp.ndarray, window_shape: Sequence[int],
             strides: Sequence[int] | None = None, padding: Padding = 'VALID') -> jnp.ndarray:
  """y[b, i, j, c] = max over the window at (i·s_h, j·s_w); padding counts as −∞.

  `strides` defaults to (1, 1) (Flax's default), not to the window shape.
  """
  return nn.max_pool(x_BxHxWxC, tuple(window_shape), strides=strides, padding=padding)


def avg_pool(x_BxHxWxC: jnp.ndarray, window_shape: Sequence[int],
             strides: Sequence[int] | None = None, padding: Padding = 'VALID',
             count_include_pad: bool = True) -> jnp.ndarray:
  """y[b, i, j, c] = (1 / N) Σ over the window at (i·s_h, j·s_w).

  N = k_h·k_w (padded zeros included) if `count_include_pad`, else the number of
  unpadded inputs in the window. With 'VALID' padding both are the same.
  """
  return nn.avg_pool(x_BxHxWxC, tuple(window_shape), strides=strides, padding=padding,
                     count_include_pad=count_include_pad)


def global_avg_pool(x_BxHxWxC: jnp.ndarray) -> jnp.ndarray:
  """Global average pooling (Lin et al. 2014): y[b, c] = (1 / HW) Σ_{i, j} x[b, i, j, c]."""
  if x_BxHxWxC.ndim != 4:
    raise ValueError(f'global_avg_pool expects a (batch, height, width, channels) array, '
                     f'got shape {x_BxHxWxC.shape}.')
  return jnp.mean(x_BxHxWxC, axis=(1, 2))
