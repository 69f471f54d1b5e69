"""Langevin dynamics with a score, and a two-sample test to check what it samples.

Unadjusted Langevin dynamics (Roberts & Tweedie 1996; Welling & Teh 2011, with the full
gradient) follows the score s(x) = ∇ₓ log p(x) with noise,

  x ← x + (η/2) s(x) + √η z,   z ~ N(0, I),

and samples p as η → 0 and the number of steps grows. Annealed Langevin dynamics (Song &
Ermon 2019, Algorithm 1) runs it on a sequence of noise-perturbed densities p_σ, σ_1 > … >
σ_L, T steps each with step α_i = ε σ_i² / σ_L², using a noise-conditional score s(x, σ):
the large σ's carry the chains between modes that a single small-σ chain would not cross.

Chains run in parallel along the batch axis [B, …]; steps are a `lax.scan`.

The two-sample test compares samples x_1 … x_N and y_1 … y_M with the energy distance
(Székely & Rizzo 2004) or the squared maximum mean discrepancy with a Gaussian kernel
(Gretton et al. 2012), both V-statistics of one form with a kernel k,

  D = (1/N²) Σ k(x_i, x_j) + (1/M²) Σ k(y_i, y_j) − (2/NM) Σ k(x_i, y_j),

k(a, b) = −‖a − b‖ (energy) or exp(−‖a − b‖² / 2h²) (MMD), and a permutation p-value.
"""

import numbers
from typing import Callable

import jax
import jax.numpy as jnp

STATISTICS = ('energy', 'mmd')


