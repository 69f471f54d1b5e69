"""Random Fourier features against the exact RBF kernel."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import random_features as rff

GAMMA = 0.1
DIMS = (16, 64, 256, 1024, 4096)
SEEDS = 8


def _data(n=24, dim=5, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(n, dim)), jnp.float32)


def test_rbf_kernel_equals_pairwise_loop():
  x, y = _data(6, 3, 1), _data(4, 3, 2)
  expected = np.array([[math.exp(-GAMMA * sum((float(a) - float(b)) ** 2 for a, b in zip(xi, yj))) for yj in y]
                       for xi in x])
  np.testing.assert_allclose(rff.rbf_kernel(x, y, GAMMA), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.diag(rff.rbf_kernel(x, x, GAMMA)), 1.0, rtol=1e-6)


@pytest.mark.parametrize('gamma', [1.0, 0.05])
def test_rbf_kernel_of_data_far_from_the_origin_equals_direct_distances(gamma):
  # N(0, 1) + 300 in 20 dimensions: ‖x‖² ≈ 1.8e6 while ‖x - y‖² ≈ 40.
  rng = np.random.default_rng(4)
  x = (rng.normal(size=(30, 20)) + 300).astype(np.float32)
  y = (rng.normal(size=(25, 20)) + 300).astype(np.float32)
  got = np.asarray(rff.rbf_kernel(jnp.asarray(x), jnp.asarray(y), gamma))
  x64, y64 = x.astype(np.float64), y.astype(np.float64)
  expected = np.exp(-gamma * ((x64[:, None] - y64[None]) ** 2).sum(-1))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.diag(rff.rbf_kernel(jnp.asarray(x), jnp.asarray(x), gamma)), 1.0, rtol=1e-5)


def test_kernel_values_never_exceed_one():
  # exp(-γ‖x - y‖²) ≤ 1. The expanded ‖x‖² + ‖y‖² - 2xᵀy rounds below 0 for some pairs at
  # distance 0 (down to -3e-5 for these points in float32), and exp of minus that exceeds 1.
  x = jnp.asarray(np.random.default_rng(0).normal(size=(50, 7)) * 3 + 5, jnp.float32)
  kernel = np.asarray(rff.rbf_kernel(x, x, 10.0))
  assert kernel.max() <= 1.0, kernel.max()
  np.testing.assert_allclose(np.diag(kernel), 1.0, rtol=1e-3)


@pytest.mark.parametrize('x_shape, y_shape', [((3, 4), (2, 1)), ((3, 1), (2, 4)), ((4,), (2, 4)),
                                              ((3, 4), (4,))])
def test_rbf_kernel_refuses_rows_of_another_width(x_shape, y_shape):
  # exp(-γ‖x - y‖²) needs x and y in one space; a y of width 1 was broadcast against x's 4 columns.
  x, y = jnp.ones(x_shape), jnp.ones(y_shape)
  with pytest.raises(ValueError, match=r'N × D and M × D; got shapes'):
    rff.rbf_kernel(x, y, GAMMA)


def _mean_abs_errors(x, num_features):
  exact = rff.rbf_kernel(x, x, GAMMA)

  @jax.jit
  def error(key):
    features = rff.sample_features(key, x.shape[1], num_features, GAMMA)
    return jnp.mean(jnp.abs(rff.approximate_kernel(features, x, x) - exact))

  return np.array([float(error(jax.random.key(seed))) for seed in range(SEEDS)])


def kernel_error_slope():
  """Least-squares slope of log(mean |z(x)ᵀz(y) - k(x, y)|) against log D."""
  x = _data()
  errors = [np.mean(_mean_abs_errors(x, d)) for d in DIMS]
  slope, _ = np.polyfit(np.log(DIMS), np.log(errors), 1)
  return slope, errors


def test_kernel_approximation_error_falls_like_one_over_sqrt_d():
  slope, errors = kernel_error_slope()
  assert -0.6 <= slope <= -0.4, (slope, errors)
  assert errors[-1] < 0.02, errors


def test_estimate_is_unbiased():
  # E[z(x)ᵀz(y)] = k(x, y): the average over independent draws converges to the kernel.
  x = _data(8, 4, 3)
  draws = 400

  @jax.jit
  def estimates(keys):
    return jax.vmap(lambda k: rff.approximate_kernel(rff.sample_features(k, 4, 64, GAMMA), x, x))(keys)

  samples = np.asarray(estimates(jax.random.split(jax.random.key(0), draws)))
  standard_error = samples.std(axis=0) / math.sqrt(draws)
  gap = np.abs(samples.mean(axis=0) - np.asarray(rff.rbf_kernel(x, x, GAMMA)))
  assert np.all(gap < 5 * standard_error + 1e-6)


def test_frequencies_and_phases_have_the_bochner_distribution():
  features = rff.sample_features(jax.random.key(1), 4, 20000, GAMMA)
  omega = np.asarray(features.omega_DxF)
  # Var ω = 2γ, with a relative standard error of √(2/n) ≈ 0.5%.
  np.testing.assert_allclose(omega.var(axis=1), 2 * GAMMA, rtol=0.03)
  phase = np.asarray(features.phase_F)
  assert 0 <= phase.min() and phase.max() <= 2 * math.pi
  np.testing.assert_allclose(phase.mean(), math.pi, rtol=0.03)
  z = np.asarray(features(_data(3, 4)))
  assert z.shape == (3, 20000) and np.all(np.abs(z) <= math.sqrt(2 / 20000) * (1 + 1e-6))


@pytest.mark.parametrize('gamma', [np.float32(-1.0), np.float32(0.0), np.float64(-0.5)])
def test_a_numpy_gamma_that_is_not_positive_is_rejected(gamma):
  # 1 / (D · x.var()) of float32 data is a np.float32; γ = -1 gave kernel values above 1.
  with pytest.raises(ValueError, match='gamma must be positive'):
    rff.rbf_kernel(_data(3, 2), _data(2, 2, 1), gamma)
  with pytest.raises(ValueError, match='gamma must be positive'):
    rff.sample_features(jax.random.key(0), 2, 4, gamma)


def test_bad_arguments_are_rejected():
  with pytest.raises(ValueError, match='gamma must be positive'):
    rff.sample_features(jax.random.key(0), 3, 8, 0.0)
  with pytest.raises(ValueError, match='num_features must be positive'):
    rff.sample_features(jax.random.key(0), 3, 0, 1.0)
  # An input width of 0 would give ω of shape [0, F] and features cos(b) that ignore x.
  with pytest.raises(ValueError, match='input_dim and num_features must be positive, got 0'):
    rff.sample_features(jax.random.key(0), 0, 8, 1.0)
  with pytest.raises(ValueError, match='gamma must be positive'):
    rff.rbf_kernel(jnp.ones((1, 2)), jnp.ones((1, 2)), -1.0)


def test_approximate_kernel_between_two_sets_is_the_product_of_their_features():
  # z(x) = √(2/D) cos(xω + b) written out in NumPy from the drawn ω and b; the estimate for
  # x ≠ y pairs is z(x) z(y)ᵀ, of shape N × M.
  features = rff.sample_features(jax.random.PRNGKey(0), 2, 16, GAMMA)
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(3, 2)), rng.normal(size=(2, 2))
  omega, phase = np.asarray(features.omega_DxF, np.float64), np.asarray(features.phase_F, np.float64)
  z = lambda v: np.sqrt(2 / 16) * np.cos(v @ omega + phase)
  got = rff.approximate_kernel(features, jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  np.testing.assert_allclose(got, z(x) @ z(y).T, rtol=1e-5, atol=1e-6)


def test_one_input_dimension_and_a_single_feature_are_valid_sizes():
  # A scalar input (D_in = 1) and F = 1 feature: z(x) = √2 cos(ωx + b), written out in NumPy.
  features = rff.sample_features(jax.random.key(3), 1, 1, GAMMA)
  assert features.omega_DxF.shape == (1, 1) and features.num_features == 1
  omega, phase = float(features.omega_DxF[0, 0]), float(features.phase_F[0])
  x = np.array([-1.5, 0.0, 2.0])
  np.testing.assert_allclose(features(jnp.asarray(x[:, None], jnp.float32))[:, 0],
                             math.sqrt(2) * np.cos(omega * x + phase), rtol=1e-5, atol=1e-6)
