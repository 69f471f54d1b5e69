"""The train state: logical-axis boxes that mirror the parameters' onto their average and
optimiser moments, and the evaluation view of a checkpoint."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from train import tasks
from train.state import from_saved_arrays, init_train_state, init_variables


class _HalfNamed(nn.Module):
  """x @ kernel + bias, only the kernel declared with logical axis names."""

  @nn.compact
  def __call__(self, x_BxD, *, train=False):
    kernel_DxK = self.param('kernel', nn.with_logical_partitioning(
        nn.initializers.normal(1.0), ('embed', 'mlp')), (x_BxD.shape[-1], 3))
    bias_K = self.param('bias', nn.initializers.normal(1.0), (3,))
    return x_BxD @ kernel_DxK + bias_K


class _WithState(nn.Module):
  """A dense layer with a logically named batch statistic, a decoding cache and a sown output."""

  @nn.compact
  def __call__(self, x_BxD, *, train=False):
    mean_K = self.variable('batch_stats', 'mean', nn.with_logical_partitioning(
        jnp.ones, ('mlp',)), (3,))
    self.variable('cache', 'index', jnp.zeros, (), jnp.int32)
    y_BxK = nn.Dense(3)(x_BxD) - mean_K.value
    self.sow('intermediates', 'y', y_BxK)
    return y_BxK


def _is_box(x):
  return isinstance(x, nn.Partitioned)


def _names(tree):
  """The logical names of each leaf of `tree` (bias before kernel), None for a plain array."""
  return [x.names if _is_box(x) else None for x in jax.tree.leaves(tree, is_leaf=_is_box)]


def test_logical_axes_box_the_parameters_their_average_and_the_moments_that_mirror_them():
  model = _HalfNamed()
  task = tasks.build('classification', {'num_classes': 3}, input_key='x')
  # Clipping keeps no state, Adam its count (a scalar) and two moments shaped like the
  # parameters.
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1))
  batch = {'input': np.ones((2, 4), np.float32), 'label': np.zeros(2, np.int32)}
  plain = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch, ema=True)
  boxed = init_train_state(model, task, tx, jax.random.PRNGKey(0), batch, ema=True,
                           logical_axes=True)
  named = [None, ('embed', 'mlp')]
  assert _names(plain.params) == [None, None]
  adam = boxed.opt_state[1][0]
  for tree in (boxed.params, boxed.ema_params, adam.mu, adam.nu):
    assert _names(tree) == named
  assert not _is_box(adam.count)
  # The boxes hold the same values as the plain state.
  unboxed = nn.unbox(boxed)
  assert jax.tree.structure(unboxed) == jax.tree.structure(plain)
  jax.tree.map(np.testing.assert_array_equal, unboxed, plain)


def test_only_the_moments_shaped_like_the_parameters_are_boxed():
  # Adafactor's factored moments v_row, v_col have the parameters' tree but other shapes:
  # boxing them with the parameters' names would shard them wrongly.
  task = tasks.build('classification', {'num_classes': 3}, input_key='x')
  batch = {'input': np.ones((2, 4), np.float32), 'label': np.zeros(2, np.int32)}
  boxed = init_train_state(_HalfNamed(), task, optax.adafactor(0.1), jax.random.PRNGKey(0), batch,
                           logical_axes=True)
  factored = boxed.opt_state[0]
  assert _names(factored.v) == [None, ('embed', 'mlp')]
  assert _names(factored.v_row) == _names(factored.v_col) == [None, None]


def test_the_state_starts_at_step_0_keeping_only_the_state_collections():
  task = tasks.build('classification', {'num_classes': 3}, input_key='x')
  batch = {'input': np.ones((2, 4), np.float32), 'label': np.zeros(2, np.int32)}
  tx = optax.adam(0.1)
  plain = init_train_state(_WithState(), task, tx, jax.random.PRNGKey(0), batch, ema=True)
  # An int32 step of 0 (a float or 64-bit step would not restore from the checkpoints).
  assert plain.step.dtype == jnp.int32 and plain.step.shape == () and int(plain.step) == 0
  # Per-call collections ('cache', 'intermediates') never enter the train state.
  assert list(plain.model_state) == ['batch_stats'] and list(plain.model_state['batch_stats']) == [
      'mean']
  np.testing.assert_array_equal(plain.model_state['batch_stats']['mean'], np.ones(3))
  boxed = init_train_state(_WithState(), task, tx, jax.random.PRNGKey(0), batch, ema=True,
                           logical_axes=True)
  assert _names(boxed.model_state) == [('mlp',)]
  # The step donates the state's buffers: the average must not share the parameters' ones.
  jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)(plain)


def test_init_variables_unboxes_unless_asked_to_keep_the_boxes():
  model = _HalfNamed()
  task = tasks.build('classification', {'num_classes': 3}, input_key='x')
  batch = {'input': np.ones((2, 4), np.float32), 'label': np.zeros(2, np.int32)}
  params, model_state = init_variables(model, task, jax.random.PRNGKey(0), batch)
  assert _names(params) == [None, None] and model_state == {}
  boxed, _ = init_variables(model, task, jax.random.PRNGKey(0), batch, unbox=False)
  assert _names(boxed) == [None, ('embed', 'mlp')]
  jax.tree.map(np.testing.assert_array_equal, nn.unbox(boxed), params)


def test_the_evaluation_view_of_a_checkpoint_reads_its_average():
  params = {'w': np.ones(3, np.float32)}
  ema = {'w': np.full(3, 0.5, np.float32)}
  saved = {'step': np.int32(7), 'params': params, 'ema_params': ema,
           'rng': np.asarray(jax.random.PRNGKey(1))}
  state = from_saved_arrays(saved)
  # A checkpoint of a model without state collections may hold none.
  assert state.model_state == {} and state.opt_state is None and int(state.step) == 7
  np.testing.assert_array_equal(state.eval_params['w'], ema['w'])
  np.testing.assert_array_equal(state.params['w'], params['w'])
  assert isinstance(state.params['w'], jax.Array)
  without_ema = from_saved_arrays({**saved, 'ema_params': None, 'model_state': {}})
  np.testing.assert_array_equal(without_ema.eval_params['w'], params['w'])
