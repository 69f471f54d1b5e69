"""The pure train/eval steps: random streams, weighted sums, masking, EMA, accumulation, the
guard against non-finite steps and stop requests."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from data import tokenizers
from models.mlp import MLP
from train import optim, parallel, step, tasks
from train.state import init_train_state


def _classification(**options):
  return tasks.build('classification', {'num_classes': 3}, input_key='x', **options)


def _setup(dropout_rate=0.5, tx=None, **state_options):
  model = MLP(features=(16, 3), dropout_rate=dropout_rate)
  task = _classification()
  tx = tx or optax.sgd(0.1)
  rng = np.random.default_rng(0)
  batch = {'input': rng.normal(size=(8, 4)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch, **state_options)
  fn = functools.partial(step.train_step, model=model, task=task, tx=tx,
                         learning_rate_fn=optax.constant_schedule(0.1))
  return model, task, state, jax.jit(fn), batch


def _mean(totals, name):
  return float(totals[name][0] / totals[name][1])


def test_same_state_and_batch_give_identical_steps():
  _, _, state, train_step, batch = _setup()
  _, _, _, retraced_step, _ = _setup()  # another function, so traced and compiled anew
  a, ma = train_step(state, batch)
  b, mb = retraced_step(state, batch)
  for x, y in zip(jax.tree.leaves((a, ma)), jax.tree.leaves((b, mb))):
    np.testing.assert_array_equal(x, y)
  # The randomness is the state's: another key gives other dropout masks.
  _, mc = train_step(state.replace(rng=jax.random.PRNGKey(1)), batch)
  assert _mean(mc['totals'], 'loss') != _mean(ma['totals'], 'loss')


def test_dropout_stream_is_derived_from_fold_in_of_step():
  """Step t's dropout key is stream_key(fold_in(rng, t), 'dropout')."""
  model, _, state, train_step, batch = _setup()
  _, m0 = train_step(state, batch)
  _, m5 = train_step(state.replace(step=jnp.int32(5)), batch)
  assert _mean(m0['totals'], 'loss') != _mean(m5['totals'], 'loss')
  key = tasks.stream_key(jax.random.fold_in(state.rng, 5), 'dropout')
  logits = model.apply({'params': state.params}, batch['input'], train=True, rngs={'dropout': key})
  expected = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()
  np.testing.assert_allclose(_mean(m5['totals'], 'loss'), expected, rtol=1e-6)


def test_stream_keys_are_distinct_and_stable():
  key = jax.random.PRNGKey(3)
  names = ('dropout', 'latent', 'noise', 'mask', 'augment')
  keys = {n: tuple(np.asarray(jax.random.key_data(tasks.stream_key(key, n)) if jnp.issubdtype(
      tasks.stream_key(key, n).dtype, jax.dtypes.prng_key) else tasks.stream_key(key, n)))
          for n in names}
  assert len(set(keys.values())) == len(names)
  # Stable across processes and runs: the stream's number is the CRC-32 of its name, not
  # Python's hash(), which changes from process to process.
  for name, crc32 in (('dropout', 311029705), ('latent', 1827798387)):
    np.testing.assert_array_equal(tasks.stream_key(key, name), jax.random.fold_in(key, crc32))


class _LatentModel(nn.Module):
  """Draws from a 'latent' stream beside 'dropout', and writes a per-call 'cache'."""

  @nn.compact
  def __call__(self, x, *, train=False):
    eps = jax.random.normal(self.make_rng('latent'), x.shape)
    self.variable('cache', 'last_input', jnp.zeros_like, x).value = x
    h = nn.Dense(4)(x + eps)
    h = nn.Dropout(0.5, deterministic=not train)(h)
    return nn.Dense(3)(h)


@dataclasses.dataclass(frozen=True)
class _LatentTask(tasks.Classification):
  rng_streams = ('dropout', 'latent')


