"""A continuous piecewise-linear f: ℝ → ℝ is a one-hidden-layer ReLU network (Foucart 2022).

With breakpoints t_0 < … < t_p, slopes λ_ℓ on [t_{ℓ-1}, t_ℓ], λ_0 left of t_0
and λ_{p+1} right of t_p, summing the slope changes at the breakpoints gives

  f(x) = ReLU(λ_0 x) - ReLU(-λ_0 x) + c_0 + Σ_{ℓ=0}^{p} (λ_{ℓ+1} - λ_ℓ) ReLU(x - t_ℓ),

with c_0 = f(t_0) - λ_0 t_0: a network Dense_{A2,b2;id} ∘ Dense_{A1,b1;ReLU}
(a ReLU hidden layer and a linear output layer) of width p + 3.
"""

from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np


class OneHiddenLayerReLU(NamedTuple):
  """x ↦ ReLU(x·w1 + b1)·w2 + b2 for scalar inputs, in `models.mlp.MLP` layout."""
  w1_1xH: jnp.ndarray
  b1_H: jnp.ndarray
  w2_Hx1: jnp.ndarray
  b2_1: jnp.ndarray

  @property
  def width(self) -> int:
    return self.b1_H.shape[0]

  def __call__(self, x_N: jnp.ndarray) -> jnp.ndarray:
    hidden_NxH = jnp.maximum(x_N[:, None] @ self.w1_1xH + self.b1_H, 0)
    return (hidden_NxH @ self.w2_Hx1 + self.b2_1)[:, 0]

  def to_mlp_params(self) -> dict:
    """The same network as variables of `models.mlp.MLP((width, 1), activation='relu')`."""
    return {'params': {'Dense_0': {'kernel': self.w1_1xH, 'bias': self.b1_H},
                       'Dense_1': {'kernel': self.w2_Hx1, 'bias': self.b2_1}}}


def relu_network_from_piecewise_linear(breakpoints_P: np.ndarray, values_P: np.ndarray, *,
                                       left_slope: float | None = None,
                                       right_slope: float | None = None) -> OneHiddenLayerReLU:
  """Builds the ReLU network equal to a continuous piecewise-linear function.

  Args:
    breakpoints_P: t_0 < t_1 < … < t_p, at least two points.
    values_P: f(t_0), …, f(t_p); f is linear between neighbouring breakpoints.
    left_slope: λ_0, the slope on (-∞, t_0]; by default that of [t_0, t_1].
    right_slope: λ_{p+1}, the slope on [t_p, ∞); by default that of [t_{p-1}, t_p].

  Returns:
    A network of width p + 3 that equals f on all of ℝ.
  """
  t = np.asarray(breakpoints_P, np.float64)
  f = np.asarray(values_P, np.float64)
  if t.ndim != 1 or t.shape != f.shape:
    raise ValueError(f'Breakpoints of shape {t.shape} and values of shape {f.shape} must be two vectors of '
                     'one length.')
  if t.size < 2:
    raise ValueError(f'At least two breakpoints are needed, got {t.size}.')
  if not np.all(np.diff(t) > 0):
    raise ValueError('Breakpoints must be strictly increasing.')
  inner_slopes = np.diff(f) / np.diff(t)
  lam = np.concatenate([[inner_slopes[0] if left_slope is None else left_slope], inner_slopes,
                        [inner_slopes[-1] if right_slope is None else right_slope]])
  # Units 0 and 1 carry the affine part λ_0 x = ReLU(x)·λ_0 - ReLU(-x)·λ_0;
  # unit ℓ + 2 bends the slope from λ_ℓ to λ_{ℓ+1} at t_ℓ.
  w1 = np.concatenate([[1.0, -1.0], np.ones_like(t)])
  b1 = np.concatenate([[0.0, 0.0], -t])
  w2 = np.concatenate([[lam[0], -lam[0]], np.diff(lam)])
  b2 = f[0] - lam[0] * t[0]
  return OneHiddenLayerReLU(w1_1xH=jnp.asarray(w1[None, :], jnp.float32), b1_H=jnp.asarray(b1, jnp.float32),
                            w2_Hx1=jnp.asarray(w2[:, None], jnp.float32), b2_1=jnp.asarray([b2], jnp.float32))


def interpolating_network(fn: Callable[[np.ndarray], np.ndarray], lo: float, hi: float,
                          width: int) -> OneHiddenLayerReLU:
  """The ReLU network of the given width that linearly interpolates `fn` on a uniform grid of [lo, hi].

  This is the constructive step of the universal approximation theorem for
  ReLU networks on an interval (Leshno et al. 1993 prove the general case): the
  interpolant L with L(t_ℓ) = g(t_ℓ) on a grid of spacing δ, turned into a
  network by `relu_network_from_piecewise_linear`. A width of w uses w - 2 grid points.
  """
  if width < 4:
    raise ValueError(f'The interpolating network needs a width of at least 4, got {width}.')
  if not lo < hi:
    raise ValueError(f'The interval [{lo}, {hi}] must have lo < hi.')
  t = np.linspace(lo, hi, width - 2)
  return relu_network_from_piecewise_linear(t, fn(t))
