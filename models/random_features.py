"""Random Fourier features for the RBF kernel (Rahimi & Recht 2007).

The RBF kernel k(x, y) = exp(-γ‖x - y‖²) is the Fourier transform of the
Gaussian N(0, 2γ I) (Bochner), so with ω_j ~ N(0, 2γ I) and b_j ~ U[0, 2π],

  z(x) = √(2/D) (cos(ω_1ᵀx + b_1), …, cos(ω_Dᵀx + b_D))

satisfies E[z(x)ᵀz(y)] = k(x, y): a linear model on z approximates the kernel
machine, with an error of order 1/√D.
"""

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp


def rbf_kernel(x_NxD: jnp.ndarray, y_MxD: jnp.ndarray, gamma: float) -> jnp.ndarray:
  """k(x, y) = exp(-γ‖x - y‖²) for every pair of rows, shape N × M.

  ‖x - y‖² is expanded as ‖x‖² + ‖y‖² - 2xᵀy after moving both sets so that x's mean
  is the origin: distances do not change, and the expansion no longer cancels the
  large norms of data far from the origin.
  """
  _check_gamma(gamma)
  x_shape, y_shape = jnp.shape(x_NxD), jnp.shape(y_MxD)
  if len(x_shape) != 2 or len(y_shape) != 2 or x_shape[1] != y_shape[1]:
    raise ValueError(f'rbf_kernel takes two sets of rows of one width, N × D and M × D; got shapes '
                     f'{x_shape} and {y_shape}.')
  centre_D = jnp.mean(x_NxD, axis=0)
  x_NxD, y_MxD = x_NxD - centre_D, y_MxD - centre_D
  sq_dist_NxM = (jnp.sum(x_NxD**2, axis=1)[:, None] + jnp.sum(y_MxD**2, axis=1)[None, :]
                 - 2 * x_NxD @ y_MxD.T)
  # Rounding can make the expanded squared distance slightly negative.
  return jnp.exp(-gamma * jnp.maximum(sq_dist_NxM, 0))


class RandomFourierFeatures(NamedTuple):
  """The random map z of Rahimi & Recht: frequencies ω [D_in, F] and phases b [F], F being
  the number D of features of the module doc."""
  omega_DxF: jnp.ndarray
  phase_F: jnp.ndarray

  @property
  def num_features(self) -> int:
    return self.phase_F.shape[0]

  def __call__(self, x_NxD: jnp.ndarray) -> jnp.ndarray:
    """z(x) = √(2/F) cos(xω + b) for rows x [N, D_in]: shape N × F, F = `num_features`."""
    return math.sqrt(2 / self.num_features) * jnp.cos(x_NxD @ self.omega_DxF + self.phase_F)


def sample_features(key: jax.Array, input_dim: int, num_features: int, gamma: float) -> RandomFourierFeatures:
  """Draws ω_j ~ N(0, 2γ I) and b_j ~ U[0, 2π] for the kernel exp(-γ‖x - y‖²)."""
  _check_gamma(gamma)
  if input_dim < 1 or num_features < 1:
    raise ValueError(f'input_dim and num_features must be positive, got {input_dim} and {num_features}.')
  omega_key, phase_key = jax.random.split(key)
  omega_DxF = math.sqrt(2 * gamma) * jax.random.normal(omega_key, (input_dim, num_features))
  phase_F = jax.random.uniform(phase_key, (num_features,), maxval=2 * math.pi)
  return RandomFourierFeatures(omega_DxF, phase_F)


def approximate_kernel(features: RandomFourierFeatures, x_NxD: jnp.ndarray, y_MxD: jnp.ndarray) -> jnp.ndarray:
  """z(x)ᵀz(y) for every pair of rows, the Monte Carlo estimate of k(x, y)."""
  return features(x_NxD) @ features(y_MxD).T


def _check_gamma(gamma: float) -> None:
  # numbers.Real takes NumPy scalars too (1 / (D · x.var()) of float32 data is a np.float32);
  # a traced γ under jit cannot be checked.
  if isinstance(gamma, numbers.Real) and not gamma > 0:
    raise ValueError(f'The RBF bandwidth gamma must be positive, got {gamma}.')