def test_named_streams_reach_the_model_and_cache_stays_out_of_the_state():
  model = _LatentModel()
  task = _LatentTask(meta={'num_classes': 3}, input_key='x')
  tx = optax.sgd(0.1)
  batch = {'input': np.ones((8, 4), np.float32), 'label': np.zeros(8, np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  assert set(state.model_state) == set()  # the 'cache' collection is per call
  fn = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                 learning_rate_fn=optax.constant_schedule(0.1)))
  new_state, metrics = fn(state, batch)
  assert int(new_state.step) == 1 and set(new_state.model_state) == set()
  # The loss equals the model run with the two stream keys drawn independently.
  step_key = jax.random.fold_in(state.rng, 0)
  rngs = {n: tasks.stream_key(step_key, n) for n in ('dropout', 'latent')}
  logits = model.apply({'params': state.params}, batch['input'], train=True, rngs=rngs,
                       mutable=['cache'])[0]
  expected = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()
  np.testing.assert_allclose(_mean(metrics['totals'], 'loss'), expected, rtol=1e-6)
  sums = step.eval_step(state, {**batch, 'mask': np.ones(8, np.int32)}, 0, model=model, task=task)
  assert np.isfinite(float(sums['loss'][0]))


def test_eval_streams_are_fresh_per_batch_and_apart_from_every_train_step():
  """The eval step's draws change with the batch index, repeat for the same index, and are not
  those of the train step with that number (whose key is fold_in(rng, t))."""
  model = _LatentModel()  # draws from the 'latent' stream in inference mode too
  task = _LatentTask(meta={'num_classes': 3}, input_key='x')
  rng = np.random.default_rng(7)
  batch = {'input': rng.normal(size=(8, 4)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32), 'mask': np.ones(8, np.int32)}
  state = init_train_state(model, task, optax.sgd(0.1), jax.random.PRNGKey(0), batch)
  eval_step = jax.jit(functools.partial(step.eval_step, model=model, task=task))

  def eval_loss(index):
    return float(eval_step(state, batch, np.int32(index))['loss'][0])

  assert eval_loss(0) == eval_loss(0)
  assert len({eval_loss(0), eval_loss(1), eval_loss(2)}) == 3
  for t in (0, 1):
    train_rngs = {n: tasks.stream_key(jax.random.fold_in(state.rng, t), n)
                  for n in ('dropout', 'latent')}
    logits = model.apply({'params': state.params}, batch['input'], rngs=train_rngs,
                         mutable=['cache'])[0]
    train_stream_loss = optax.softmax_cross_entropy_with_integer_labels(
        logits, batch['label']).sum()
    assert abs(eval_loss(t) - float(train_stream_loss)) > 1e-3


def test_eval_step_weights_by_mask():
  model, task, state, _, batch = _setup(dropout_rate=0.0)
  mask = np.array([1, 1, 1, 0, 1, 0, 0, 1], np.int32)
  sums = step.eval_step(state, {**batch, 'mask': mask}, 0, model=model, task=task)
  logits = model.apply({'params': state.params}, batch['input'][mask == 1])
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'][mask == 1])
  assert float(sums['loss'][1]) == 5
  np.testing.assert_allclose(sums['loss'][0], losses.sum(), rtol=1e-5)
  correct = (logits.argmax(-1) == batch['label'][mask == 1]).sum()
  assert float(sums['accuracy'][0]) == float(correct)


def test_example_mask_applies_along_the_batch_axis_of_square_metrics():
  """A [B, T] metric with T == B is masked by example (rows), not by position (columns)."""
  values = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)
  weights = jnp.ones((4, 4)).at[:, 3].set(0.0)
  mask = jnp.array([1, 0, 1, 1])
  sums = step.sum_metrics({'m': (values * weights, weights)}, 4, mask)
  rows = np.array([0, 2, 3])
  np.testing.assert_allclose(sums['m'][0], (np.asarray(values) * np.asarray(weights))[rows].sum())
  assert float(sums['m'][1]) == 9.0


@pytest.mark.parametrize('pair, fragment', [
    ((jnp.ones(8), jnp.ones(7)), 'shape (8,) and a weight of shape (7,)'),
    ((jnp.ones(()), jnp.ones(())), 'batch axis (8) first'),
    ((jnp.ones((4, 2)), jnp.ones((4, 2))), 'batch axis (8) first'),
])
def test_metrics_of_the_wrong_shape_are_refused_in_one_sentence(pair, fragment):
  with pytest.raises(ValueError) as info:
    step.sum_metrics({'loss': pair}, 8)
  message = str(info.value)
  assert fragment in message and "'loss'" in message and '\n' not in message


