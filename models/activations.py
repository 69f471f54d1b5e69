"""Activation functions of seeds 001 and 004, looked up by name."""

from typing import Callable

import jax
import jax.numpy as jnp

ACTIVATIONS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    'sigmoid': jax.nn.sigmoid,
    'tanh': jnp.tanh,
    'relu': jax.nn.relu,
    'leaky_relu': jax.nn.leaky_relu,
    'gelu': lambda x: jax.nn.gelu(x, approximate=False),
    'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True),
    'elu': jax.nn.elu,
}


def get(name_or_fn: str | Callable) -> Callable[[jnp.ndarray], jnp.ndarray]:
  """Returns the activation called `name_or_fn`, or `name_or_fn` if callable."""
  if callable(name_or_fn):
    return name_or_fn
  if name_or_fn not in ACTIVATIONS:
    raise ValueError(f'Unknown activation {name_or_fn!r}; allowed: {", ".join(sorted(ACTIVATIONS))}.')
  return ACTIVATIONS[name_or_fn]
