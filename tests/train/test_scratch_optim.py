"""Scratch optimisers against Optax, and gradient descent against its O(1/t) bound for convex,
L-smooth costs (Garrigos & Gower 2023, "Handbook of convergence theorems")."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from train import scratch_optim

STEPS = 100
# Both trajectories run in float32; parameters stay O(1).
TRAJECTORY_ATOL = 1e-5


def _problem():
  """A small logistic-regression cost on a two-leaf pytree."""
  rng = np.random.default_rng(0)
  x_NxD = jnp.asarray(rng.normal(size=(32, 3)), jnp.float32)
  y_N = jnp.asarray(rng.integers(0, 2, size=32), jnp.float32)
  params = {'w': jnp.asarray(rng.normal(size=(3,)), jnp.float32), 'b': jnp.zeros((), jnp.float32)}

  def cost(p):
    z = x_NxD @ p['w'] + p['b']
    return jnp.mean(jnp.maximum(z, 0) - z * y_N + jnp.log1p(jnp.exp(-jnp.abs(z))))

  return params, jax.jit(jax.grad(cost))


def _run_scratch(init, step, params, grad_fn):
  state = init(params) if init else None
  step = jax.jit(step)
  trajectory = []
  for _ in range(STEPS):
    if state is None:
      params = step(params, grad_fn(params))
    else:
      params, state = step(params, grad_fn(params), state)
    trajectory.append(params)
  return trajectory


def _run_optax(optimizer, params, grad_fn):
  state = optimizer.init(params)

  @jax.jit
  def step(params, state):
    updates, state = optimizer.update(grad_fn(params), state, params)
    return optax.apply_updates(params, updates), state

  trajectory = []
  for _ in range(STEPS):
    params, state = step(params, state)
    trajectory.append(params)
  return trajectory


def _max_difference(a, b):
  return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


CASES = {
    'gradient_descent': (None, functools.partial(scratch_optim.gradient_descent_step, learning_rate=0.5),
                         optax.sgd(0.5)),
    'heavy_ball': (scratch_optim.momentum_init,
                   functools.partial(scratch_optim.heavy_ball_step, learning_rate=0.1, momentum=0.9),
                   optax.sgd(0.1, momentum=0.9)),
    'ema_momentum': (scratch_optim.momentum_init,
                     functools.partial(scratch_optim.ema_momentum_step, learning_rate=0.5, beta=0.8),
                     optax.chain(optax.ema(0.8, debias=False), optax.scale(-0.5))),
    'adam': (scratch_optim.adam_init,
             functools.partial(scratch_optim.adam_step, learning_rate=0.05, b1=0.9, b2=0.99, eps=1e-8),
             optax.adam(0.05, b1=0.9, b2=0.99, eps=1e-8)),
    # Adam's defaults are Kingma & Ba's (β1 = 0.9, β2 = 0.999, ε = 1e-8), as are Optax's.
    'adam_defaults': (scratch_optim.adam_init,
                      functools.partial(scratch_optim.adam_step, learning_rate=0.05), optax.adam(0.05)),
    # A large ε shows where it enters: added to √ŝ, not under the root.
    'adam_large_eps': (scratch_optim.adam_init,
                       functools.partial(scratch_optim.adam_step, learning_rate=0.05, eps=0.5),
                       optax.adam(0.05, eps=0.5)),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_matches_optax_for_100_steps(name):
  init, step, optimizer = CASES[name]
  params, grad_fn = _problem()
  ours = _run_scratch(init, step, params, grad_fn)
  reference = _run_optax(optimizer, params, grad_fn)
  gaps = [_max_difference(a, b) for a, b in zip(ours, reference)]
  assert max(gaps) < TRAJECTORY_ATOL, (name, max(gaps))
  # The trajectory moves, so agreement is not agreement on a fixed point.
  assert _max_difference(ours[-1], params) > 0.1


def test_the_two_momentum_parametrisations_coincide():
  # β-form with step η equals the m-form with m = β and γ = η(1 - β).
  params, grad_fn = _problem()
  beta, eta = 0.7, 0.4
  ema = _run_scratch(scratch_optim.momentum_init,
                     functools.partial(scratch_optim.ema_momentum_step, learning_rate=eta, beta=beta),
                     params, grad_fn)
  heavy = _run_scratch(scratch_optim.momentum_init,
                       functools.partial(scratch_optim.heavy_ball_step, learning_rate=eta * (1 - beta),
                                         momentum=beta), params, grad_fn)
  assert max(_max_difference(a, b) for a, b in zip(ema, heavy)) < TRAJECTORY_ATOL


def test_adam_first_step_is_sign_of_gradient_thanks_to_bias_correction():
  # v̂_1 = g_1 and ŝ_1 = g_1², so the first step is -η g/(|g| + ε).
  params = {'a': jnp.array([1.0, -2.0, 3.0])}
  grads = {'a': jnp.array([1e-3, -5.0, 40.0])}
  new, state = scratch_optim.adam_step(params, grads, scratch_optim.adam_init(params), learning_rate=0.1,
                                       eps=1e-8)
  np.testing.assert_allclose(new['a'] - params['a'], [-0.1, 0.1, -0.1], rtol=1e-4)
  assert int(state.count) == 1


def test_heavy_ball_with_momentum_one_sums_every_gradient():
  # m = 1 is allowed (m ∈ [0, 1]): with a constant gradient, v_t = -γ t g and θ_t = -γ g t(t+1)/2.
  params, grads = {'a': jnp.zeros(2)}, {'a': jnp.array([1.0, -2.0])}
  state = scratch_optim.momentum_init(params)
  for t in range(1, 5):
    params, state = scratch_optim.heavy_ball_step(params, grads, state, learning_rate=0.1, momentum=1.0)
    np.testing.assert_allclose(state.velocity['a'], -0.1 * t * grads['a'], rtol=1e-6)
  np.testing.assert_allclose(params['a'], -0.1 * grads['a'] * 10, rtol=1e-6)


def test_momentum_accumulates_a_constant_gradient_geometrically():
  # With a constant gradient g, v_t = -γ g (1 + m + … + m^{t-1}).
  params, grads = {'a': jnp.zeros(2)}, {'a': jnp.array([1.0, -2.0])}
  state = scratch_optim.momentum_init(params)
  m, gamma = 0.5, 0.1
  for t in range(1, 6):
    params, state = scratch_optim.heavy_ball_step(params, grads, state, learning_rate=gamma, momentum=m)
    np.testing.assert_allclose(state.velocity['a'], -gamma * grads['a'] * (1 - m**t) / (1 - m), rtol=1e-6)


# Garrigos & Gower 2023: C(θ_t) - min C ≤ ‖θ_0 - θ*‖² / (2ηt)
# for convex, L-smooth C and η ≤ 1/L.


def _quadratic(seed, dim=6):
  """C(θ) = ½ θᵀAθ - bᵀθ with A symmetric positive semi-definite; L = λ_max(A)."""
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
  eigenvalues = np.concatenate([[0.0], np.geomspace(1e-2, 10.0, dim - 1)])
  a = q @ np.diag(eigenvalues) @ q.T
  theta_star = rng.normal(size=dim)
  # b in the range of A, so that the minimum is attained (at θ*).
  return a, a @ theta_star, theta_star, eigenvalues.max()


def _gradient_descent_gaps(a, b, theta_star, eta, steps, theta_0):
  a32, b32 = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  step = jax.jit(lambda theta: scratch_optim.gradient_descent_step(theta, a32 @ theta - b32, eta))
  theta, gaps = jnp.asarray(theta_0, jnp.float32), []
  for _ in range(steps):
    theta = step(theta)
    error = np.asarray(theta, np.float64) - theta_star
    # C(θ) - C(θ*) = ½ (θ - θ*)ᵀ A (θ - θ*) for a quadratic, without cancellation.
    gaps.append(0.5 * error @ a @ error)
  return np.array(gaps)


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('eta_times_l', [1.0, 0.5, 0.1])
def test_gradient_descent_obeys_the_convex_rate(seed, eta_times_l):
  a, b, theta_star, smoothness = _quadratic(seed)
  eta = eta_times_l / smoothness
  theta_0 = theta_star + np.random.default_rng(seed + 10).normal(size=theta_star.shape) * 3
  steps = 200
  gaps = _gradient_descent_gaps(a, b, theta_star, eta, steps, theta_0)
  t = np.arange(1, steps + 1)
  bound = np.sum((theta_0 - theta_star) ** 2) / (2 * eta * t)
  assert np.all(gaps <= bound), np.max(gaps / bound)


def test_the_rate_fails_when_the_step_exceeds_two_over_l():
  # A check that the bound above can be violated: with η > 2/L the iterates diverge.
  a, b, theta_star, smoothness = _quadratic(0)
  eta = 2.2 / smoothness
  theta_0 = theta_star + 1.0
  gaps = _gradient_descent_gaps(a, b, theta_star, eta, 50, theta_0)
  bound = np.sum((theta_0 - theta_star) ** 2) / (2 * eta * np.arange(1, 51))
  assert np.any(gaps > bound)


@pytest.mark.parametrize('call,message', [
    (lambda p: scratch_optim.gradient_descent_step(p, p, learning_rate=0.0), 'learning_rate must be positive'),
    (lambda p: scratch_optim.heavy_ball_step(p, p, scratch_optim.momentum_init(p), learning_rate=0.1,
                                             momentum=1.5), 'momentum must lie in'),
    (lambda p: scratch_optim.ema_momentum_step(p, p, scratch_optim.momentum_init(p), learning_rate=0.1,
                                               beta=1.0), r'beta must lie in \[0, 1\)'),
    (lambda p: scratch_optim.adam_step(p, p, scratch_optim.adam_init(p), learning_rate=0.1, b2=-0.1),
     'b2 must lie in'),
])
def test_bad_hyperparameters_are_rejected(call, message):
  with pytest.raises(ValueError, match=message):
    call({'a': jnp.ones(2)})


_STEPS_WITH_A_LEARNING_RATE = {
    'gradient_descent': lambda p, lr: scratch_optim.gradient_descent_step(p, p, learning_rate=lr),
    'heavy_ball': lambda p, lr: scratch_optim.heavy_ball_step(
        p, p, scratch_optim.momentum_init(p), learning_rate=lr, momentum=0.9),
    'ema_momentum': lambda p, lr: scratch_optim.ema_momentum_step(
        p, p, scratch_optim.momentum_init(p), learning_rate=lr, beta=0.9),
    'adam': lambda p, lr: scratch_optim.adam_step(p, p, scratch_optim.adam_init(p), learning_rate=lr),
}


@pytest.mark.parametrize('learning_rate', [0.0, -0.1])
@pytest.mark.parametrize('name', sorted(_STEPS_WITH_A_LEARNING_RATE))
def test_every_optimiser_refuses_a_learning_rate_that_is_not_positive(name, learning_rate):
  with pytest.raises(ValueError, match=f'^learning_rate must be positive, got {learning_rate}\\.$'):
    _STEPS_WITH_A_LEARNING_RATE[name]({'a': jnp.ones(2)}, learning_rate)


@pytest.mark.parametrize('call,message', [
    (lambda p: scratch_optim.gradient_descent_step(p, p, learning_rate=np.float32(-0.1)),
     'learning_rate must be positive'),
    (lambda p: scratch_optim.heavy_ball_step(p, p, scratch_optim.momentum_init(p), learning_rate=0.1,
                                             momentum=np.float32(1.5)), 'momentum must lie in'),
    (lambda p: scratch_optim.adam_step(p, p, scratch_optim.adam_init(p), learning_rate=0.1,
                                       b1=np.float32(1.0)), r'b1 must lie in \[0, 1\)'),
    (lambda p: scratch_optim.adam_step(p, p, scratch_optim.adam_init(p), learning_rate=0.1,
                                       eps=np.float32(0.0)), 'eps must be positive'),
])
def test_bad_hyperparameters_given_as_numpy_scalars_are_rejected(call, message):
  # b1 = 1 and eps = 0 made every updated parameter NaN; the others stepped silently.
  with pytest.raises(ValueError, match=message):
    call({'a': jnp.ones(2)})


def test_rates_of_zero_are_allowed_and_reduce_to_plain_steps():
  """m = 0 and β = 0 (the closed left ends of [0, 1] and [0, 1)) are gradient descent; Adam with
  β1 = β2 = 0 steps by −η g / (|g| + ε) every time."""
  params = {'a': jnp.array([1.0, -2.0])}
  grads = {'a': jnp.array([0.5, 3.0])}
  descent = params['a'] - 0.1 * grads['a']
  new, _ = scratch_optim.heavy_ball_step(params, grads, scratch_optim.momentum_init(params),
                                         learning_rate=0.1, momentum=0.0)
  np.testing.assert_allclose(new['a'], descent, rtol=1e-6)
  new, _ = scratch_optim.ema_momentum_step(params, grads, scratch_optim.momentum_init(params),
                                           learning_rate=0.1, beta=0.0)
  np.testing.assert_allclose(new['a'], descent, rtol=1e-6)
  state = scratch_optim.adam_init(params)
  for step_grads in (grads, {'a': jnp.array([-2.0, 0.25])}):
    new, state = scratch_optim.adam_step(params, step_grads, state, learning_rate=0.1, b1=0.0,
                                         b2=0.0)
    np.testing.assert_allclose(new['a'] - params['a'], -0.1 * np.sign(step_grads['a']), rtol=1e-6)
    params = new