def test_compiled_step_donates_the_state():
  model = MLP(features=(16, 3))
  task = _classification()
  config = ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.1))
  tx, lr = optim.make_optimizer(config, 10)
  par = parallel.Parallel('jit', parallel.make_mesh(1))
  batch = {'input': np.ones((8, 4), np.float32), 'label': np.zeros(8, np.int32)}
  init_fn = lambda rng: init_train_state(model, task, tx, rng, batch)
  abstract = par.abstract_state(init_fn, jax.random.PRNGKey(0))
  state = par.init_state(init_fn, jax.random.PRNGKey(0))
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=task, tx=tx, learning_rate_fn=lr), abstract)
  new_state, _ = train_step(state, par.shard_batch(batch))
  assert all(x.is_deleted() for x in jax.tree.leaves(state.params))
  assert int(new_state.step) == 1


def test_augmentation_runs_in_the_step_with_the_augment_stream():
  """The step augments with stream_key(fold_in(rng, step), 'augment'); mixup's soft labels
  reach the loss."""
  model = MLP(features=(16, 3))
  task = tasks.build('classification', {'num_classes': 3},
                     augment=({'name': 'horizontal_flip', 'p': 1.0}, {'name': 'mixup'}))
  tx = optax.sgd(0.1)
  rng = np.random.default_rng(1)
  batch = {'input': rng.uniform(size=(8, 4, 4, 1)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch).replace(step=jnp.int32(7))
  kwargs = dict(model=model, tx=tx, learning_rate_fn=optax.constant_schedule(0.1))
  _, with_augment = jax.jit(functools.partial(step.train_step, task=task, **kwargs))(state, batch)
  rngs = {'augment': tasks.stream_key(jax.random.fold_in(state.rng, 7), 'augment')}
  augmented = task.transform(rngs, batch, True)
  assert augmented['label'].shape == (8, 3)
  np.testing.assert_allclose(augmented['label'].sum(-1), 1.0, rtol=1e-6)
  assert not np.allclose(augmented['input'], batch['input'])
  logits = model.apply({'params': state.params}, augmented['input'])
  soft_ce = -(augmented['label'] * jax.nn.log_softmax(logits)).sum(-1).mean()
  np.testing.assert_allclose(_mean(with_augment['totals'], 'loss'), soft_ce, rtol=1e-5)
  # Evaluation does not augment: the eval step's sums are those of the model on the raw batch.
  assert task.transform(rngs, batch, False) is batch
  sums = step.eval_step(state, {**batch, 'mask': np.ones(8, np.int32)}, 7, model=model, task=task)
  logits = model.apply({'params': state.params}, batch['input'])
  np.testing.assert_allclose(sums['loss'][0], optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['label']).sum(), rtol=1e-5)


def test_ema_follows_the_hand_computed_average():
  model, task, state, _, batch = _setup(dropout_rate=0.0, ema=True)
  tx = optax.sgd(0.1)
  fn = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                 learning_rate_fn=optax.constant_schedule(0.1), ema_decay=0.2))
  expected = jax.tree.map(np.asarray, state.params)
  # The warm-up min(0.2, (1 + n)/(10 + n)) after n updates: 2/11, then the cap 0.2 (3/12 and
  # 4/13 exceed it).
  for decay in (2 / 11, 0.2, 0.2):
    state, _ = fn(state, batch)
    expected = jax.tree.map(lambda e, p, d=decay: d * e + (1 - d) * np.asarray(p), expected,
                            state.params)
  for e, got in zip(jax.tree.leaves(expected), jax.tree.leaves(state.ema_params)):
    np.testing.assert_allclose(got, e, rtol=1e-6, atol=1e-7)
  assert not np.allclose(jax.tree.leaves(state.ema_params)[0], jax.tree.leaves(state.params)[0])
  # Evaluation reads the average, not the raw parameters.
  sums = step.eval_step(state, {**batch, 'mask': np.ones(8, np.int32)}, 0, model=model, task=task)
  logits = model.apply({'params': state.ema_params}, batch['input'])
  np.testing.assert_allclose(sums['loss'][0], optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['label']).sum(), rtol=1e-5)


