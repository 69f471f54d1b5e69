"""Standard scaling X' = (X - μ) / sqrt(σ²), statistics from the training split.

μ_j and σ²_j are the mean and the 1/n variance of feature j over the n rows of
the training split; `fit` computes them once and `transform` applies them to
any split. Features may have any shape after the sample axis. A feature that is
constant on the training split has σ² = 0, so it is divided by 1 instead: it
becomes 0 there and keeps its offset from that constant elsewhere.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Scaler(NamedTuple):
  """Per-feature statistics of the training split (a pytree, so it passes through jit)."""
  mean: jax.Array
  scale: jax.Array  # sqrt(σ²), or 1 where σ² = 0.


def fit(x_NxD: jax.Array) -> Scaler:
  """Mean and standard deviation of every feature over the rows of the training split."""
  x_NxD = jnp.asarray(x_NxD)
  if x_NxD.ndim < 2 or x_NxD.shape[0] == 0:
    raise ValueError(f'Standard scaling fits data of shape (n, features...) with n >= 1; got '
                     f'shape {x_NxD.shape}.')
  # Exact detection: a mean computed in floating point can miss a constant by an ulp.
  constant_D = jnp.all(x_NxD == x_NxD[0], axis=0)
  mean_D = jnp.where(constant_D, x_NxD[0], jnp.mean(x_NxD, axis=0))
  std_D = jnp.sqrt(jnp.mean(jnp.square(x_NxD - mean_D), axis=0))
  return Scaler(mean_D, jnp.where(constant_D, jnp.ones_like(std_D), std_D))


def _check(scaler: Scaler, x_NxD: jax.Array) -> jax.Array:
  x_NxD = jnp.asarray(x_NxD)
  if x_NxD.shape[1:] != scaler.mean.shape:
    raise ValueError(f'Data of shape {x_NxD.shape} does not match the scaler, which was fit on '
                     f'features of shape {scaler.mean.shape}.')
  return x_NxD


def transform(scaler: Scaler, x_NxD: jax.Array) -> jax.Array:
  """(x - μ) / sqrt(σ²) with the training statistics."""
  return (_check(scaler, x_NxD) - scaler.mean) / scaler.scale


def inverse_transform(scaler: Scaler, scaled_NxD: jax.Array) -> jax.Array:
  """Undoes `transform`: x' sqrt(σ²) + μ."""
  return _check(scaler, scaled_NxD) * scaler.scale + scaler.mean
