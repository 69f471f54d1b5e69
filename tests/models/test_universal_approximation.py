"""The ReLU network built from a piecewise-linear function against a direct evaluation of
that function."""

import jax.numpy as jnp
import numpy as np
import pytest

from models import universal_approximation as ua
from models.mlp import MLP

ATOL = 1e-5


def _piecewise_linear(x, t, f, left_slope, right_slope):
  """The case definition: L_0 left of t_0, L_ℓ on [t_{ℓ-1}, t_ℓ], L_{p+1} right of t_p."""
  out = np.empty_like(x)
  for n, xn in enumerate(x):
    if xn <= t[0]:
      out[n] = f[0] + left_slope * (xn - t[0])
    elif xn >= t[-1]:
      out[n] = f[-1] + right_slope * (xn - t[-1])
    else:
      l = np.searchsorted(t, xn) - 1
      out[n] = f[l] + (f[l + 1] - f[l]) / (t[l + 1] - t[l]) * (xn - t[l])
  return out


def _random_function(seed, pieces):
  # Slopes of order one keep the float32 sums in the network accurate to ~1e-6.
  rng = np.random.default_rng(seed)
  t = np.sort(rng.uniform(-3, 3, size=pieces + 1))
  f = np.concatenate([[rng.normal()], rng.normal(size=pieces) * np.diff(t)]).cumsum()
  return t, f


@pytest.mark.parametrize('seed,pieces', [(0, 1), (1, 4), (2, 12), (3, 20)])
def test_network_equals_the_piecewise_linear_function_everywhere(seed, pieces):
  t, f = _random_function(seed, pieces)
  net = ua.relu_network_from_piecewise_linear(t, f)
  assert net.width == len(t) + 2
  x = np.linspace(-6, 6, 5001)
  first, last = (f[1] - f[0]) / (t[1] - t[0]), (f[-1] - f[-2]) / (t[-1] - t[-2])
  expected = _piecewise_linear(x, t, f, first, last)
  assert np.max(np.abs(np.asarray(net(jnp.asarray(x, jnp.float32))) - expected)) < ATOL
  np.testing.assert_allclose(net(jnp.asarray(t, jnp.float32)), f, atol=ATOL)


def test_network_with_given_outer_slopes():
  t, f = _random_function(4, 6)
  net = ua.relu_network_from_piecewise_linear(t, f, left_slope=0.0, right_slope=-2.5)
  x = np.random.default_rng(5).uniform(-10, 10, size=4000)
  expected = _piecewise_linear(x, t, f, 0.0, -2.5)
  assert np.max(np.abs(np.asarray(net(jnp.asarray(x, jnp.float32))) - expected)) < 2 * ATOL


def test_relu_and_absolute_value_are_recovered():
  x = jnp.linspace(-4, 4, 801)
  relu = ua.relu_network_from_piecewise_linear([-1.0, 0.0, 1.0], [0.0, 0.0, 1.0])
  np.testing.assert_allclose(relu(x), np.maximum(np.asarray(x), 0), atol=ATOL)
  absolute = ua.relu_network_from_piecewise_linear([-1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
  np.testing.assert_allclose(absolute(x), np.abs(np.asarray(x)), atol=ATOL)


def test_network_weights_run_in_the_mlp():
  t, f = _random_function(6, 8)
  net = ua.relu_network_from_piecewise_linear(t, f)
  x_N = jnp.linspace(-4, 4, 301)
  mlp_out = MLP((net.width, 1), activation='relu').apply(net.to_mlp_params(), x_N[:, None])
  np.testing.assert_allclose(mlp_out[:, 0], net(x_N), atol=ATOL)


@pytest.mark.parametrize('width', [6, 12, 24, 48, 96])
def test_interpolating_network_obeys_the_interpolation_error_bound(width):
  # |g - L| ≤ h² max|g''| / 8 for the linear interpolant on a grid of spacing h; here g = sin.
  net = ua.interpolating_network(np.sin, -np.pi, np.pi, width)
  h = 2 * np.pi / (width - 3)
  x = np.linspace(-np.pi, np.pi, 20001)
  error = np.max(np.abs(np.asarray(net(jnp.asarray(x, jnp.float32))) - np.sin(x)))
  assert error <= h**2 / 8 + ATOL
  # The bound is tight up to a constant: sin'' is close to 1 in places.
  assert error >= 0.5 * h**2 / 8


def test_the_narrowest_interpolating_network_is_the_chord():
  # Width 4, the smallest allowed: grid points lo and hi only, so the network is the line
  # through (lo, g(lo)) and (hi, g(hi)) on all of ℝ.
  net = ua.interpolating_network(np.exp, 0.0, 1.0, 4)
  assert net.width == 4
  x = np.linspace(-1, 2, 31)
  np.testing.assert_allclose(net(jnp.asarray(x, jnp.float32)), 1 + (np.e - 1) * x, atol=ATOL)


@pytest.mark.parametrize('t,f,message', [
    ([0.0, 1.0], [0.0], 'two vectors of one length'),
    ([0.0], [1.0], 'At least two breakpoints'),
    ([0.0, 0.0, 1.0], [0.0, 1.0, 2.0], 'strictly increasing'),
])
def test_bad_breakpoints_are_rejected(t, f, message):
  with pytest.raises(ValueError, match=message):
    ua.relu_network_from_piecewise_linear(t, f)


def test_bad_interpolation_settings_are_rejected():
  with pytest.raises(ValueError, match='at least 4'):
    ua.interpolating_network(np.sin, 0.0, 1.0, 3)
  with pytest.raises(ValueError, match='lo < hi'):
    ua.interpolating_network(np.sin, 1.0, 0.0, 8)
