"""Optax optimisers and schedules built from config equal their formulas."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from train import optim


def _config(**kw):
  base = dict(name='sgd', learning_rate=0.1, schedule='constant', warmup_steps=0,
              final_lr_fraction=0.0, boundaries=(0.5, 0.75), decay_factor=0.1,
              grad_clip_norm=0.0, momentum=0.9, nesterov=False, b1=0.9, b2=0.999, eps=1e-8,
              weight_decay=0.0)
  base.update(kw)
  return ml_collections.ConfigDict(base)


def test_schedules_follow_their_formulas():
  total, peak = 100, 0.1
  constant = optim.make_schedule(_config(), total)
  step = optim.make_schedule(_config(schedule='step'), total)
  cosine = optim.make_schedule(_config(schedule='cosine', final_lr_fraction=0.1), total)
  warm = optim.make_schedule(_config(schedule='warmup_cosine', warmup_steps=10), total)
  for t in (0, 7, 49, 50, 74, 75, 99, 100):
    assert math.isclose(constant(t), peak, rel_tol=1e-6)
    expected_step = peak * (1 if t < 50 else 0.1 if t < 75 else 0.01)
    assert math.isclose(step(t), expected_step, rel_tol=1e-5), t
    expected_cos = 0.01 + (peak - 0.01) * 0.5 * (1 + math.cos(math.pi * t / total))
    assert math.isclose(cosine(t), expected_cos, rel_tol=1e-5), t
    if t <= 10:
      expected_warm = peak * t / 10
    else:
      expected_warm = peak * 0.5 * (1 + math.cos(math.pi * (t - 10) / (total - 10)))
    assert math.isclose(warm(t), expected_warm, rel_tol=1e-5, abs_tol=1e-9), t


def _run(config, grads_seq, params):
  tx, _ = optim.make_optimizer(config, 100)
  state = tx.init(params)
  for g in grads_seq:
    updates, state = tx.update(g, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params


def test_nesterov_momentum_matches_hand_update():
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=3).astype(np.float32) for _ in range(4)]
  theta = np.zeros(3, np.float32)
  out = _run(_config(name='momentum', nesterov=True, learning_rate=0.1), [jnp.asarray(g) for g in grads],
             jnp.asarray(theta))
  # Optax's Nesterov form: v <- μv + g; θ <- θ − η(g + μv).
  v = np.zeros(3)
  for g in grads:
    v = 0.9 * v + g
    theta = theta - 0.1 * (g + 0.9 * v)
  np.testing.assert_allclose(out, theta, rtol=1e-5)


def test_momentum_weight_decay_is_l2_added_to_the_gradient_before_momentum():
  rng = np.random.default_rng(1)
  grads = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(3)]
  params = {'kernel': jnp.ones((2, 3)), 'bias': jnp.ones(3)}
  out = _run(_config(name='momentum', learning_rate=0.1, weight_decay=0.05,
                     weight_decay_mask='kernels'),
             [{'kernel': jnp.asarray(g), 'bias': jnp.asarray(g[0])} for g in grads], params)
  # g ← g + λθ (kernels only); v ← μv + g; θ ← θ − ηv.
  for name, decay in (('kernel', 0.05), ('bias', 0.0)):
    theta, v = np.ones((2, 3) if name == 'kernel' else 3), 0.0
    for g in grads:
      g = (g if name == 'kernel' else g[0]) + decay * theta
      v = 0.9 * v + g
      theta = theta - 0.1 * v
    np.testing.assert_allclose(out[name], theta, rtol=1e-5)


def test_negative_weight_decay_is_refused():
  with pytest.raises(ValueError, match='weight_decay must be >= 0'):
    optim.make_optimizer(_config(weight_decay=-1e-4), 10)


def test_adam_first_step_is_lr_times_sign():
  g = jnp.array([0.3, -2.0, 1e-3])
  out = _run(_config(name='adam', learning_rate=0.01), [g], jnp.zeros(3))
  # Bias-corrected m̂ = g and v̂ = g², so the first step is −η g/(|g| + ε).
  np.testing.assert_allclose(out, -0.01 * g / (jnp.abs(g) + 1e-8), rtol=1e-5)


def test_clipping_by_global_norm():
  grads = {'a': jnp.array([3.0, 0.0]), 'b': jnp.array([[4.0]])}  # global norm 5
  params = jax.tree.map(jnp.zeros_like, grads)
  out = _run(_config(learning_rate=1.0, grad_clip_norm=1.0), [grads], params)
  np.testing.assert_allclose(out['a'], [-0.6, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out['b'], [[-0.8]], rtol=1e-6)
  unclipped = _run(_config(learning_rate=1.0, grad_clip_norm=10.0), [grads], params)
  np.testing.assert_allclose(unclipped['a'], [-3.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize('change, fragment', [
    (dict(name='rmsprop'), "Unknown optimizer 'rmsprop'"),
    (dict(learning_rate=0.0), 'learning_rate must be positive'),
    (dict(schedule='linear'), "Unknown learning-rate schedule 'linear'"),
    (dict(schedule='warmup_cosine', warmup_steps=100), 'warmup_steps must be in [0, 100)'),
    (dict(grad_clip_norm=-1.0), 'grad_clip_norm must be >= 0'),
])
def test_bad_optimizer_config(change, fragment):
  with pytest.raises(ValueError, match=None) as info:
    optim.make_optimizer(_config(**change), 100)
  assert fragment in str(info.value)