class _TokenModel(nn.Module):
  vocab_size: int = 5

  @nn.compact
  def __call__(self, tokens_BxT, *, train=False):
    return nn.Dense(self.vocab_size)(nn.Embed(self.vocab_size, 8)(tokens_BxT))


def _lm_task():
  tokenizer = tokenizers.CharTokenizer(list('abcde'))
  return tasks.build('language_model', {'tokenizer': tokenizer, 'token_units': np.ones(5, np.float32),
                                        'unit': 'char'}, sample_length=0)


def _uneven_lm_batch(batch_size=8, length=6, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, length + 1, size=batch_size)
  weights = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
  return {'tokens': rng.integers(0, 5, size=(batch_size, length + 1)).astype(np.int32),
          'weights': weights}


def test_gradient_accumulation_equals_one_step_on_the_whole_batch():
  """Token-weighted loss with uneven padding: 4 micro-batches == one batch, not the mean of
  the micro-batch means."""
  model, task = _TokenModel(), _lm_task()
  tx = optax.adam(1e-2)
  batch = _uneven_lm_batch()
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  kwargs = dict(model=model, task=task, tx=tx, learning_rate_fn=optax.constant_schedule(1e-2))
  whole, m1 = jax.jit(functools.partial(step.train_step, **kwargs))(state, batch)
  accumulated, m4 = jax.jit(functools.partial(step.train_step, grad_accum_steps=4, **kwargs))(
      state, batch)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(accumulated.params)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  np.testing.assert_allclose(m1['grad_norm'], m4['grad_norm'], rtol=1e-5)
  np.testing.assert_allclose(m1['totals']['loss'][1], batch['weights'].sum())
  # The token average is the global one: Σ nll / Σ weights over the whole batch.
  logits = model.apply({'params': state.params}, batch['tokens'][:, :-1])
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch['tokens'][:, 1:])
  np.testing.assert_allclose(_mean(m1['totals'], 'loss'),
                             (nll * batch['weights']).sum() / batch['weights'].sum(), rtol=1e-6)


def test_sgd_step_moves_by_the_gradient_of_the_global_token_average():
  """Plain SGD (update = −η·g) exposes the gradient's scale, which Adam's first step
  (≈ −η·sign g) hides: θ' = θ − η ∇(Σ w·nll / Σ w), with or without accumulation."""
  model, task = _TokenModel(), _lm_task()
  lr = 0.5
  tx, lr_fn = optim.make_optimizer(ml_collections.ConfigDict(dict(name='sgd', learning_rate=lr)), 10)
  batch = _uneven_lm_batch()
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  inputs, targets, weights = batch['tokens'][:, :-1], batch['tokens'][:, 1:], batch['weights']
  # Σ weights (21) is far from the 8 examples and the 48 positions, so dividing by either
  # scales the step by a factor of at least 2.3.
  assert weights.sum() not in (weights.shape[0], weights.size)

  def token_average(params):
    log_probs = jax.nn.log_softmax(model.apply({'params': params}, inputs))
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return (nll * weights).sum() / weights.sum()

  grads = jax.grad(token_average)(state.params)
  expected = jax.tree.map(lambda p, g: p - lr * g, state.params, grads)
  expected_norm = np.sqrt(sum(float((g ** 2).sum()) for g in jax.tree.leaves(grads)))
  kwargs = dict(model=model, task=task, tx=tx, learning_rate_fn=lr_fn)
  for accum in (1, 4):
    new_state, metrics = jax.jit(functools.partial(step.train_step, grad_accum_steps=accum,
                                                   **kwargs))(state, batch)
    # Largest difference measured: 6e-8 in the parameters (steps up to 0.06), 3e-8 relative
    # in the norm.
    for got, want in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(expected)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics['grad_norm'], expected_norm, rtol=1e-5)
    assert int(metrics['skipped']) == 0