def _check_positive_int(name, value) -> int:
  """`value` as an int: any positive integer (a NumPy one too), not a bool."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f'{name}={value!r} must be a positive integer.')
  return int(value)


def langevin_sample(score_fn: Callable[[jax.Array], jax.Array], x0, key, step_size: float,
                    num_steps: int):
  """num_steps of x ← x + (η/2) s(x) + √η z from x0 [B, …], η = step_size, the noise of
  step i from fold_in(key, i). Returns x [B, …]."""
  num_steps = _check_positive_int('num_steps', num_steps)
  if not step_size > 0:
    raise ValueError(f'step_size={step_size} must be positive.')

  def step(x, i):
    noise = jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype)
    return x + 0.5 * step_size * score_fn(x) + jnp.sqrt(step_size) * noise, None

  x, _ = jax.lax.scan(step, jnp.asarray(x0, jnp.float32), jnp.arange(num_steps))
  return x


def geometric_sigmas(sigma_max: float, sigma_min: float, num_levels: int):
  """σ_1 = sigma_max > … > σ_L = sigma_min with a constant ratio (Song & Ermon 2019, §4)."""
  num_levels = _check_positive_int('num_levels', num_levels)
  if not 0 < sigma_min < sigma_max:
    raise ValueError(f'sigma_max={sigma_max} and sigma_min={sigma_min} must satisfy '
                     f'0 < sigma_min < sigma_max.')
  return jnp.exp(jnp.linspace(jnp.log(sigma_max), jnp.log(sigma_min), num_levels))


def annealed_langevin_sample(score_fn: Callable[[jax.Array, jax.Array], jax.Array], x0, key,
                             sigmas_L, epsilon: float, steps_per_level: int):
  """Annealed Langevin dynamics (Song & Ermon 2019, Algorithm 1) from x0 [B, …]:

    for i = 1 … L:  α_i = ε σ_i² / σ_L²;  T times:  x ← x + (α_i/2) s(x, σ_i) + √α_i z,

  with sigmas_L decreasing, ε = epsilon, T = steps_per_level and score_fn(x, sigma_B), σ_i
  given per example [B]. Returns x [B, …]."""
  steps_per_level = _check_positive_int('steps_per_level', steps_per_level)
  if not epsilon > 0:
    raise ValueError(f'epsilon={epsilon} must be positive.')
  sigmas_L = jnp.asarray(sigmas_L, jnp.float32)
  x0 = jnp.asarray(x0, jnp.float32)

  def level(x, level_inputs):
    i, sigma = level_inputs
    step_size = epsilon * jnp.square(sigma / sigmas_L[-1])
    sigma_B = jnp.full(x.shape[:1], sigma)
    level_key = jax.random.fold_in(key, i)

    def step(x, j):
      noise = jax.random.normal(jax.random.fold_in(level_key, j), x.shape, x.dtype)
      return x + 0.5 * step_size * score_fn(x, sigma_B) + jnp.sqrt(step_size) * noise, None

    x, _ = jax.lax.scan(step, x, jnp.arange(steps_per_level))
    return x, None

  x, _ = jax.lax.scan(level, x0, (jnp.arange(sigmas_L.shape[0]), sigmas_L))
  return x


def _pooled_kernel(x_NxD, y_MxD, statistic, bandwidth):
  """The kernel matrix [N+M, N+M] of the pooled samples (module doc)."""
  pooled_PxD = jnp.concatenate([x_NxD, y_MxD]).astype(jnp.float32)
  squared_PxP = jnp.sum(jnp.square(pooled_PxD[:, None] - pooled_PxD[None]), axis=-1)
  if statistic == 'energy':
    # The where keeps sqrt's infinite slope at 0 out of gradients.
    positive = squared_PxP > 0
    return -jnp.where(positive, jnp.sqrt(jnp.where(positive, squared_PxP, 1)), 0)
  return jnp.exp(-squared_PxP / (2 * bandwidth**2))


def _statistics(kernel_PxP, labels_SxP, num_x, num_y):
  """D of the module doc for each labelling l (1 = from x, 0 = from y), [S]. With G = kernel,
  Σ_xx = lᵀGl, Σ_xy = lᵀG1 − lᵀGl and Σ_yy = 1ᵀG1 − 2 lᵀG1 + lᵀGl."""
  row_sums_P = jnp.sum(kernel_PxP, axis=1)
  total = jnp.sum(row_sums_P)
  within_x_S = jnp.einsum('sp,pq,sq->s', labels_SxP, kernel_PxP, labels_SxP)
  x_rows_S = labels_SxP @ row_sums_P
  between_S = x_rows_S - within_x_S
  within_y_S = total - 2 * x_rows_S + within_x_S
  return within_x_S / num_x**2 + within_y_S / num_y**2 - 2 * between_S / (num_x * num_y)


def _check_two_samples(x_NxD, y_MxD, statistic, bandwidth):
  if x_NxD.ndim != 2 or y_MxD.ndim != 2 or x_NxD.shape[1] != y_MxD.shape[1]:
    raise ValueError(f'Samples of shapes {tuple(x_NxD.shape)} and {tuple(y_MxD.shape)} must be '
                     f'[N, D] and [M, D].')
  if statistic not in STATISTICS:
    raise ValueError(f'statistic={statistic!r}; allowed: {", ".join(STATISTICS)}.')
  if statistic == 'mmd' and not bandwidth > 0:
    raise ValueError(f'bandwidth={bandwidth} must be positive.')


def two_sample_statistic(x_NxD, y_MxD, statistic: str = 'energy', bandwidth: float = 1.0):
  """The energy distance or the squared MMD with bandwidth h (module doc), a V-statistic ≥ 0."""
  _check_two_samples(x_NxD, y_MxD, statistic, bandwidth)
  num_x, num_y = x_NxD.shape[0], y_MxD.shape[0]
  labels_1xP = jnp.concatenate([jnp.ones(num_x), jnp.zeros(num_y)])[None]
  return _statistics(_pooled_kernel(x_NxD, y_MxD, statistic, bandwidth), labels_1xP, num_x,
                     num_y)[0]


def two_sample_test(x_NxD, y_MxD, key, num_permutations: int = 200, statistic: str = 'energy',
                    bandwidth: float = 1.0):
  """The statistic D of x and y and its permutation p-value (1 + #{D_π ≥ D}) / (1 + P) over P
  random relabellings π of the pooled samples (drawn from `key`). Returns (D, p)."""
  _check_two_samples(x_NxD, y_MxD, statistic, bandwidth)
  num_permutations = _check_positive_int('num_permutations', num_permutations)
  num_x, num_y = x_NxD.shape[0], y_MxD.shape[0]
  kernel_PxP = _pooled_kernel(x_NxD, y_MxD, statistic, bandwidth)
  labels_P = jnp.concatenate([jnp.ones(num_x), jnp.zeros(num_y)])
  # Uniformly random permutations: the orders of i.i.d. uniform numbers.
  orders_SxP = jnp.argsort(jax.random.uniform(key, (num_permutations, labels_P.shape[0])), axis=-1)
  permuted_SxP = labels_P[orders_SxP]
  observed = _statistics(kernel_PxP, labels_P[None], num_x, num_y)[0]
  permuted_S = _statistics(kernel_PxP, permuted_SxP, num_x, num_y)
  return observed, (1 + jnp.sum(permuted_S >= observed)) / (1 + num_permutations)
