"""Flax's `nn.Conv` and the pooling in models/vision/pooling.py against independent references.

What Flax computes. `nn.Conv` (XLA's `conv_general_dilated`) is a cross-correlation:

  y[b, i, j, o] = Σ_{a, b', c} w[a, b', c, o] · x[b, i·s + a·d, j·s + b'·d, c] + bias[o],

with no kernel flip. The mathematical convolution (f ∗ x)(i, j) = Σ_m Σ_n f(m, n) x(i − m, j − n)
flips the kernel; it is what `nn.Conv` computes only when handed the flipped kernel
f[::-1, ::-1] (and read on the 'VALID' positions i ≥ k_h − 1, j ≥ k_w − 1). Both facts are
tested below. Output sizes follow ⌊(n + 2p − d(k − 1) − 1)/s⌋ + 1 per spatial axis; 'SAME'
gives ⌈n/s⌉ and puts the smaller half of the padding before the input.
"""

import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.vision import pooling

# ---------------------------------------------------------------------------------------------
# References (NumPy, float64, loops; they never call a JAX convolution or reduce_window).


def _expected_size(n, kernel, stride, padding, dilation):
  """⌊(n + p_lo + p_hi − k_eff)/s⌋ + 1 with k_eff = d(k − 1) + 1; 'SAME' gives ⌈n/s⌉."""
  if padding == 'SAME':
    return -(-n // stride)
  if padding == 'VALID':
    pad_total = 0
  elif isinstance(padding, int):
    pad_total = 2 * padding
  else:
    pad_total = padding[0] + padding[1]
  return (n + pad_total - (dilation * (kernel - 1) + 1)) // stride + 1


def _pads(n, span, stride, padding):
  """(low, high) padding of one axis; 'SAME' puts total // 2 before and the rest after."""
  if padding == 'VALID':
    return (0, 0)
  if padding == 'SAME':
    total = max((math.ceil(n / stride) - 1) * stride + span - n, 0)
    return (total // 2, total - total // 2)
  return tuple(padding)


def _reference_cross_correlation(x_BxSxC, kernel_KxCxO, bias_O, strides, paddings, dilations):
  """y[b, i, o] = Σ_a Σ_c w[a, c, o] · x_pad[b, i·s + a·d, c] + bias[o] (multi-indices i, a).

  Windows are enumerated directly (every start 0, s, 2s, … whose dilated window fits in the
  zero-padded input), so the output size is not taken from the formula under test.
  """
  x = np.asarray(x_BxSxC, np.float64)
  w = np.asarray(kernel_KxCxO, np.float64)
  num_spatial = x.ndim - 2
  kernel_shape = w.shape[:num_spatial]
  spans = [d * (k - 1) + 1 for k, d in zip(kernel_shape, dilations)]
  pads = [_pads(n, span, s, p) for n, span, s, p in zip(x.shape[1:-1], spans, strides, paddings)]
  x = np.pad(x, [(0, 0)] + pads + [(0, 0)])
  starts = [range(0, n - span + 1, s) for n, span, s in zip(x.shape[1:-1], spans, strides)]
  y = np.zeros((x.shape[0],) + tuple(len(r) for r in starts) + (w.shape[-1],))
  for out_index in itertools.product(*[range(len(r)) for r in starts]):
    total = np.zeros((x.shape[0], w.shape[-1])) + np.asarray(bias_O, np.float64)
    for tap in itertools.product(*[range(k) for k in kernel_shape]):
      in_index = tuple(starts[ax][out_index[ax]] + tap[ax] * dilations[ax] for ax in range(num_spatial))
      total += x[(slice(None),) + in_index] @ w[tap]
    y[(slice(None),) + out_index] = total
  return y


def _block_toeplitz(blocks, num_in_blocks):
  """Banded block matrix with block (i, i + a) = blocks[a]: the matrix of a 'VALID' stride-1
  cross-correlation of length-`num_in_blocks` inputs with a kernel of len(blocks) taps.

  With 1×1 blocks this is the banded matrix with rows (0 … 0 a_1 a_2 a_3 0 … 0); with blocks
  that are themselves block Toeplitz it is the doubly block Toeplitz matrix of a 2-D kernel.
  """
  rows, cols = blocks[0].shape
  num_out_blocks = num_in_blocks - len(blocks) + 1
  matrix = np.zeros((num_out_blocks * rows, num_in_blocks * cols))
  for i in range(num_out_blocks):
    for a, block in enumerate(blocks):
      matrix[i * rows:(i + 1) * rows, (i + a) * cols:(i + a + 1) * cols] = block
  return matrix


def _reference_pool(x_BxHxWxC, window, strides, padding, kind):
  """Max or average over each window of the padded input; padded cells are tracked as absent.

  kind: 'max' (padding never wins), 'avg_include_pad' (sum of real inputs / k_h·k_w) or
  'avg_exclude_pad' (sum of real inputs / number of real inputs).
  """
  x = np.asarray(x_BxHxWxC, np.float64)
  pads = [_pads(n, k, s, padding) for n, k, s in zip(x.shape[1:3], window, strides)]
  real = np.pad(np.ones(x.shape[1:3], bool), pads)
  x = np.pad(x, [(0, 0)] + pads + [(0, 0)])
  starts = [range(0, n - k + 1, s) for n, k, s in zip(x.shape[1:3], window, strides)]
  y = np.zeros((x.shape[0], len(starts[0]), len(starts[1]), x.shape[-1]))
  for i, top in enumerate(starts[0]):
    for j, left in enumerate(starts[1]):
      patch = x[:, top:top + window[0], left:left + window[1]]
      mask = real[top:top + window[0], left:left + window[1]]
      values = patch[:, mask]  # (B, number of real cells, C)
      if kind == 'max':
        y[:, i, j] = values.max(axis=1)
      elif kind == 'avg_include_pad':
        y[:, i, j] = values.sum(axis=1) / (window[0] * window[1])
      else:
        y[:, i, j] = values.sum(axis=1) / mask.sum()
  return y


def _conv_variables(conv, x, seed=0):
  """Parameters of `conv` with a non-zero bias, so a dropped or misplaced bias shows."""
  variables = conv.init(jax.random.key(seed), x)
  params = dict(variables['params'])
  if 'bias' in params:
    params['bias'] = jax.random.normal(jax.random.key(seed + 1), params['bias'].shape)
  return {'params': params}


# ---------------------------------------------------------------------------------------------
# Output sizes.

SIZE_PADDINGS = ['VALID', 'SAME', ((1, 1),), ((2, 2),), 1]


@pytest.mark.parametrize('padding', SIZE_PADDINGS, ids=str)
def test_1d_output_size_matches_formula_over_grid(padding):
  # Fails if dilation is ignored (k instead of d(k − 1) + 1), if the floor becomes a ceiling,
  # if padding counts once instead of on both sides, or if 'SAME' depends on the kernel.
  checked = 0
  for n, k, s, d in itertools.product((5, 7, 8), (1, 2, 3), (1, 2, 3), (1, 2)):
    expected = _expected_size(n, k, s, padding[0] if isinstance(padding, tuple) else padding, d)
    if expected < 1:
      continue
    conv = nn.Conv(2, (k,), strides=s, padding=padding, kernel_dilation=d)
    x_BxNxC = jax.ShapeDtypeStruct((1, n, 3), jnp.float32)
    y, _ = jax.eval_shape(lambda x, conv=conv: conv.init_with_output(jax.random.key(0), x), x_BxNxC)
    assert y.shape == (1, expected, 2), (n, k, s, d, padding)
    checked += 1
  assert checked > 40


@pytest.mark.parametrize('padding', ['VALID', 'SAME', ((1, 1), (2, 2)), ((0, 0), (1, 1))], ids=str)
def test_2d_output_size_matches_formula_per_axis(padding):
  # Different n, k, s and d per axis: fails if one axis's parameters leak into the other.
  for (h, w), (kh, kw), (sh, sw), (dh, dw) in itertools.product(
      [(6, 9), (8, 5)], [(3, 2), (1, 3)], [(1, 2), (3, 1)], [(1, 1), (2, 1)]):
    pad_h, pad_w = (padding, padding) if isinstance(padding, str) else padding
    expected = (_expected_size(h, kh, sh, pad_h, dh), _expected_size(w, kw, sw, pad_w, dw))
    conv = nn.Conv(4, (kh, kw), strides=(sh, sw), padding=padding, kernel_dilation=(dh, dw))
    x_BxHxWxC = jax.ShapeDtypeStruct((2, h, w, 3), jnp.float32)
    y, _ = jax.eval_shape(lambda x, conv=conv: conv.init_with_output(jax.random.key(0), x), x_BxHxWxC)
    assert y.shape == (2,) + expected + (4,), (h, w, kh, kw, sh, sw, dh, dw, padding)


@pytest.mark.parametrize('spatial, kernel, strides, padding, dilation', [
    ((7,), (3,), (2,), 'SAME', (1,)),
    ((8,), (2,), (3,), 'SAME', (2,)),  # total padding is odd: the extra cell goes after
    ((6,), (3,), (1,), ((2, 2),), (2,)),
    ((6, 5), (3, 2), (2, 1), 'SAME', (1, 2)),
    ((5, 6), (2, 3), (1, 2), ((1, 1), (0, 2)), (2, 1)),
    ((6, 6), (3, 3), (3, 2), 'VALID', (1, 1)),
], ids=str)
def test_strided_padded_dilated_conv_equals_brute_force_loop(spatial, kernel, strides, padding,
                                                             dilation):
  # Fails if 'SAME' split its padding the other way round, if the dilation skipped the wrong
  # cells, if padding used a value other than zero, or if a stride skipped the first window.
  conv = nn.Conv(3, kernel, strides=strides, padding=padding, kernel_dilation=dilation)
  x = jax.random.normal(jax.random.key(2), (2,) + spatial + (2,))
  variables = _conv_variables(conv, x)
  paddings = [padding] * len(spatial) if isinstance(padding, str) else list(padding)
  expected = _reference_cross_correlation(x, variables['params']['kernel'],
                                          variables['params']['bias'], strides, paddings, dilation)
  np.testing.assert_allclose(conv.apply(variables, x), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Convolution as multiplication by a Toeplitz matrix.


@pytest.mark.parametrize('n, k, in_channels, out_channels', [(6, 3, 1, 1), (7, 2, 3, 2), (5, 5, 2, 3)])
def test_1d_conv_equals_banded_toeplitz_matrix(n, k, in_channels, out_channels):
  # y_flat = T x_flat with T's block (i, i + a) = w[a]ᵀ. Fails for a flipped kernel (block
  # (i, i + k − 1 − a)), for swapped in/out channel axes, or for a band shifted by one.
  conv = nn.Conv(out_channels, (k,), padding='VALID', use_bias=False)
  x_BxNxC = jax.random.normal(jax.random.key(3), (2, n, in_channels))
  variables = conv.init(jax.random.key(4), x_BxNxC)
  kernel_KxCxO = np.asarray(variables['params']['kernel'], np.float64)
  toeplitz = _block_toeplitz([kernel_KxCxO[a].T for a in range(k)], n)
  assert toeplitz.shape == ((n - k + 1) * out_channels, n * in_channels)
  expected = (np.asarray(x_BxNxC, np.float64).reshape(2, -1) @ toeplitz.T).reshape(2, n - k + 1,
                                                                                 out_channels)
  np.testing.assert_allclose(conv.apply(variables, x_BxNxC), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('h, w, kh, kw, in_channels, out_channels',
                         [(4, 5, 2, 3, 1, 1), (5, 4, 3, 2, 2, 3), (3, 3, 3, 3, 3, 2)])
def test_2d_conv_equals_doubly_block_toeplitz_matrix(h, w, kh, kw, in_channels, out_channels):
  # Outer blocks run over kernel rows, inner blocks over kernel columns. Fails if the kernel is
  # flipped along either axis, if H and W are swapped, or if channels are mixed up.
  conv = nn.Conv(out_channels, (kh, kw), padding='VALID', use_bias=False)
  x_BxHxWxC = jax.random.normal(jax.random.key(5), (2, h, w, in_channels))
  variables = conv.init(jax.random.key(6), x_BxHxWxC)
  kernel = np.asarray(variables['params']['kernel'], np.float64)
  row_blocks = [_block_toeplitz([kernel[a, b].T for b in range(kw)], w) for a in range(kh)]
  toeplitz = _block_toeplitz(row_blocks, h)
  out_h, out_w = h - kh + 1, w - kw + 1
  assert toeplitz.shape == (out_h * out_w * out_channels, h * w * in_channels)
  expected = (np.asarray(x_BxHxWxC, np.float64).reshape(2, -1) @ toeplitz.T).reshape(
      2, out_h, out_w, out_channels)
  np.testing.assert_allclose(conv.apply(variables, x_BxHxWxC), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('strides', [1, 2])
def test_1x1_conv_equals_per_pixel_dense(strides):
  # A 1×1 kernel is a Dense layer applied at every (subsampled) pixel. Fails if the kernel's
  # (in, out) axes were transposed, if the bias were dropped, or if strides kept the wrong pixels.
  conv = nn.Conv(5, (1, 1), strides=strides)
  x_BxHxWxC = jax.random.normal(jax.random.key(7), (2, 5, 4, 3))
  variables = _conv_variables(conv, x_BxHxWxC)
  dense_params = {'kernel': variables['params']['kernel'][0, 0], 'bias': variables['params']['bias']}
  expected = nn.Dense(5).apply({'params': dense_params}, x_BxHxWxC[:, ::strides, ::strides])
  np.testing.assert_allclose(conv.apply(variables, x_BxHxWxC), expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Golden values and the cross-correlation convention.


def test_1d_relu_conv_golden_value():
  # Kernel size 3, stride 1, no padding, no bias, ReLU: y_t = ReLU(a_1 x_t + a_2 x_{t+1} + a_3 x_{t+2})
  # ∈ R^{d_in − 2}. With a = (1, −1, 2), x = (3, 1, −2, 4, 0, 1), by hand:
  #   1·3 − 1·1 + 2·(−2) = −2,  1·1 + 1·2 + 2·4 = 11,  −2 − 4 + 0 = −6,  4 − 0 + 2·1 = 6.
  # The flipped kernel would give (3, 8, −8, 9) → ReLU (3, 8, 0, 9); 'SAME' would give 6 outputs.
  a = jnp.array([1., -1., 2.]).reshape(3, 1, 1)
  x_BxNxC = jnp.array([3., 1., -2., 4., 0., 1.]).reshape(1, 6, 1)
  conv = nn.Conv(1, (3,), strides=1, padding='VALID', use_bias=False)
  pre_activation = conv.apply({'params': {'kernel': a}}, x_BxNxC)[0, :, 0]
  np.testing.assert_array_equal(pre_activation, [-2., 11., -6., 6.])
  np.testing.assert_array_equal(nn.relu(pre_activation), [0., 11., 0., 6.])


def _textbook_convolution(f, x):
  """(f ∗ x)(i, j) = Σ_m Σ_n f(m, n) x(i − m, j − n) on positions where every x index exists."""
  kh, kw = f.shape
  h, w = x.shape
  y = np.zeros((h - kh + 1, w - kw + 1))
  for i in range(kh - 1, h):
    for j in range(kw - 1, w):
      y[i - kh + 1, j - kw + 1] = sum(f[m, n] * x[i - m, j - n] for m in range(kh) for n in range(kw))
  return y


def _cross_correlation_2d(f, x):
  """(f ⋆ x)(i, j) = Σ_a Σ_b f(a, b) x(i + a, j + b)."""
  kh, kw = f.shape
  h, w = x.shape
  y = np.zeros((h - kh + 1, w - kw + 1))
  for i in range(h - kh + 1):
    for j in range(w - kw + 1):
      y[i, j] = sum(f[a, b] * x[i + a, j + b] for a in range(kh) for b in range(kw))
  return y


def _flax_conv_2d(f, x):
  conv = nn.Conv(1, f.shape, padding='VALID', use_bias=False)
  kernel = jnp.asarray(f, jnp.float32)[:, :, None, None]
  return np.asarray(conv.apply({'params': {'kernel': kernel}}, jnp.asarray(x, jnp.float32)[None, :, :, None]))[0, :, :, 0]


def test_flax_conv_is_cross_correlation_not_convolution():
  # An asymmetric kernel, so flipping it changes the result; checked below that it does.
  f = np.array([[1., 2., 0.], [-1., 3., 4.]])
  x = np.random.default_rng(0).normal(size=(5, 6))
  flax_output = _flax_conv_2d(f, x)
  np.testing.assert_allclose(flax_output, _cross_correlation_2d(f, x), rtol=1e-5, atol=1e-5)
  assert not np.allclose(flax_output, _textbook_convolution(f, x), atol=1e-2)


def test_flax_conv_with_flipped_kernel_is_mathematical_convolution():
  # (f ∗ x)(i, j) = Σ f(m, n) x(i − m, j − n) = Σ f(k_h − 1 − a, k_w − 1 − b) x(i' + a, j' + b):
  # a true convolution is a cross-correlation with f[::-1, ::-1]. Fails if only one axis flips.
  f = np.array([[1., 2., 0.], [-1., 3., 4.]])
  x = np.random.default_rng(1).normal(size=(5, 6))
  np.testing.assert_allclose(_flax_conv_2d(f[::-1, ::-1], x), _textbook_convolution(f, x),
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(_flax_conv_2d(f[::-1, :], x), _textbook_convolution(f, x), atol=1e-2)


# ---------------------------------------------------------------------------------------------
# Pooling.

POOL_CASES = [
    ((2, 2), (2, 2), 'VALID'),
    ((3, 2), (1, 2), 'VALID'),
    ((2, 3), (2, 1), 'SAME'),
    ((3, 3), (2, 2), 'SAME'),
    ((2, 2), None, 'SAME'),  # strides default to 1, not to the window
]


@pytest.mark.parametrize('window, strides, padding', POOL_CASES, ids=str)
def test_max_pool_equals_brute_force_loop(window, strides, padding):
  # All inputs negative: fails if 'SAME' padded with zeros instead of −∞ (a border max of 0),
  # if the padding went on the wrong side, or if strides defaulted to the window.
  x_BxHxWxC = -jnp.abs(jax.random.normal(jax.random.key(8), (2, 5, 6, 3))) - 1.
  expected = _reference_pool(x_BxHxWxC, window, strides or (1, 1), padding, 'max')
  got = pooling.max_pool(x_BxHxWxC, window, strides, padding)
  assert got.shape == expected.shape
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize('window, strides, padding', POOL_CASES, ids=str)
@pytest.mark.parametrize('count_include_pad', [True, False])
def test_avg_pool_equals_brute_force_loop(window, strides, padding, count_include_pad):
  # Fails if the divisor were the number of real cells when padded zeros should count (or the
  # other way round), or if 'SAME' put the extra padding before instead of after.
  x_BxHxWxC = jax.random.normal(jax.random.key(9), (2, 5, 6, 3)) + 2.
  kind = 'avg_include_pad' if count_include_pad else 'avg_exclude_pad'
  expected = _reference_pool(x_BxHxWxC, window, strides or (1, 1), padding, kind)
  got = pooling.avg_pool(x_BxHxWxC, window, strides, padding, count_include_pad=count_include_pad)
  assert got.shape == expected.shape
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_avg_pool_same_padding_counts_padded_zeros_by_default():
  # 3×3 ones, 2×2 window, stride 1, 'SAME': one padded row and column, both after the input.
  # Counting padded zeros: 1 inside, 1/2 on the last row/column, 1/4 in the corner.
  ones_BxHxWxC = jnp.ones((1, 3, 3, 1))
  by_default = pooling.avg_pool(ones_BxHxWxC, (2, 2), (1, 1), 'SAME')[0, :, :, 0]
  np.testing.assert_allclose(by_default, [[1., 1., .5], [1., 1., .5], [.5, .5, .25]])
  real_only = pooling.avg_pool(ones_BxHxWxC, (2, 2), (1, 1), 'SAME', count_include_pad=False)
  np.testing.assert_allclose(real_only, np.ones((1, 3, 3, 1)))


def test_global_avg_pool_equals_numpy_mean():
  # Fails if the mean ran over channels or batch, or kept singleton spatial axes.
  x_BxHxWxC = jax.random.normal(jax.random.key(10), (3, 4, 5, 2))
  got_BxC = pooling.global_avg_pool(x_BxHxWxC)
  assert got_BxC.shape == (3, 2)
  np.testing.assert_allclose(got_BxC, np.asarray(x_BxHxWxC, np.float64).mean(axis=(1, 2)),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('shape', [(3, 4, 5), (2, 3, 4, 5, 6)])
def test_global_avg_pool_rejects_non_image_input(shape):
  # Five axes as well as three: a [B, T, H, W, C] video would be averaged over T and H only.
  with pytest.raises(ValueError, match='batch, height, width, channels'):
    pooling.global_avg_pool(jnp.ones(shape))