def test_weight_decay_mask_spares_biases_and_norm_parameters():
  config = ml_collections.ConfigDict(dict(name='adamw', learning_rate=0.1, weight_decay=0.5,
                                          weight_decay_mask='kernels'))
  tx, _ = optim.make_optimizer(config, 10)
  # An attention layer's query bias is [heads, head_dim]: two dimensions, and a bias (it was
  # decayed when the rule was "two or more dimensions").
  params = {'dense': {'kernel': jnp.ones((3, 2)), 'bias': jnp.ones(2)},
            'norm': {'scale': jnp.ones(2)},
            'query': {'kernel': jnp.ones((4, 2, 3)), 'bias': jnp.ones((2, 3))},
            'embed': {'embedding': jnp.ones((5, 4))},
            # The VAE's per-pixel decoder log σ² [H, W, C] (was decayed: three dimensions).
            'vae': {'decoder_log_var': jnp.ones((3, 3, 1))}}
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  # With zero gradients only decoupled weight decay moves a parameter: −lr·wd·p.
  for decayed in (('dense', 'kernel'), ('query', 'kernel'), ('embed', 'embedding')):
    np.testing.assert_allclose(updates[decayed[0]][decayed[1]],
                               -0.1 * 0.5 * np.ones(params[decayed[0]][decayed[1]].shape),
                               rtol=1e-6, err_msg=str(decayed))
  for spared in (('dense', 'bias'), ('norm', 'scale'), ('query', 'bias'),
                 ('vae', 'decoder_log_var')):
    np.testing.assert_array_equal(updates[spared[0]][spared[1]], 0.0, err_msg=str(spared))
  config.weight_decay_mask = 'all'
  tx, _ = optim.make_optimizer(config, 10)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  np.testing.assert_allclose(updates['dense']['bias'], -0.05 * np.ones(2), rtol=1e-6)
  config.weight_decay_mask = 'nothing'
  with pytest.raises(ValueError, match="'nothing'; allowed: all, kernels"):
    optim.make_optimizer(config, 10)


def test_the_reported_learning_rate_is_the_one_the_update_uses_after_a_skipped_step():
  # A skipped step leaves the optimizer's schedule count where it was, but the rate was read
  # at the train step counter, so every later step reported the rate of one step ahead.
  config = ml_collections.ConfigDict(dict(name='sgd', learning_rate=1.0, schedule='step',
                                          boundaries=(0.5,), decay_factor=0.1))
  tx, lr_fn = optim.make_optimizer(config, 4)  # 1.0 for updates 0 and 1, then 0.1
  model, task, state, _, batch = _setup(dropout_rate=0.0, tx=tx)
  train = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                    learning_rate_fn=lr_fn))
  nan_batch = {**batch, 'input': np.full_like(batch['input'], np.nan)}
  reported, moves = [], []
  for batch_t in (nan_batch, batch, batch, batch):
    new_state, metrics = train(state, batch_t)
    reported.append(float(metrics['learning_rate']))
    moves.append(max(float(np.abs(a - b).max()) for a, b in
                     zip(jax.tree.leaves(new_state.params), jax.tree.leaves(state.params))))
    state = new_state
  assert moves[0] == 0.0  # skipped
  assert reported == [1.0, 1.0, 1.0, pytest.approx(0.1)]
  # The third step (the second update) moved by the rate 1.0 it reported: ten times the last.
  assert moves[2] > 3 * moves[3]


def test_a_step_whose_update_overflows_is_skipped():
  """Loss and gradients finite, the updated parameters not (float32 overflows past 3.4e38):
  the state stays as it was but for the step counter, and the step reports skipped = 1."""
  model, task, state, _, batch = _setup(dropout_rate=0.0, tx=optax.sgd(1e38))
  kwargs = dict(model=model, task=task, learning_rate_fn=optax.constant_schedule(1e38))
  batch = {**batch, 'input': 100 * batch['input']}  # gradients of size ~10 to ~100
  new_state, metrics = jax.jit(functools.partial(step.train_step, tx=optax.sgd(1e38), **kwargs))(
      state, batch)
  assert np.isfinite(_mean(metrics['totals'], 'loss')) and np.isfinite(float(metrics['grad_norm']))
  assert float(metrics['grad_norm']) > 10  # 1e38 · 10 > float32's largest number
  assert int(metrics['skipped']) == 1 and int(new_state.step) == 1
  for before, after in zip(jax.tree.leaves((state.params, state.opt_state, state.model_state)),
                           jax.tree.leaves((new_state.params, new_state.opt_state,
                                            new_state.model_state))):
    np.testing.assert_array_equal(after, before)
  # The same batch at a rate of 0.1 is a step like any other.
  moved, metrics = jax.jit(functools.partial(step.train_step, tx=optax.sgd(0.1), **kwargs))(
      state, batch)
  assert int(metrics['skipped']) == 0
  assert not np.allclose(jax.tree.leaves(moved.params)[0], jax.tree.leaves(state.params)[0])


