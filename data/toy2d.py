"""Gaussian mixtures in the plane: toy data with exact densities and scores.

  p(x) = Σ_k w_k N(x; μ_k, Σ_k),
  ∇ₓ log p(x) = −Σ_k r_k(x) Σ_k⁻¹ (x − μ_k),   r_k(x) = w_k N(x; μ_k, Σ_k) / p(x).

Adding Gaussian noise of std σ gives the mixture with covariances Σ_k + σ² I, so the
noise-perturbed densities of score-based models (Song & Ermon 2019) are exact too:
`log_prob(x, sigma)` and `score(x, sigma)`.

`ring()` (8 components on a circle) and `grid()` (a 3 × 3 grid) are the usual 2-D
benchmarks; `dataset(name)` returns fixed-seed train and test samples as numpy arrays
for a training pipeline.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve


class GaussianMixture(NamedTuple):
  """Σ_k w_k N(μ_k, Σ_k); build it with `gaussian_mixture`, which checks the arguments.
  A pytree of float32 arrays, so it can be passed to jitted functions."""
  weights_K: jax.Array
  means_KxD: jax.Array
  covariances_KxDxD: jax.Array

  def _component_log_probs(self, x_NxD, sigma):
    """log w_k + log N(x; μ_k, Σ_k + σ² I), [N, K]."""
    dims = self.means_KxD.shape[-1]
    covariances_KxDxD = self.covariances_KxDxD + jnp.square(sigma) * jnp.eye(dims)
    cholesky_KxDxD = jnp.linalg.cholesky(covariances_KxDxD)
    precisions_KxDxD = cho_solve(
        (cholesky_KxDxD, True), jnp.broadcast_to(jnp.eye(dims), covariances_KxDxD.shape))
    log_dets_K = 2 * jnp.sum(jnp.log(jnp.diagonal(cholesky_KxDxD, axis1=1, axis2=2)), axis=-1)
    diffs_NxKxD = x_NxD[:, None, :] - self.means_KxD
    mahalanobis_NxK = jnp.einsum('nkd,kde,nke->nk', diffs_NxKxD, precisions_KxDxD, diffs_NxKxD)
    log_probs_NxK = (jnp.log(self.weights_K) - 0.5 * mahalanobis_NxK - 0.5 * log_dets_K
                     - 0.5 * dims * jnp.log(2 * jnp.pi))
    return log_probs_NxK, diffs_NxKxD, precisions_KxDxD

  def log_prob(self, x_NxD, sigma=0.0):
    """log p(x) [N] of the mixture, or of the mixture plus N(0, σ² I) noise."""
    log_probs_NxK, _, _ = self._component_log_probs(x_NxD, sigma)
    return jax.nn.logsumexp(log_probs_NxK, axis=-1)

  def score(self, x_NxD, sigma=0.0):
    """∇ₓ log p(x) = −Σ_k r_k(x) (Σ_k + σ² I)⁻¹ (x − μ_k), [N, D], in closed form."""
    log_probs_NxK, diffs_NxKxD, precisions_KxDxD = self._component_log_probs(x_NxD, sigma)
    responsibilities_NxK = jax.nn.softmax(log_probs_NxK, axis=-1)
    return -jnp.einsum('nk,kde,nke->nd', responsibilities_NxK, precisions_KxDxD, diffs_NxKxD)

  def sample(self, key, n: int):
    """n independent draws [n, D]: a component k ~ w (by inverting the weights' cumulative
    sum at u ~ U(0, 1)), then μ_k + L_k z with L_k L_kᵀ = Σ_k."""
    component_key, noise_key = jax.random.split(key)
    uniform_N = jax.random.uniform(component_key, (n,))
    cumulative_K = jnp.cumsum(self.weights_K)
    components_N = jnp.minimum(jnp.sum(uniform_N[:, None] >= cumulative_K, axis=-1),
                               self.weights_K.shape[0] - 1)
    noise_NxD = jax.random.normal(noise_key, (n, self.means_KxD.shape[-1]))
    cholesky_KxDxD = jnp.linalg.cholesky(self.covariances_KxDxD)
    return self.means_KxD[components_N] + jnp.einsum('nde,ne->nd', cholesky_KxDxD[components_N],
                                                     noise_NxD)

  def mean(self):
    """E[x] = Σ_k w_k μ_k."""
    return self.weights_K @ self.means_KxD

  def covariance(self):
    """Cov[x] = Σ_k w_k (Σ_k + μ_k μ_kᵀ) − E[x] E[x]ᵀ."""
    second_moment = jnp.einsum('k,kde->de', self.weights_K, self.covariances_KxDxD
                               + jnp.einsum('kd,ke->kde', self.means_KxD, self.means_KxD))
    return second_moment - jnp.outer(self.mean(), self.mean())

  def smoothed(self, sigma: float) -> 'GaussianMixture':
    """The distribution of x + σ z, z ~ N(0, I): covariances Σ_k + σ² I."""
    return self._replace(covariances_KxDxD=self.covariances_KxDxD
                         + sigma**2 * jnp.eye(self.means_KxD.shape[-1]))


def gaussian_mixture(weights, means, covariances) -> GaussianMixture:
  """A checked GaussianMixture: positive weights [K] (normalised here), means [K, D] and
  symmetric positive definite covariances [K, D, D]."""
  weights, means, covariances = (np.asarray(a, np.float64) for a in (weights, means, covariances))
  if weights.ndim != 1 or weights.size < 1 or not (weights > 0).all():
    raise ValueError(f'weights of shape {weights.shape} must be a non-empty vector of positive '
                     f'numbers.')
  count = weights.size
  if means.ndim != 2 or means.shape[0] != count:
    raise ValueError(f'means of shape {means.shape} must be [K, D] with K={count}.')
  dims = means.shape[1]
  if covariances.shape != (count, dims, dims):
    raise ValueError(f'covariances of shape {covariances.shape} must be [K, D, D] = '
                     f'[{count}, {dims}, {dims}].')
  if (not np.allclose(covariances, np.swapaxes(covariances, 1, 2))
      or not (np.linalg.eigvalsh(covariances) > 0).all()):
    raise ValueError('covariances must be symmetric positive definite.')
  return GaussianMixture(jnp.asarray(weights / weights.sum(), jnp.float32),
                         jnp.asarray(means, jnp.float32), jnp.asarray(covariances, jnp.float32))


def ring(num_components: int = 8, radius: float = 2.0, std: float = 0.2,
         weights=None) -> GaussianMixture:
  """Components at radius·(cos 2πk/K, sin 2πk/K), covariance std² I, equal weights by default."""
  angles = 2 * np.pi * np.arange(num_components) / num_components
  means = radius * np.stack([np.cos(angles), np.sin(angles)], axis=-1)
  weights = np.ones(num_components) if weights is None else weights
  return gaussian_mixture(weights, means, np.tile(std**2 * np.eye(2), (num_components, 1, 1)))


def grid(side: int = 3, spacing: float = 2.0, std: float = 0.2) -> GaussianMixture:
  """side² equally weighted components on a square grid centred at 0, covariance std² I."""
  ticks = spacing * (np.arange(side) - (side - 1) / 2)
  means = np.stack(np.meshgrid(ticks, ticks, indexing='ij'), axis=-1).reshape(-1, 2)
  return gaussian_mixture(np.ones(side**2), means, np.tile(std**2 * np.eye(2), (side**2, 1, 1)))


MIXTURES = {'ring': ring, 'grid': grid}


def dataset(name: str = 'ring', num_train: int = 10_000, num_test: int = 2_000,
            seed: int = 0) -> dict[str, np.ndarray]:
  """{'train': float32 [num_train, 2], 'test': float32 [num_test, 2]} drawn from the default
  mixture `name` ('ring' or 'grid'), the same for the same seed; the splits use independent
  keys fold_in(key(seed), 0) and fold_in(key(seed), 1)."""
  if name not in MIXTURES:
    raise ValueError(f'Unknown toy data set {name!r}; allowed: {", ".join(MIXTURES)}.')
  for option, value in (('num_train', num_train), ('num_test', num_test)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{option}={value!r} must be a positive integer.')
  mixture, key = MIXTURES[name](), jax.random.PRNGKey(seed)
  return {split: np.asarray(_sample(mixture, jax.random.fold_in(key, i), n), np.float32)
          for i, (split, n) in enumerate((('train', num_train), ('test', num_test)))}


# Compiled once per mixture shape and sample size.
_sample = jax.jit(GaussianMixture.sample, static_argnums=2)
