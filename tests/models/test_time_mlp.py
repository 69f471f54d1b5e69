"""The time-conditioned MLP of the 2-D diffusion experiments against a float64 NumPy forward
pass of its module-doc equations, and its option errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.generative.time_mlp import TimeMLP
from tests.messages import one_sentence


def np_silu(x):
  return x / (1 + np.exp(-x))


def test_time_mlp_equals_a_numpy_forward_pass():
  # e = PE(s·t) = [sin(s t ω_i), cos(s t ω_i)], ω_i = 10000^(−2i/E);
  # h^l = SiLU(Dense(h^(l−1)) + Dense(e)); out = Dense(h^L).
  model = TimeMLP(hidden=(5, 4), embed_dim=6, time_scale=3.0, out_features=3)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 2)).astype(np.float32)
  t = np.array([0.0, 0.1, 2.0, 7.0], np.float32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), x, t)['params']
  # Random biases too (Flax starts them at 0), so that a dropped bias is seen.
  params = jax.tree.map(lambda leaf: rng.normal(0, 0.5, leaf.shape).astype(np.float32), shapes)
  out = model.apply({'params': params}, x, t)

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  dense = lambda name, h: h @ p[name]['kernel'] + p[name]['bias']
  angles = 3.0 * t.astype(np.float64)[:, None] * 10000.0 ** (-np.arange(0, 6, 2) / 6)
  e = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
  # Flax numbers the Dense layers in call order: layer l's pair, then the output layer.
  h = np.asarray(x, np.float64)
  for layer in range(2):
    h = np_silu(dense(f'Dense_{2 * layer}', h) + dense(f'Dense_{2 * layer + 1}', e))
  expected = dense('Dense_4', h)
  assert out.shape == (4, 3)
  # float32 against float64: measured 1.1e-7 with outputs up to 0.64.
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('options, message', [
    # No hidden layer: out = Dense(x), the same output at every t.
    (dict(hidden=()), 'TimeMLP hidden must be a non-empty sequence of positive integers'),
    (dict(hidden=(8, 0)), 'TimeMLP hidden must be a non-empty sequence of positive integers'),
    (dict(hidden=(-4,)), 'got (-4,)'),
    (dict(embed_dim=33), 'TimeMLP embed_dim must be a positive even integer'),
    (dict(embed_dim=0), 'got 0'),
    # 0 was read as None: an output as wide as x.
    (dict(out_features=0), 'TimeMLP out_features must be None or a positive integer, got 0'),
])
def test_bad_options_are_one_sentence(options, message):
  one_sentence(lambda: TimeMLP(**options).init(jax.random.key(0), jnp.zeros((2, 2)),
                                                 jnp.zeros((2,))), message)


def test_times_or_points_of_another_shape_are_one_sentence():
  # Times of another batch used to stop in jnp.broadcast_to ('Incompatible types for
  # broadcasting'), points of another width on Flax's ScopeParamShapeError.
  model = TimeMLP(hidden=(8,), embed_dim=4)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((2, 2)), jnp.zeros((2,)))
  with pytest.raises(ValueError, match=r'TimeMLP times of shape \(3,\) must be one time \(\) or '
                                       r'one per point \[B\] = \(2,\)\.'):
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 2)), jnp.zeros((3,))), variables)
  with pytest.raises(ValueError, match='TimeMLP was initialised on inputs of 2 features, got '
                                       'inputs of 3; give it inputs like those of init.'):
    jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 3)), jnp.zeros((2,))), variables)
  assert jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, 2)), 0.5), variables).shape == (2, 2)
