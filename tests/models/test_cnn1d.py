"""The MNIST-1D convolutional classifier against a NumPy forward pass written from its equation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.vision.cnn1d import CNN1D


def _numpy_forward(params, x_BxT, strides, padding):
  h = x_BxT[:, :, None].astype(np.float64)
  for layer, stride in enumerate(strides):
    kernel = np.asarray(params[f'Conv_{layer}']['kernel'], np.float64)  # [k, C_in, C_out]
    bias = np.asarray(params[f'Conv_{layer}']['bias'], np.float64)
    k = kernel.shape[0]
    padded = np.pad(h, ((0, 0), (padding, padding), (0, 0)))
    length = (h.shape[1] + 2 * padding - k) // stride + 1  # ⌊(n + 2p − k)/s⌋ + 1
    out = np.zeros((h.shape[0], length, kernel.shape[2]))
    for t in range(length):
      for j in range(k):  # cross-correlation: tap j reads position s·t + j − p
        out[:, t] += padded[:, stride * t + j] @ kernel[j]
    h = np.maximum(out + bias, 0)
  dense = params['Dense_0']
  return h.reshape(h.shape[0], -1) @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])


def test_logits_equal_the_equation_and_the_published_layout():
  model = CNN1D()
  x = np.random.default_rng(0).normal(size=(3, 40)).astype(np.float32)
  params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 40)))['params']
  # Lengths 40 → 19 → 10 → 5 with 25 channels: a 125-wide classifier.
  assert params['Dense_0']['kernel'].shape == (125, 10)
  assert sum(p.size for p in jax.tree.leaves(params)) == 150 + 1900 + 1900 + 1260
  np.testing.assert_allclose(model.apply({'params': params}, x),
                             _numpy_forward(params, x, (2, 2, 2), 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('options, fragment', [
    (dict(channels=(8, 8), kernel_sizes=(3,), strides=(1, 1)), 'as many kernel_sizes'),
    (dict(channels=(8, 0, 8)), 'channels must be positive'),
    (dict(padding=-1), 'padding must be an integer >= 0'),
])
def test_bad_options_are_one_sentence(options, fragment):
  with pytest.raises(ValueError, match=fragment) as info:
    CNN1D(**options)
  assert '\n' not in str(info.value)
