"""The pure train/eval steps: per-step randomness, determinism, masking, donation."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from models.mlp import MLP
from train import optim, parallel, step, tasks
from train.state import init_train_state


def _setup(dropout_rate=0.5):
  model = MLP(features=(16, 3), dropout_rate=dropout_rate)
  tx = optax.sgd(0.1)
  state = init_train_state(model, tx, jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  fn = functools.partial(step.train_step, model=model, task=tasks.classification, tx=tx,
                         learning_rate_fn=optax.constant_schedule(0.1))
  rng = np.random.default_rng(0)
  batch = {'input': rng.normal(size=(8, 4)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32)}
  return model, state, jax.jit(fn), batch


def test_same_state_and_batch_give_identical_steps():
  _, state, train_step, batch = _setup()
  a, ma = train_step(state, batch)
  b, mb = train_step(state, batch)
  for x, y in zip(jax.tree.leaves((a, ma)), jax.tree.leaves((b, mb))):
    np.testing.assert_array_equal(x, y)


def test_dropout_key_is_fold_in_of_step():
  """Steps at different `step` values draw different masks; the key is fold_in(rng, step)."""
  _, state, train_step, batch = _setup()
  _, m0 = train_step(state, batch)
  _, m5 = train_step(state.replace(step=jnp.int32(5)), batch)
  assert float(m0['loss']) != float(m5['loss'])
  model = MLP(features=(16, 3), dropout_rate=0.5)
  logits = model.apply({'params': state.params}, batch['input'], train=True,
                       rngs={'dropout': jax.random.fold_in(state.rng, 5)})
  expected = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()
  np.testing.assert_allclose(m5['loss'], expected, rtol=1e-6)


def test_eval_step_weights_by_mask():
  model, state, _, batch = _setup(dropout_rate=0.0)
  mask = np.array([1, 1, 1, 0, 1, 0, 0, 1], np.int32)
  sums = step.eval_step(state, {**batch, 'mask': mask}, model=model, task=tasks.classification)
  logits = model.apply({'params': state.params}, batch['input'][mask == 1])
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'][mask == 1])
  assert float(sums['count']) == 5
  np.testing.assert_allclose(sums['loss'], losses.sum(), rtol=1e-5)
  correct = (logits.argmax(-1) == batch['label'][mask == 1]).sum()
  assert float(sums['accuracy']) == float(correct)


def test_compiled_step_donates_the_state():
  model = MLP(features=(16, 3))
  config = ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.1))
  tx, lr = optim.make_optimizer(config, 10)
  par = parallel.Parallel('jit', parallel.make_mesh(1))
  init_fn = lambda rng: init_train_state(model, tx, rng, jnp.zeros((1, 4)))
  abstract = par.abstract_state(init_fn, jax.random.PRNGKey(0))
  state = par.init_state(init_fn, jax.random.PRNGKey(0))
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=tasks.classification, tx=tx, learning_rate_fn=lr), abstract)
  batch = {'input': np.ones((8, 4), np.float32), 'label': np.zeros(8, np.int32)}
  new_state, _ = train_step(state, par.shard_batch(batch))
  assert all(x.is_deleted() for x in jax.tree.leaves(state.params))
  assert int(new_state.step) == 1


def test_augmentation_runs_in_the_step_with_the_step_key():
  """The step augments with fold_in(fold_in(rng, step), 1); mixup's soft labels reach the loss."""
  from train import loop  # pylint: disable=g-import-not-at-top
  model = MLP(features=(16, 3))
  tx = optax.sgd(0.1)
  state = init_train_state(model, tx, jax.random.PRNGKey(0), jnp.zeros((1, 4, 4, 1)))
  state = state.replace(step=jnp.int32(7))
  augment = loop.make_augment(({'name': 'horizontal_flip', 'p': 1.0}, {'name': 'mixup'}), 3)
  rng = np.random.default_rng(1)
  batch = {'input': rng.uniform(size=(8, 4, 4, 1)).astype(np.float32),
           'label': rng.integers(0, 3, size=8).astype(np.int32)}
  kwargs = dict(model=model, task=tasks.classification, tx=tx,
                learning_rate_fn=optax.constant_schedule(0.1))
  _, with_augment = jax.jit(functools.partial(step.train_step, augment=augment, **kwargs))(state, batch)
  key = jax.random.fold_in(jax.random.fold_in(state.rng, 7), 1)
  augmented = augment(key, batch)
  assert augmented['label'].shape == (8, 3)
  np.testing.assert_allclose(augmented['label'].sum(-1), 1.0, rtol=1e-6)
  assert not np.allclose(augmented['input'], batch['input'])
  _, by_hand = jax.jit(functools.partial(step.train_step, **kwargs))(state, augmented)
  np.testing.assert_allclose(with_augment['loss'], by_hand['loss'], rtol=1e-6)
  logits = model.apply({'params': state.params}, augmented['input'])
  soft_ce = -(augmented['label'] * jax.nn.log_softmax(logits)).sum(-1).mean()
  np.testing.assert_allclose(by_hand['loss'], soft_ce, rtol=1e-5)
