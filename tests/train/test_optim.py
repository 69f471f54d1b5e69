"""Optax optimisers and schedules built from config equal their formulas."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
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


@pytest.mark.parametrize('name', ['adam', 'adamw'])
@pytest.mark.parametrize('eps', [1e-8, 0.5])
def test_adam_first_step_is_lr_times_sign(name, eps):
  g = jnp.array([0.3, -2.0, 1e-3])
  out = _run(_config(name=name, learning_rate=0.01, eps=eps), [g], jnp.zeros(3))
  # Bias-corrected m̂ = g and v̂ = g², so the first step is −η g/(|g| + ε) (the decay of the
  # zero parameters is 0).
  np.testing.assert_allclose(out, -0.01 * g / (jnp.abs(g) + eps), rtol=1e-5)


@pytest.mark.parametrize('name', ['adam', 'adamw'])
def test_adam_moments_follow_b1_and_b2_over_several_steps(name):
  """Three steps with b1 = 0.5, b2 = 0.9 against Kingma & Ba's loop: m ← b1 m + (1 − b1) g,
  v ← b2 v + (1 − b2) g², θ ← θ − η (m̂ / (√v̂ + ε) + λθ) with m̂ = m / (1 − b1^t),
  v̂ = v / (1 − b2^t) (λ = 0 for 'adam'). The first step alone is −η g / (|g| + ε) whatever
  b1 and b2 are, so swapped moment rates show only from the second step on."""
  lr, b1, b2, eps, decay = 0.01, 0.5, 0.9, 1e-3, 0.1
  rng = np.random.default_rng(4)
  grads = [rng.normal(size=3).astype(np.float32) for _ in range(3)]
  theta0 = np.array([1.0, -2.0, 0.5], np.float32)
  out = _run(_config(name=name, learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=decay),
             [jnp.asarray(g) for g in grads], jnp.asarray(theta0))
  decay = decay if name == 'adamw' else 0.0
  theta, m, v = theta0.astype(np.float64), np.zeros(3), np.zeros(3)
  for t, g in enumerate(grads, start=1):
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g.astype(np.float64) ** 2
    theta = theta - lr * ((m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + decay * theta)
  np.testing.assert_allclose(out, theta, rtol=1e-5, atol=1e-7)


def test_clipping_by_global_norm():
  grads = {'a': jnp.array([3.0, 0.0]), 'b': jnp.array([[4.0]])}  # global norm 5
  params = jax.tree.map(jnp.zeros_like, grads)
  out = _run(_config(learning_rate=1.0, grad_clip_norm=1.0), [grads], params)
  np.testing.assert_allclose(out['a'], [-0.6, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out['b'], [[-0.8]], rtol=1e-6)
  unclipped = _run(_config(learning_rate=1.0, grad_clip_norm=10.0), [grads], params)
  np.testing.assert_allclose(unclipped['a'], [-3.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize('extra', [dict(), dict(momentum=0.0), dict(momentum=0.9, nesterov=True)])
def test_sgd_is_plain_gradient_descent_whatever_the_momentum_keys(extra):
  """'sgd' ignores `momentum` and `nesterov` (they belong to 'momentum'): after 3 steps
  θ = θ₀ − η Σ g, where heavy ball with μ = 0.9 would move by η(g₁(1 + μ + μ²) + g₂(1 + μ) + g₃)."""
  rng = np.random.default_rng(2)
  grads = [{'w': rng.normal(size=(2, 3)).astype(np.float32), 'b': rng.normal(size=3).astype(np.float32)}
           for _ in range(3)]
  params = {'w': jnp.ones((2, 3)), 'b': jnp.zeros(3)}
  out = _run(_config(name='sgd', learning_rate=0.1, **extra),
             [jax.tree.map(jnp.asarray, g) for g in grads], params)
  # Largest difference measured: 1.2e-7 (float32 steps against the float32 sum).
  for name in ('w', 'b'):
    expected = np.asarray(params[name]) - 0.1 * sum(g[name] for g in grads)
    np.testing.assert_allclose(out[name], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('mu', [0.5, 0.9])
def test_momentum_is_heavy_ball_on_a_quadratic(mu):
  """3 steps of 'momentum' on L(θ) = ½ θᵀAθ − bᵀθ equal the hand loop g = Aθ − b;
  v ← μv + g; θ ← θ − ηv (v₀ = 0)."""
  a = np.array([[2.0, 0.5], [0.5, 1.0]])
  b = np.array([1.0, -1.0])
  eta = 0.1
  tx, _ = optim.make_optimizer(_config(name='momentum', learning_rate=eta, momentum=mu), 100)
  params = jnp.array([1.0, 2.0])
  state = tx.init(params)
  theta, v = np.array([1.0, 2.0]), np.zeros(2)
  for _ in range(3):
    updates, state = tx.update(jnp.asarray(a, jnp.float32) @ params - jnp.asarray(b, jnp.float32),
                               state, params)
    params = params + updates
    v = mu * v + (a @ theta - b)
    theta = theta - eta * v
  # Largest difference measured: 7e-8 (float32 against the float64 loop).
  np.testing.assert_allclose(params, theta, rtol=1e-5, atol=1e-6)
  # Without momentum the same 3 steps end elsewhere (0.39 away for μ = 0.5, 0.83 for 0.9).
  plain = np.array([1.0, 2.0])
  for _ in range(3):
    plain = plain - eta * (a @ plain - b)
  assert np.abs(theta - plain).max() > 0.3


@pytest.mark.parametrize('change, fragment', [
    (dict(name='rmsprop'), "Unknown optimizer 'rmsprop'"),
    (dict(learning_rate=0.0), 'learning_rate must be positive'),
    (dict(learning_rate=float('inf')), 'optimizer.learning_rate must be a finite number'),
    # bool is a subclass of int: True would have been a learning rate of 1.
    (dict(learning_rate=True), 'optimizer.learning_rate must be a finite number that is positive, '
                               'got True'),
    (dict(schedule='linear'), "Unknown learning-rate schedule 'linear'"),
    (dict(schedule='warmup_cosine', warmup_steps=100), 'warmup_steps must be an integer in [0, 100)'),
    # A fraction of the run ("10 % warm-up") reached the peak after one step.
    (dict(schedule='warmup_cosine', warmup_steps=0.1), 'warmup_steps must be an integer in [0, 100)'),
    (dict(schedule='warmup_cosine', warmup_steps=True), 'warmup_steps must be an integer'),
    (dict(schedule='warmup_cosine', warmup_steps=-1), 'warmup_steps must be an integer in [0, 100)'),
    # Only warmup_cosine warms up: the others ignored it.
    (dict(schedule='cosine', warmup_steps=3),
     "warmup_steps=3 warms up only the 'warmup_cosine' schedule, not 'cosine'"),
    (dict(schedule='step', warmup_steps=3),
     "warmup_steps=3 warms up only the 'warmup_cosine' schedule, not 'step'"),
    (dict(schedule='constant', warmup_steps=3),
     "warmup_steps=3 warms up only the 'warmup_cosine' schedule, not 'constant'"),
    (dict(grad_clip_norm=-1.0), 'grad_clip_norm must be >= 0'),
    (dict(weight_decay=-1e-4), 'optimizer.weight_decay must be >= 0, got -0.0001'),
    (dict(momentum=-1.0), 'optimizer.momentum must be in [0, 1), got -1.0'),
    (dict(momentum=1.0), 'optimizer.momentum must be in [0, 1), got 1.0'),
    (dict(nesterov='yes'), "optimizer.nesterov must be True or False, got 'yes'"),
    (dict(b1=1.5), 'optimizer.b1 must be in [0, 1), got 1.5'),
    (dict(b2=1.0), 'optimizer.b2 must be in [0, 1), got 1.0'),
    (dict(b2=-0.1), 'optimizer.b2 must be in [0, 1), got -0.1'),
    (dict(b1=float('nan')), 'optimizer.b1 must be a finite number that is in [0, 1), got nan'),
    (dict(eps=-1.0), 'optimizer.eps must be >= 0, got -1.0'),
    # Adam's update is v̂ / (√ŝ + ε): ε = 0 made it 0/0 = NaN for any parameter whose
    # gradients had all been 0 (e.g. the digits' always-blank pixels), so every step was skipped.
    (dict(name='adam', eps=0.0), 'optimizer.eps must be positive for adam'),
    (dict(name='adamw', eps=0.0), 'optimizer.eps must be positive for adamw'),
    (dict(final_lr_fraction=2.0), 'optimizer.final_lr_fraction must be in [0, 1]'),
    (dict(final_lr_fraction=-0.1), 'optimizer.final_lr_fraction must be in [0, 1]'),
    (dict(decay_factor=-1.0), 'optimizer.decay_factor must be positive'),
    (dict(decay_factor=0.0), 'optimizer.decay_factor must be positive'),
    (dict(schedule='step', boundaries=(2, 3)),
     'optimizer.boundaries must be fractions of the run, each strictly between 0 and 1'),
    (dict(schedule='step', boundaries=(0.5, 1.0)),
     'strictly between 0 and 1 (not step numbers), got (0.5, 1.0)'),
    (dict(schedule='step', boundaries=0.5), 'optimizer.boundaries must be fractions of the run'),
    (dict(schedule='step', boundaries=(0.0, 0.5)), 'strictly between 0 and 1 (not step numbers)'),
    (dict(schedule='step', boundaries=(0.75, 0.5)),
     'optimizer.boundaries must be strictly increasing, got (0.75, 0.5)'),
    (dict(schedule='step', boundaries=(0.5, 0.5)),
     'optimizer.boundaries must be strictly increasing, got (0.5, 0.5)'),
    (dict(schedule='step', boundaries=(0.005, 0.5)),
     'optimizer.boundaries 0.005 falls on step 0 of a run of 100 steps'),
    (dict(schedule='step', boundaries=(0.5, 0.505)),
     'optimizer.boundaries 0.5 and 0.505 both fall on step 50 of a run of 100 steps'),
])
def test_bad_optimizer_config(change, fragment):
  with pytest.raises(ValueError, match=None) as info:
    optim.make_optimizer(_config(**change), 100)
  message = str(info.value)
  assert fragment in message
  assert '\n' not in message and message.endswith('.')


def test_a_block_without_a_learning_rate_is_refused():
  # The one key without a default.
  with pytest.raises(ValueError, match=r'^optimizer\.learning_rate must be a finite number that is '
                                       r'positive, got None\.$'):
    optim.make_optimizer(ml_collections.ConfigDict(dict(name='sgd')), 10)


def test_boundaries_that_collide_on_a_short_run_name_both_and_the_run_length():
  # (0.5, 0.6) of 3 steps: int(1.5) = int(1.8) = 1, so the second decay would be lost.
  with pytest.raises(ValueError) as info:
    optim.make_optimizer(_config(schedule='step', boundaries=(0.5, 0.6)), 3)
  message = str(info.value)
  assert 'optimizer.boundaries 0.5 and 0.6 both fall on step 1 of a run of 3 steps' in message
  assert 'fractions at least 1/3 apart' in message


def test_boundaries_are_only_checked_for_the_step_schedule():
  # The default (0.5, 0.75) collides on a 2-step run, but a cosine schedule never reads it.
  optim.validate(_config(schedule='cosine', boundaries=(0.5, 0.75)), 2)


def test_step_boundaries_are_fractions_of_the_run_truncated_to_steps():
  total, peak, factor = 10, 0.2, 0.5
  schedule = optim.make_schedule(_config(schedule='step', learning_rate=peak,
                                         boundaries=(0.25, 0.55), decay_factor=factor), total)
  optim.validate(_config(schedule='step', boundaries=(0.25, 0.55)), total)
  # Boundary b decays from step int(b·T) on: int(2.5) = 2 and int(5.5) = 5.
  expected = [peak] * 2 + [peak * factor] * 3 + [peak * factor ** 2] * 6
  got = [float(schedule(t)) for t in range(total + 1)]
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize('boundary, total', [(0.29, 100), (0.57, 100), (0.58, 100), (0.7, 90)])
def test_a_boundary_decays_at_its_own_step_where_float_products_fall_just_below_it(boundary,
                                                                                   total):
  # 0.29 · 100 is 28.999… in floats, so the decay came one step early, at step 28.
  step = round(boundary * total)
  schedule = optim.make_schedule(_config(schedule='step', learning_rate=1.0, boundaries=(boundary,),
                                         decay_factor=0.1), total)
  assert [float(schedule(t)) for t in (step - 1, step)] == pytest.approx([1.0, 0.1])


@pytest.mark.parametrize('change', [
    dict(name='sgd', eps=0.0), dict(name='adam', b1=0.0, b2=0.0), dict(name='momentum', momentum=0.0),
    dict(weight_decay=0.0), dict(grad_clip_norm=0.0), dict(schedule='cosine', final_lr_fraction=0.0),
    dict(schedule='cosine', final_lr_fraction=1.0), dict(schedule='warmup_cosine', warmup_steps=99),
    dict(schedule='step', boundaries=(0.01, 0.99)), dict(schedule='step', boundaries=()),
], ids=str)
def test_values_at_the_closed_ends_of_their_ranges_are_accepted(change):
  optim.validate(_config(**change), 100)


def test_a_cosine_floor_of_the_whole_peak_is_a_constant_rate():
  lr = optim.make_schedule(_config(schedule='cosine', final_lr_fraction=1.0), 100)
  np.testing.assert_allclose([float(lr(t)) for t in range(0, 101, 10)], 0.1, rtol=1e-6)


# The value of a key an optimizer block leaves out (as in experiments/configs/default.py, but
# for the schedule); the tests above check these values against the formulas.
_DEFAULTS = dict(schedule='constant', warmup_steps=0, final_lr_fraction=0.0,
                 boundaries=(0.5, 0.75), decay_factor=0.1, grad_clip_norm=0.0, momentum=0.9,
                 nesterov=False, b1=0.9, b2=0.999, eps=1e-8, weight_decay_mask='all')


def _trajectory(config, steps=3):
  """Parameters after each of `steps` updates with gradients and parameters far from 0."""
  tx, _ = optim.make_optimizer(config, 100)
  rng = np.random.default_rng(3)
  params = {'dense': {'kernel': jnp.asarray(1 + rng.uniform(size=(2, 3)), jnp.float32),
                      'bias': jnp.asarray(1 + rng.uniform(size=3), jnp.float32)}}
  opt_state, trajectory = tx.init(params), []
  for _ in range(steps):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    trajectory.append(params)
  return jax.device_get(trajectory)


@pytest.mark.parametrize('name', optim.OPTIMIZERS)
def test_a_block_of_name_and_learning_rate_takes_the_defaults(name):
  """Every key as in _DEFAULTS; weight decay 0, but 1e-4 for 'adamw'."""
  minimal = _trajectory(ml_collections.ConfigDict(dict(name=name, learning_rate=0.1)))
  weight_decay = 1e-4 if name == 'adamw' else 0.0
  spelled = dict(name=name, learning_rate=0.1, weight_decay=weight_decay, **_DEFAULTS)
  for got, want in zip(minimal, _trajectory(ml_collections.ConfigDict(spelled))):
    jax.tree.map(np.testing.assert_array_equal, got, want)
  if name == 'adamw':  # the decay shows: 1e-4 moves the parameters by ~1e-5 a step
    undecayed = _trajectory(ml_collections.ConfigDict(dict(spelled, weight_decay=0.0)))
    assert not np.array_equal(minimal[-1]['dense']['bias'], undecayed[-1]['dense']['bias'])


@pytest.mark.parametrize('schedule', optim.SCHEDULES)
def test_a_schedule_left_at_its_defaults_follows_them(schedule):
  total = 40
  minimal = optim.make_schedule(ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.1,
                                                               schedule=schedule)), total)
  spelled = optim.make_schedule(_config(schedule=schedule, **{k: v for k, v in _DEFAULTS.items()
                                                              if k != 'schedule'}), total)
  got, want = ([float(lr(t)) for t in range(total + 1)] for lr in (minimal, spelled))
  assert got == want
  if schedule == 'step':  # ×0.1 at steps int(0.5·40) and int(0.75·40)
    np.testing.assert_allclose(got[19:22] + got[29:31], [0.1, 0.01, 0.01, 0.01, 0.001], rtol=1e-6)


def test_adam_ignores_weight_decay_and_adamw_decouples_it():
  """First step from θ₀ ≠ 0: 'adam' moves by −η g/(|g| + ε) whatever weight_decay says;
  'adamw' by −η (g/(|g| + ε) + λ θ₀)."""
  g, theta = jnp.array([0.3, -2.0, 1e-3]), jnp.array([1.0, -2.0, 3.0])
  lr, decay = 0.01, 0.5
  adam_step = -lr * g / (jnp.abs(g) + 1e-8)
  for name, expected in (('adam', theta + adam_step),
                         ('adamw', theta + adam_step - lr * decay * theta)):
    out = _run(_config(name=name, learning_rate=lr, weight_decay=decay), [g], theta)
    np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=name)


def test_the_kernels_mask_reads_a_bare_array_or_top_level_leaves():
  """A parameter tree of one array (no path) is a kernel when it has two dimensions; a
  top-level 'bias' leaf is spared."""
  mask = optim.decay_mask('kernels')
  assert mask(jnp.ones((2, 3))) is True and mask(jnp.ones(3)) is False
  assert mask({'bias': jnp.ones((2, 3)), 'w': jnp.ones((2, 3))}) == {'bias': False, 'w': True}


def test_warmup_cosine_rises_from_zero_and_decays_to_its_floor():
  """Linear warm-up from 0 to the peak over 10 steps, then the cosine from the peak down to
  the floor final_lr_fraction · peak at the last step (here 0.25 · 0.1)."""
  total, peak, warmup, floor = 100, 0.1, 10, 0.025
  lr = optim.make_schedule(_config(schedule='warmup_cosine', warmup_steps=warmup,
                                   final_lr_fraction=0.25), total)
  for t in (0, 3, 10, 40, 77, 100):
    if t <= warmup:
      expected = peak * t / warmup
    else:
      cosine = 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))
      expected = floor + (peak - floor) * cosine
    assert math.isclose(lr(t), expected, rel_tol=1e-5, abs_tol=1e-9), t


def test_clipping_acts_on_the_gradient_before_the_learning_rate():
  """‖g‖ = 5 clipped to 1, then scaled by η = 0.1: the step is −0.1 · g / 5 (clipping the
  step −η g, of norm 0.5, would leave it unclipped)."""
  grads = {'a': jnp.array([3.0, 0.0]), 'b': jnp.array([[4.0]])}
  params = jax.tree.map(jnp.zeros_like, grads)
  out = _run(_config(learning_rate=0.1, grad_clip_norm=1.0), [grads], params)
  np.testing.assert_allclose(out['a'], [-0.06, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out['b'], [[-0.08]], rtol=1e-6)


def test_the_kernels_mask_spares_biases_norms_and_log_variances_at_any_depth():
  params = {'Dense_0': {'kernel': jnp.ones((2, 3)), 'bias': jnp.ones(3)},
            'attention': {'query': {'kernel': jnp.ones((4, 2, 2)), 'bias': jnp.ones((2, 2))}},
            'Embed_0': {'embedding': jnp.ones((5, 3))},
            'LayerNorm_0': {'scale': jnp.ones(3), 'bias': jnp.ones(3)},
            'decoder_log_var': jnp.ones((4, 4, 1))}
  assert optim.decay_mask('kernels')(params) == {
      'Dense_0': {'kernel': True, 'bias': False},
      'attention': {'query': {'kernel': True, 'bias': False}},
      'Embed_0': {'embedding': True},
      'LayerNorm_0': {'scale': False, 'bias': False},
      'decoder_log_var': False}


def test_adamw_with_the_kernels_mask_decays_the_kernel_only():
  """First AdamW step from θ₀: −η (g / (|g| + ε) + λ θ₀) on the kernel, −η g / (|g| + ε) on the
  bias."""
  lr, decay = 0.01, 0.5
  theta = {'kernel': jnp.full((2, 2), 2.0), 'bias': jnp.array([1.0, -3.0])}
  g = {'kernel': jnp.array([[0.5, -1.0], [2.0, 0.1]]), 'bias': jnp.array([-0.2, 4.0])}
  out = _run(_config(name='adamw', learning_rate=lr, weight_decay=decay,
                     weight_decay_mask='kernels'), [g], theta)
  for name, lam in (('kernel', decay), ('bias', 0.0)):
    expected = theta[name] - lr * (g[name] / (jnp.abs(g[name]) + 1e-8) + lam * theta[name])
    np.testing.assert_allclose(out[name], expected, rtol=1e-6, err_msg=name)


def test_sgd_weight_decay_reaches_every_parameter_by_default():
  """Without weight_decay_mask ('all'), one SGD step is θ₀ − η (g + λ θ₀) for biases too."""
  theta = {'kernel': jnp.full((2, 2), 2.0), 'bias': jnp.array([1.0, -3.0])}
  g = {'kernel': jnp.array([[0.5, -1.0], [2.0, 0.1]]), 'bias': jnp.array([-0.2, 4.0])}
  out = _run(_config(name='sgd', learning_rate=0.1, weight_decay=0.5), [g], theta)
  for name in ('kernel', 'bias'):
    np.testing.assert_allclose(out[name], theta[name] - 0.1 * (g[name] + 0.5 * theta[name]),
                               rtol=1e-6, err_msg=name)
