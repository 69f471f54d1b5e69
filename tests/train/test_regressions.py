"""Checks against hand formulas and brute force that the rest of the suite does not make:
clipping before a scale-sensitive optimiser, the cosine floor, per-micro-batch random streams,
label smoothing in the task, per-index eval streams, and, on a real digits run, the logged
interval metrics, the forced final checkpoint and the final evaluation over a padded split."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from data import pipeline
from experiments.configs import digits_mlp
from tests.train import stream_probe as probe
from train import checkpoint, loop, optim, parallel, step, tasks
from train.state import init_train_state


def _optimizer(**kw):
  options = dict(name='sgd', learning_rate=0.1, schedule='constant', warmup_steps=0,
                 final_lr_fraction=0.0, grad_clip_norm=0.0, momentum=0.9, nesterov=False,
                 b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
  options.update(kw)
  return ml_collections.ConfigDict(options)


# Gradient clipping: clip(g) = g · min(1, c / ‖g‖) on the gradient, before the optimiser. --------

# A pytree of two leaves; the first gradient (global norm 5) is clipped, the second is not.
_GRADS = [{'a': np.array([3.0, 0.0], np.float32), 'b': np.array([[4.0]], np.float32)},
          {'a': np.array([0.1, -0.2], np.float32), 'b': np.array([[0.05]], np.float32)}]


def _flat(tree):
  return np.concatenate([np.ravel(tree['a']), np.ravel(tree['b'])]).astype(np.float64)


def _clip(g, c):
  return g * min(1.0, c / np.linalg.norm(g))


def _apply(config, grads_seq):
  tx, _ = optim.make_optimizer(config, 100)
  params = jax.tree.map(jnp.zeros_like, grads_seq[0])
  opt_state = tx.init(params)
  for g in grads_seq:
    updates, opt_state = tx.update(jax.tree.map(jnp.asarray, g), opt_state, params)
    params = optax.apply_updates(params, updates)
  return _flat(jax.device_get(params))


def test_adam_sees_the_clipped_gradient_not_a_clipped_update():
  lr, b1, b2, eps, c = 0.1, 0.8, 0.99, 1e-8, 1.0
  got = _apply(_optimizer(name='adam', learning_rate=lr, b1=b1, b2=b2, eps=eps, grad_clip_norm=c),
               _GRADS)
  # Adam (Kingma & Ba 2015) on clipped gradients: m ← β1 m + (1−β1) g, v ← β2 v + (1−β2) g²,
  # θ ← θ − η m̂ / (√v̂ + ε) with m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t).
  theta, m, v = np.zeros(3), np.zeros(3), np.zeros(3)
  for t, g in enumerate(_GRADS, start=1):
    g = _clip(_flat(g), c)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g ** 2
    theta -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
  np.testing.assert_allclose(got, theta, rtol=1e-5, atol=1e-7)


def test_momentum_sees_the_clipped_gradient_at_a_learning_rate_other_than_one():
  lr, mu, c = 0.5, 0.9, 1.0
  got = _apply(_optimizer(name='momentum', learning_rate=lr, momentum=mu, grad_clip_norm=c),
               _GRADS)
  # Heavy ball on clipped gradients: v ← μ v + clip(g), θ ← θ − η v.
  theta, velocity = np.zeros(3), np.zeros(3)
  for g in _GRADS:
    velocity = mu * velocity + _clip(_flat(g), c)
    theta -= lr * velocity
  np.testing.assert_allclose(got, theta, rtol=1e-5, atol=1e-7)


# Schedules with a floor: lr(t) = floor + (peak − floor) · ½(1 + cos(π (t − w) / (T − w))). ------

@pytest.mark.parametrize('schedule, warmup', [('warmup_cosine', 10), ('warmup_cosine', 0),
                                              ('cosine', 0)])
def test_cosine_schedules_decay_to_their_floor(schedule, warmup):
  total, peak, fraction = 100, 0.3, 0.1
  floor = peak * fraction
  lr = optim.make_schedule(_optimizer(learning_rate=peak, schedule=schedule, warmup_steps=warmup,
                                      final_lr_fraction=fraction), total)
  for t in (0, 3, 9, 10, 11, 40, 55, 90, 99, 100):
    if t < warmup:
      expected = peak * t / warmup  # linear warm-up from 0
    else:
      expected = floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * (t - warmup) /
                                                               (total - warmup)))
    assert float(lr(t)) == pytest.approx(expected, rel=1e-5, abs=1e-9), (schedule, t)
  assert float(lr(total)) == pytest.approx(floor, rel=1e-6)


# Random streams of gradient-accumulation micro-batches, label smoothing, eval streams. ----------

def _probe_step(grad_accum_steps):
  model, task, tx = probe.ProbeModel(), probe.ProbeTask(), optax.sgd(0.1)
  batch = probe.batch(8, grad_accum_steps)
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  fn = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                 learning_rate_fn=optax.constant_schedule(0.1),
                                 grad_accum_steps=grad_accum_steps))
  return fn(state, batch)[1]['totals']


def test_every_micro_batch_draws_its_own_dropout_and_augmentation():
  """The two micro-batches hold identical rows: only distinct keys make their draws differ."""
  totals = _probe_step(grad_accum_steps=2)
  for stream in ('dropout', 'augment'):
    # Σ code over micro-batch 0 − Σ code over micro-batch 1: 0 iff both drew alike.
    assert abs(probe.total(totals, f'{stream}_contrast_1')) > 1e-2, stream


@pytest.mark.parametrize('augment', [(), ({'name': 'mixup'},)], ids=['hard', 'mixup'])
def test_classification_loss_smooths_the_labels(augment):
  """Train and eval loss: −Σ_c ((1 − ε) y_c + ε/C) log softmax(z)_c, with y one-hot or mixed."""
  eps, classes = 0.2, 4
  task = tasks.build('classification', {'num_classes': classes}, label_smoothing=eps,
                     augment=augment)
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, classes)).astype(np.float32)
  batch = {'input': rng.uniform(size=(6, 2, 2, 1)).astype(np.float32),
           'label': rng.integers(0, classes, size=6).astype(np.int32)}
  batch = task.transform({'augment': jax.random.PRNGKey(1)}, batch, True)
  targets = np.asarray(batch['label'], np.float64)
  if targets.ndim == 1:
    targets = np.eye(classes)[batch['label']]
  smoothed = (1 - eps) * targets + eps / classes
  log_probs = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
  expected = -(smoothed * log_probs).sum(-1)
  fixed = lambda _: jnp.asarray(logits)
  for metrics in (task.loss(fixed, batch), task.eval_metrics(fixed, batch)):
    np.testing.assert_allclose(metrics['loss'][0], expected, rtol=1e-5)


def test_eval_streams_change_with_the_batch_index_and_repeat_on_a_rerun():
  model, task, tx = probe.ProbeModel(), probe.ProbeTask(), optax.sgd(0.1)
  batch = {**probe.batch(8, 1), 'mask': np.ones(8, np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  evaluate = jax.jit(functools.partial(step.eval_step, model=model, task=task))
  draws = [probe.total(evaluate(state, batch, np.int32(i)), 'augment_code') for i in (0, 1, 0)]
  assert abs(draws[0] - draws[1]) > 1e-2
  assert draws[0] == draws[2]
  train_draw = probe.total(_probe_step(grad_accum_steps=1), 'augment_code')
  assert abs(draws[0] - train_draw) > 1e-2  # eval never repeats step 0's stream


# A real run of the loop on digits. -----------------------------------------------------------

def _digits_config(data_dir, **overrides):
  config = digits_mlp.get_config()
  config.data.data_dir = data_dir
  config.optimizer.warmup_steps = 2
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 100
  for name, value in overrides.items():
    config[name] = value
  return config


def _train_recording(config, workdir, monkeypatch):
  """Runs the loop; returns (run, final eval metrics, every step's metrics, the final state)."""
  recorded, last_state = [], []
  compile_train_step = parallel.Parallel.compile_train_step

  def recording_compile(self, *args, **kwargs):
    step_fn = compile_train_step(self, *args, **kwargs)

    def recording_step(state, batch):
      new_state, metrics = step_fn(state, batch)
      recorded.append(metrics)
      last_state[:] = [new_state]  # earlier states are donated to the next step
      return new_state, metrics
    return recording_step

  monkeypatch.setattr(parallel.Parallel, 'compile_train_step', recording_compile)
  run = loop.setup(config, workdir)
  final_eval = run.train()
  return run, final_eval, jax.device_get(recorded), jax.device_get(last_state[0])


def _logged(workdir, split):
  with open(f'{workdir}/metrics.jsonl', encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  return {row['step']: row for row in rows if row['split'] == split and 'loss' in row}


def test_logged_train_metrics_aggregate_their_whole_interval(data_dir, tmp_path, monkeypatch):
  config = _digits_config(data_dir, num_train_steps=12, log_every_steps=4)
  workdir = str(tmp_path / 'run')
  _, _, per_step, _ = _train_recording(config, workdir, monkeypatch)
  assert len(per_step) == 12
  logged = _logged(workdir, 'train')
  assert sorted(logged) == [4, 8, 12]
  schedule = optim.make_schedule(config.optimizer, config.num_train_steps)
  for k in (4, 8, 12):
    interval = per_step[k - 4:k]
    for name in ('loss', 'accuracy'):
      total = sum(float(m['totals'][name][0]) for m in interval)
      weight = sum(float(m['totals'][name][1]) for m in interval)
      assert weight == 4 * config.global_batch_size
      assert logged[k][name] == pytest.approx(total / weight, rel=1e-6), (k, name)
    last_loss = float(interval[-1]['totals']['loss'][0] / interval[-1]['totals']['loss'][1])
    assert abs(logged[k]['loss'] - last_loss) > 1e-4  # the interval, not its last step
    assert logged[k]['grad_norm'] == pytest.approx(
        np.mean([float(m['grad_norm']) for m in interval]), rel=1e-6)
    # The k-th step (state.step = k − 1) ran at lr(k − 1): that is the logged learning rate.
    # (rel=1e-4: the step evaluates the float32 schedule in XLA, near the end of the cosine.)
    assert logged[k]['learning_rate'] == pytest.approx(float(schedule(k - 1)), rel=1e-4)
    assert abs(float(schedule(k - 1)) - float(schedule(k))) > 1e-2 * float(schedule(k - 1))
  for t, m in enumerate(per_step):
    assert float(m['learning_rate']) == pytest.approx(float(schedule(t)), rel=1e-4)


def _brute_force_eval(run, data_dir, params):
  """Cross-entropy and accuracy of `params` over every example of the digits test split."""
  import data  # pylint: disable=g-import-not-at-top
  source = data.load('digits', 'test', data_dir=data_dir)
  batch = run.task.preprocess(pipeline.read_batch(source, np.arange(len(source))))
  logits = np.asarray(run.model.apply({'params': params}, batch['input']), np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -log_probs[np.arange(len(logits)), batch['label']]
  return len(source), nll.mean(), (logits.argmax(-1) == batch['label']).mean()


def test_final_step_is_checkpointed_and_evaluated_off_the_interval(data_dir, tmp_path,
                                                                     monkeypatch):
  config = _digits_config(data_dir, num_train_steps=10, checkpoint_every_steps=4,
                          checkpoints_to_keep=3, eval_every_steps=4)
  workdir = str(tmp_path / 'run')
  run, final_eval, _, final_state = _train_recording(config, workdir, monkeypatch)
  assert int(final_state.step) == 10
  ckpt = checkpoint.Checkpointer(workdir, config.checkpoint_every_steps, config.checkpoints_to_keep)
  assert sorted(ckpt.manager.all_steps()) == [4, 8, 10]
  saved, data_state = ckpt.restore(run.parallel.abstract_state(run.init_fn, run.rng), step=10)
  ckpt.close()
  assert data_state['iterator'] == {'next_index': 10}
  assert jax.tree.structure(saved) == jax.tree.structure(final_state)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(final_state), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x), err_msg=jax.tree_util.keystr(path))
  assert sorted(_logged(workdir, 'eval')) == [4, 8, 10]
  # The last evaluation covers the 360 test examples in batches of 128, 128 and 104 + 24
  # masked padding rows, and equals a brute-force pass over the split.
  size, loss, accuracy = _brute_force_eval(run, data_dir, final_state.params)
  assert size % config.eval_batch_size != 0
  assert final_eval['loss'] == pytest.approx(loss, rel=1e-5)
  assert final_eval['accuracy'] == pytest.approx(accuracy, abs=1e-7)
  assert _logged(workdir, 'eval')[10]['loss'] == pytest.approx(loss, rel=1e-5)