def test_batch_statistics_run_through_the_micro_batches_in_order():
  """With 2 micro-batches the running statistics are those of the model applied in training
  mode to rows 0, 2, 4, 6 (micro-batch k holds every 2nd row from row k), then to rows 1, 3,
  5, 7 with the statistics the first left: not those of the last micro-batch alone, nor of
  rows split another way."""
  model = MLP(features=(6, 3), batch_norm=True)
  task, tx = _classification(), optax.sgd(0.1)
  rng = np.random.default_rng(2)
  # Even and odd rows have means near +3 and −3, so each micro-batch's statistics are its own.
  inputs = rng.normal(size=(8, 4)) + np.where(np.arange(8) % 2 == 0, 3.0, -3.0)[:, None]
  batch = {'input': inputs.astype(np.float32), 'label': rng.integers(0, 3, size=8).astype(np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  new_state, _ = jax.jit(functools.partial(
      step.train_step, model=model, task=task, tx=tx,
      learning_rate_fn=optax.constant_schedule(0.1), grad_accum_steps=2))(state, batch)

  def running_stats(stats, rows):
    _, updates = model.apply({'params': state.params, 'batch_stats': stats}, batch['input'][rows],
                             train=True, mutable=['batch_stats'])
    return updates['batch_stats']

  first, second = slice(0, 8, 2), slice(1, 8, 2)
  expected = running_stats(running_stats(state.model_state['batch_stats'], first), second)
  for got, want in zip(jax.tree.leaves(new_state.model_state['batch_stats']),
                       jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  last_only = running_stats(state.model_state['batch_stats'], second)
  mean_gap = np.abs(last_only['BatchNorm_0']['mean'] - expected['BatchNorm_0']['mean']).max()
  assert mean_gap > 1e-3, mean_gap  # about 0.0099 × the first micro-batch's mean


def test_micro_batch_dropout_streams_fold_in_the_micro_batch_index():
  """With accumulation, micro-batch i of step t draws dropout from
  stream_key(fold_in(fold_in(rng, t), i), 'dropout'), micro-batch 0 included."""
  model, task, state, _, batch = _setup()
  state = state.replace(step=jnp.int32(3))
  fn = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=optax.sgd(0.1),
                                 learning_rate_fn=optax.constant_schedule(0.1), grad_accum_steps=2))
  _, metrics = fn(state, batch)
  step_key = jax.random.fold_in(state.rng, 3)
  total = 0.0
  for i, rows in enumerate((slice(0, 8, 2), slice(1, 8, 2))):  # every 2nd row from row i
    key = tasks.stream_key(jax.random.fold_in(step_key, i), 'dropout')
    logits = model.apply({'params': state.params}, batch['input'][rows], train=True,
                         rngs={'dropout': key})
    total += float(optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'][rows]).sum())
  np.testing.assert_allclose(float(metrics['totals']['loss'][0]), total, rtol=1e-5)


def test_a_skipped_step_keeps_the_moments_running_statistics_and_average():
  """After a NaN batch through batch norm, Adam and the parameter EMA, every part of the state
  is as it was (Adam's moments and count, the running statistics, the average), but for the
  step counter; the skipped step and the next one report the rate of the schedule at the
  number of updates made (1), not at the step (2)."""
  config = ml_collections.ConfigDict(dict(name='adam', learning_rate=0.1, schedule='cosine'))
  tx, lr_fn = optim.make_optimizer(config, 10)
  model = MLP(features=(6, 3), batch_norm=True)
  task = _classification()
  rng = np.random.default_rng(4)
  batch = {'input': rng.normal(size=(8, 4)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch, ema=True)
  train = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                    learning_rate_fn=lr_fn, ema_decay=0.5))
  # One real update first, so that the moments, the statistics and the average all differ
  # from their initial values (and the average from the parameters).
  state, _ = train(state, batch)
  assert not np.allclose(jax.tree.leaves(state.ema_params)[0], jax.tree.leaves(state.params)[0])
  skipped, metrics = train(state, {**batch, 'input': np.full_like(batch['input'], np.nan)})
  assert int(metrics['skipped']) == 1 and int(skipped.step) == 2
  reported = [float(metrics['learning_rate'])]
  for name in ('params', 'opt_state', 'model_state', 'ema_params', 'rng'):
    before, after = getattr(state, name), getattr(skipped, name)
    assert jax.tree.structure(after) == jax.tree.structure(before), name
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
      np.testing.assert_array_equal(y, x, err_msg=name)
  _, metrics = train(skipped, batch)
  assert int(metrics['skipped']) == 0
  reported.append(float(metrics['learning_rate']))
  # lr(t) = 0.1 · ½(1 + cos(πt/10)): lr(1), the rate of the second update, not lr(2).
  np.testing.assert_allclose(reported, 0.1 * 0.5 * (1 + np.cos(np.pi / 10)), rtol=1e-5)


class _Linear(nn.Module):

  @nn.compact
  def __call__(self, x, *, train=False):
    return nn.Dense(1)(x)[:, 0]


@dataclasses.dataclass(frozen=True)
class _PoisonedTask(tasks.Task):
  """Loss out², or with `poison` a loss of which one quantity of the step is not finite."""
  poison: str = 'none'

  def model_inputs(self, batch):
    return (batch['input'],)

  def loss(self, model, batch):
    out_B = model(batch['input'])
    loss_B = out_B ** 2
    if self.poison == 'loss':  # +∞ with gradient 0
      loss_B = loss_B + jax.lax.stop_gradient(jnp.full_like(out_B, jnp.inf))
    elif self.poison == 'gradient':  # √(0·out) = 0, whose gradient is ∞·0 = NaN
      loss_B = loss_B + jnp.sqrt(0.0 * out_B)
    elif self.poison == 'moment':  # gradients ~1e20, whose squares overflow float32
      loss_B = 1e20 * out_B
    return {'loss': tasks.mean_over(loss_B)}


@dataclasses.dataclass(frozen=True)
class _NoLossTask(_PoisonedTask):
  """Reports its loss under another name."""

  def loss(self, model, batch):
    return {'error': tasks.mean_over(model(batch['input']) ** 2)}


def test_a_task_loss_without_a_loss_metric_is_refused_naming_what_it_reported():
  model, task, tx = _Linear(), _NoLossTask(), optax.sgd(0.1)
  batch = {'input': np.ones((4, 3), np.float32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  # (Raised while tracing, so JAX appends a note on its filtered traceback.)
  with pytest.raises(ValueError, match=r"^A task loss must report a \"loss\" metric; it reported "
                                       r"\['error'\]\."):
    step.train_step(state, batch, model=model, task=task, tx=tx,
                    learning_rate_fn=optax.constant_schedule(0.1))


@pytest.mark.parametrize('poison, tx', [
    ('none', optax.sgd(0.1)),
    # Only the loss is infinite: its gradient, the update and the new state are finite.
    ('loss', optax.sgd(0.1)),
    # Only the gradient is NaN: this optimiser's update (0) and the new state are finite.
    ('gradient', optax.set_to_zero()),
    # Only Adam's second moment is infinite: the update m̂ / (√∞ + ε) = 0 and the parameters
    # are finite, but kept, that moment would stop every later update of the parameter.
    ('moment', optax.adam(0.1)),
], ids=['none', 'loss', 'gradient', 'moment'])
def test_a_single_non_finite_quantity_skips_the_step(poison, tx):
  model, task = _Linear(), _PoisonedTask(poison=poison)
  batch = {'input': np.random.default_rng(5).normal(size=(8, 3)).astype(np.float32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch, ema=True)
  # An average away from the parameters, which a step that is not skipped moves.
  state = state.replace(ema_params=jax.tree.map(lambda p: p + 1.0, state.params))
  new_state, metrics = jax.jit(functools.partial(
      step.train_step, model=model, task=task, tx=tx,
      learning_rate_fn=optax.constant_schedule(0.1), ema_decay=0.5))(state, batch)
  loss = float(metrics['totals']['loss'][0])
  assert (loss == np.inf) == (poison == 'loss')
  # (The gradient norm squares the gradients too: infinite for 'moment'.)
  assert np.isfinite(float(metrics['grad_norm'])) == (poison in ('none', 'loss'))
  assert int(metrics['skipped']) == (poison != 'none') and int(new_state.step) == 1
  for before, after in zip(jax.tree.leaves((state.params, state.ema_params)),
                           jax.tree.leaves((new_state.params, new_state.ema_params))):
    assert np.array_equal(after, before) == (poison != 'none')
  if poison == 'moment':
    jax.tree.map(np.testing.assert_array_equal, new_state.opt_state, state.opt_state)


def test_a_stop_request_from_any_example_is_reported_and_is_not_model_input():
  """The step reports max(stop_requested) over the batch; the flag never reaches the task,
  so the update is the same with or without it, and with accumulation."""
  model, task, state, train_step, batch = _setup(dropout_rate=0.0)
  plain, metrics = train_step(state, batch)
  assert 'stop_requested' not in metrics
  accumulate = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=optax.sgd(0.1),
                                         learning_rate_fn=optax.constant_schedule(0.1),
                                         grad_accum_steps=2))
  for fn in (train_step, accumulate):
    # Row 5 lies in the second micro-batch.
    for flags, expected in ((np.zeros(8, np.int32), 0), (np.eye(8, dtype=np.int32)[5], 1)):
      new_state, metrics = fn(state, {**batch, 'stop_requested': flags})
      assert int(metrics['stop_requested']) == expected
      for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@dataclasses.dataclass(frozen=True)
class _KeysTask(_PoisonedTask):
  """Records the keys of each batch its loss sees."""
  seen: list = dataclasses.field(default_factory=list, compare=False)

  def loss(self, model, batch):
    self.seen.append(sorted(batch))
    return super().loss(model, batch)


def test_the_task_never_sees_the_stop_request():
  model, task, tx = _Linear(), _KeysTask(), optax.sgd(0.1)
  batch = {'input': np.ones((4, 3), np.float32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  task.seen.clear()
  train_step = functools.partial(step.train_step, model=model, task=task, tx=tx,
                                 learning_rate_fn=optax.constant_schedule(0.1))
  # A trace is enough: the task records the keys of the batch it is traced with.
  _, metrics = jax.eval_shape(train_step, state, {**batch, 'stop_requested': np.ones(4, np.int32)})
  assert 'stop_requested' in metrics and task.seen == [['input']]


def test_eval_step_runs_the_model_in_inference_mode():
  """No dropout, and batch norm by the running statistics (not those of the batch): the sums
  equal the model applied with train=False."""
  model = MLP(features=(16, 3), dropout_rate=0.5, batch_norm=True)
  task, tx = _classification(), optax.sgd(0.1)
  rng = np.random.default_rng(6)
  batch = {'input': 3 + rng.normal(size=(8, 4)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32)}
  state = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch)
  state, _ = jax.jit(functools.partial(step.train_step, model=model, task=task, tx=tx,
                                       learning_rate_fn=optax.constant_schedule(0.1)))(state, batch)
  sums = step.eval_step(state, {**batch, 'mask': np.ones(8, np.int32)}, 0, model=model, task=task)
  logits = model.apply({'params': state.params, **state.model_state}, batch['input'], train=False)
  expected = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).sum()
  np.testing.assert_allclose(sums['loss'][0], expected, rtol=1e-5)
  assert float(sums['accuracy'][0]) == float((logits.argmax(-1) == batch['label']).sum())
