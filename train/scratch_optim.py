"""Gradient descent, momentum and Adam written from scratch as pure functions on pytrees.

Each optimiser is a pair of functions: `*_init(params) -> state` and
`*_step(params, grads, state, ...) -> (params, state)`, where `grads` is
∇C(θ_t) at `params` = θ_t. Nothing is mutated; any pytree of arrays works.

The two momentum methods read the velocity after its update, v_{t+1}, in the
parameter update: the usual heavy-ball method, the form of Goh's "Why Momentum
Really Works" (distill.pub/2017/momentum) and the form Optax implements. Writing v_t
there instead gives a different method, not a shift of this one: the
first step does not move (θ_1 = θ_0 + v_0 = θ_0), and from then on each velocity
holds gradients taken one step earlier, so the two trajectories part after the
second step.
"""

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any


def _check_positive(name: str, value: float) -> None:
  # numbers.Real takes NumPy scalars (np.float32(0.1)) too; a traced value under jit cannot be checked.
  if isinstance(value, numbers.Real) and not value > 0:
    raise ValueError(f'{name} must be positive, got {value}.')


def _check_unit_interval(name: str, value: float, *, closed_right: bool) -> None:
  if isinstance(value, numbers.Real) and not (0 <= value <= 1 if closed_right else 0 <= value < 1):
    allowed = '[0, 1]' if closed_right else '[0, 1)'
    raise ValueError(f'{name} must lie in {allowed}, got {value}.')


def _zeros_like(params: PyTree) -> PyTree:
  return jax.tree.map(jnp.zeros_like, params)


def gradient_descent_step(params: PyTree, grads: PyTree, learning_rate: float) -> PyTree:
  """Gradient descent: θ_{t+1} = θ_t - η ∇C(θ_t)."""
  _check_positive('learning_rate', learning_rate)
  return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


class MomentumState(NamedTuple):
  """The velocity v_t, one array per parameter."""
  velocity: PyTree


def momentum_init(params: PyTree) -> MomentumState:
  """v_0 = 0 for either momentum parametrisation."""
  return MomentumState(velocity=_zeros_like(params))


def heavy_ball_step(params: PyTree, grads: PyTree, state: MomentumState, *, learning_rate: float,
                    momentum: float) -> tuple[PyTree, MomentumState]:
  """Heavy-ball momentum (Polyak 1964), with m ∈ [0, 1] and step γ:

    v_{t+1} = m·v_t - γ ∇C(θ_t),   θ_{t+1} = θ_t + v_{t+1}.
  """
  _check_positive('learning_rate', learning_rate)
  _check_unit_interval('momentum', momentum, closed_right=True)
  velocity = jax.tree.map(lambda v, g: momentum * v - learning_rate * g, state.velocity, grads)
  return jax.tree.map(jnp.add, params, velocity), MomentumState(velocity)


def ema_momentum_step(params: PyTree, grads: PyTree, state: MomentumState, *, learning_rate: float,
                      beta: float) -> tuple[PyTree, MomentumState]:
  """Momentum in moving-average form, with β ∈ [0, 1) and step η:

    v_{t+1} = β·v_t + (1 - β) ∇C(θ_t),   θ_{t+1} = θ_t - η v_{t+1}.

  The velocity is an exponential moving average of the gradients; the method
  equals `heavy_ball_step` with m = β and γ = η(1 - β).
  """
  _check_positive('learning_rate', learning_rate)
  _check_unit_interval('beta', beta, closed_right=False)
  velocity = jax.tree.map(lambda v, g: beta * v + (1 - beta) * g, state.velocity, grads)
  return jax.tree.map(lambda p, v: p - learning_rate * v, params, velocity), MomentumState(velocity)


class AdamState(NamedTuple):
  """Step count t and the moment estimates v_t (first) and s_t (second)."""
  count: jnp.ndarray
  v: PyTree
  s: PyTree


def adam_init(params: PyTree) -> AdamState:
  """t = 0, v_0 = s_0 = 0."""
  return AdamState(count=jnp.zeros((), jnp.int32), v=_zeros_like(params), s=_zeros_like(params))


def adam_step(params: PyTree, grads: PyTree, state: AdamState, *, learning_rate: float, b1: float = 0.9,
              b2: float = 0.999, eps: float = 1e-8) -> tuple[PyTree, AdamState]:
  """Adam with bias correction (Kingma & Ba 2015, Algorithm 1), for t = 1, 2, …:

    v_t = β1 v_{t-1} + (1 - β1) g_t,    s_t = β2 s_{t-1} + (1 - β2) g_t²,
    v̂_t = v_t / (1 - β1^t),            ŝ_t = s_t / (1 - β2^t),
    θ_{t+1} = θ_t - η v̂_t / (√ŝ_t + ε).
  """
  _check_positive('learning_rate', learning_rate)
  _check_unit_interval('b1', b1, closed_right=False)
  _check_unit_interval('b2', b2, closed_right=False)
  _check_positive('eps', eps)
  count = state.count + 1
  v = jax.tree.map(lambda v, g: b1 * v + (1 - b1) * g, state.v, grads)
  s = jax.tree.map(lambda s, g: b2 * s + (1 - b2) * g**2, state.s, grads)
  t = count.astype(jnp.float32)
  v_correction = 1 - b1**t
  s_correction = 1 - b2**t

  def update(p, v, s):
    return p - learning_rate * (v / v_correction) / (jnp.sqrt(s / s_correction) + eps)

  return jax.tree.map(update, params, v, s), AdamState(count, v, s)
