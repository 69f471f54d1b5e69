"""Layers that flax.linen lacks: maxout (Goodfellow et al. 2013) and the residual wrapper.

Dropout, LayerNorm and BatchNorm are flax.linen's own (`nn.Dropout`,
`nn.LayerNorm`, `nn.BatchNorm`); tests/models/test_layers.py shows that they
compute the published formulas (dropout: Srivastava et al. 2014, in its inverted
form; layer norm: Ba et al. 2016; batch norm: Ioffe & Szegedy 2015).
"""

import numbers
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp


def init_width(module: nn.Module, layer: str) -> int | None:
  """The input width (the kernel's second-to-last axis) that `module`'s layer `layer` was made
  for at init, or None while it has no parameters yet (during init itself)."""
  if not module.has_variable('params', layer):
    return None
  return nn.unbox(module.get_variable('params', layer))['kernel'].shape[-2]


def check_input_width(module: nn.Module, layer: str, width: int, owner: str,
                      unit: str = 'channels') -> None:
  """One sentence if `module`'s first layer `layer` already has a kernel made for inputs of
  another width (its second-to-last axis) than `width`, e.g. RGB images given to a model
  initialised on grayscale ones; Flax would stop on the kernel's shape instead. Shapes are
  static, so it raises when traced."""
  expected = init_width(module, layer)
  if expected is not None and width != expected:
    raise ValueError(f'{owner} was initialised on inputs of {expected} {unit}, got inputs of '
                     f'{width}; give it inputs like those of init.')


class Maxout(nn.Module):
  """Maxout (Goodfellow et al. 2013): f(x) = max{xᵀw_1 + b_1, …, xᵀw_k + b_k} for every output unit.

  The k affine pieces of all units come from one Dense layer with
  `features * pieces` outputs; output unit j owns the columns
  j·k, …, j·k + k - 1 of its kernel.

  Attributes:
    features: number of output units.
    pieces: number k of affine pieces per unit.
  """
  features: int
  pieces: int = 2

  @nn.compact
  def __call__(self, x_BxD: jnp.ndarray) -> jnp.ndarray:
    for option in ('features', 'pieces'):
      value = getattr(self, option)
      if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'Maxout {option} must be a positive integer, got {value!r}.')
    z_BxHK = nn.Dense(self.features * self.pieces)(x_BxD)
    z_BxHxK = z_BxHK.reshape(*z_BxHK.shape[:-1], self.features, self.pieces)
    return jnp.max(z_BxHxK, axis=-1)


class Residual(nn.Module):
  """Skip connection x + f(x) (He et al. 2016).

  Attributes:
    fn: the residual branch f, a module or any callable whose output has the
      shape of its input; extra call arguments (e.g. `train=`) are passed on.
  """
  fn: Callable[..., Any]

  @nn.compact
  def __call__(self, x: jnp.ndarray, *args, **kwargs) -> jnp.ndarray:
    fx = self.fn(x, *args, **kwargs)
    if fx.shape != x.shape:
      raise ValueError(f'Residual branch maps shape {x.shape} to {fx.shape}; it must keep the shape.')
    return x + fx
