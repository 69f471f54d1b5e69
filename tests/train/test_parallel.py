"""Every parallel mode on 8 simulated devices equals a 1-device run with the same global batch:
a classifier with batch norm (also over 2 micro-batches, against 1 device's 2), a ResNet
(per-channel batch norm of convolutions, synchronised across devices), a token-weighted
language-model loss whose padding differs from device to device (the global token average, not
a mean of per-device means), and a state collection other than batch norm's (averaged over the
devices, as the 1-device run keeps it), with a stop request that one device's example carries."""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from tests.subprocess_util import run_python
from train import parallel

_TRAIN_10_STEPS = '''
import dataclasses, functools, json
import flax.linen as nn
import jax, jax.numpy as jnp, numpy as np, ml_collections
from data import tokenizers
from models.mlp import MLP
from models.vision import resnet
from train import optim, parallel, step, tasks
from train.state import init_train_state

class TokenModel(nn.Module):
  # With `moments`, a state collection other than batch norm's: a running mean of the ids.
  moments: bool = False

  @nn.compact
  def __call__(self, tokens_BxT, *, train=False):
    if self.moments:
      mean = self.variable('moments', 'mean', lambda: jnp.zeros(()))
      if self.is_mutable_collection('moments'):
        mean.value = 0.5 * mean.value + 0.5 * jnp.mean(tokens_BxT.astype(jnp.float32))
    return nn.Dense(7)(jnp.tanh(nn.Embed(7, 16)(tokens_BxT)))

def classification_batches(rng):
  for _ in range(10):
    yield {'input': rng.normal(size=(64, 16)).astype(np.float32),
           'label': rng.integers(0, 10, size=64).astype(np.int32)}

def image_batches(rng):
  for _ in range(10):
    yield {'input': rng.normal(size=(64, 8, 8, 2)).astype(np.float32),
           'label': rng.integers(0, 10, size=64).astype(np.int32)}

def lm_batches(rng):
  for _ in range(10):
    # Rows 0-7 (device 0 of 8) are nearly all padding, the others nearly full, so a mean of
    # per-device means would weight device 0's few tokens far more than the global average.
    lengths = np.where(np.arange(64) < 8, 1, rng.integers(8, 13, size=64))
    weights = (np.arange(12)[None, :] < lengths[:, None]).astype(np.float32)
    yield {'tokens': rng.integers(0, 7, size=(64, 13)).astype(np.int32), 'weights': weights}

def run(kind, mode, num_devices, grad_accum_steps=1):
  par = parallel.Parallel(mode, parallel.make_mesh(num_devices), fsdp_min_size=0)
  if kind == 'classification':
    # Batch norm checks that batch statistics are averaged across devices.
    model = MLP(features=(32, 32, 10), batch_norm=True, batch_norm_axis_name=par.axis_name)
    task = tasks.build('classification', {'num_classes': 10})
    batches = classification_batches(np.random.default_rng(0))
  elif kind.startswith('resnet'):
    # 'resnet_unsynced' leaves the axis name out: each device normalises by its own 8 examples.
    axis_name = None if kind == 'resnet_unsynced' else par.axis_name
    model = resnet.ResNet(num_classes=10, stage_sizes=(1, 1), stage_widths=(4, 8), stem_width=4,
                          small_input_stem=True, batch_norm_axis_name=axis_name)
    task = tasks.build('classification', {'num_classes': 10})
    batches = image_batches(np.random.default_rng(0))
  else:
    model = TokenModel(moments=kind == 'token_moments')
    meta = {'tokenizer': tokenizers.CharTokenizer(list('abcdefg')),
            'token_units': np.ones(7, np.float32), 'unit': 'char'}
    task = tasks.build('language_model', meta, sample_length=0)
    if kind == 'token_moments':  # a task that keeps the model's 'moments' in the train state
      class MomentsTask(type(task)):
        state_collections = ('moments',)
      task = MomentsTask(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})
    batches = lm_batches(np.random.default_rng(0))
  opt = ml_collections.ConfigDict(dict(name='adam', learning_rate=1e-2, grad_clip_norm=1.0,
                                       schedule='warmup_cosine', warmup_steps=3))
  if kind.startswith('resnet'):
    # Plain SGD: Adam's g/√v would blow float noise in near-zero gradients up to the step
    # size, hiding what is compared here (the batch statistics and their gradients).
    opt = ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.1, schedule='constant'))
  tx, lr = optim.make_optimizer(opt, 10)
  batches = list(batches)
  init_fn = lambda rng: init_train_state(model, task, tx, rng, batches[0])
  rng = jax.random.PRNGKey(0)
  abstract = par.abstract_state(init_fn, rng)
  state = par.to_run_layout(par.init_state(init_fn, rng))
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=task, tx=tx, learning_rate_fn=lr,
      grad_accum_steps=grad_accum_steps), abstract)
  losses, stops = [], []
  for i, batch in enumerate(batches):
    if kind == 'token_moments':  # on odd steps the last example (the last device's) asks to stop
      batch = {**batch, 'stop_requested': np.zeros(64, np.int32)}
      batch['stop_requested'][63] = i % 2
    state, metrics = train_step(state, par.shard_batch(batch))
    total, weight = metrics['totals']['loss']
    losses.append(float(total) / float(weight))
    if 'stop_requested' in metrics:
      stops.append(np.asarray(metrics['stop_requested']).ravel().tolist())
  canonical = par.to_canonical(state)
  shardings = {str(l.sharding.spec) for l in jax.tree.leaves(canonical.params)}
  return jax.device_get(canonical), losses, sorted(shardings), stops

out = {'devices': jax.device_count()}
references = {}
for kind in ('classification', 'resnet', 'resnet_unsynced', 'token_weighted', 'token_moments'):
  runs = [(mode, mode, 1) for mode in ('jit', 'fsdp', 'shard_map', 'pmap')]
  if kind == 'resnet_unsynced':
    runs = [('shard_map', 'shard_map', 1)]
  if kind == 'token_moments':
    runs = [(mode, mode, 1) for mode in ('shard_map', 'pmap')]
  if kind == 'token_weighted':  # without batch norm, 2 micro-batches are the whole batch
    runs.append(('shard_map_accumulate_2', 'shard_map', 2))
  if kind == 'classification':  # batch norm over each micro-batch: against 1 device's 2
    runs += [(f'{mode}_accumulate_2', mode, 2) for mode in ('shard_map', 'pmap')]
  for name, mode, accumulate in runs:
    reference_accumulate = 2 if kind == 'classification' and accumulate == 2 else 1
    if (kind, reference_accumulate) not in references:
      references[kind, reference_accumulate] = run(kind, 'jit', 1, reference_accumulate)[:2]
    reference, ref_losses = references[kind, reference_accumulate]
    state, losses, specs, stops = run(kind, mode, 8, accumulate)
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - b))),
                         state, reference)
    out[f'{kind}/{name}'] = {
        'max_state_diff': max(jax.tree.leaves(diffs)),
        'max_loss_diff': max(abs(a - b) for a, b in zip(losses, ref_losses)),
        'step': int(state.step), 'param_specs': specs, 'loss_decreased': losses[-1] < losses[0]}
    if kind == 'token_moments':
      out[f'{kind}/{name}']['means'] = [float(s.model_state['moments']['mean'])
                                        for s in (state, reference)]
      out[f'{kind}/{name}']['stops'] = stops
print(json.dumps(out))
'''

_MODES = ['jit', 'fsdp', 'shard_map', 'pmap', 'shard_map_accumulate_2']


@pytest.fixture(scope='module')
def results():
  # 21 compiled train steps: fast_compile halves the child's time (61 against 30 s).
  return run_python(_TRAIN_10_STEPS, devices=8, fast_compile=True)


@pytest.mark.parametrize('kind, mode', [('classification', m) for m in _MODES[:4]] +
                         [('classification', 'shard_map_accumulate_2'),
                          ('classification', 'pmap_accumulate_2')] +
                         [('resnet', m) for m in _MODES[:4]] +
                         [('token_weighted', m) for m in _MODES])
def test_mode_matches_single_device(results, kind, mode):
  assert results['devices'] == 8
  r = results[f'{kind}/{mode}']
  assert r['step'] == 10
  assert r['loss_decreased']
  # Params, optimiser state and running batch statistics after 10 steps.
  assert r['max_state_diff'] < 2e-5, r
  assert r['max_loss_diff'] < 2e-5, r


@pytest.mark.parametrize('mode', ['shard_map', 'pmap'])
def test_a_state_collection_other_than_batch_norm_is_averaged_over_the_devices(results, mode):
  # Each device's running mean of its own 8 rows, averaged over the 8 equal shards, is the
  # running mean of the whole batch: the 1-device run's, not any one device's.
  r = results[f'token_moments/{mode}']
  mean, reference_mean = r['means']
  assert reference_mean > 0
  assert mean == pytest.approx(reference_mean, abs=1e-6)
  assert r['max_state_diff'] < 2e-5, r


@pytest.mark.parametrize('mode', ['shard_map', 'pmap'])
def test_a_stop_request_on_one_device_is_the_step_s_on_every_device(results, mode):
  # The request comes with the last device's last example on odd steps only; every device
  # reports it (pmap one value per device), not only the device that holds it.
  stops = results[f'token_moments/{mode}']['stops']
  assert [set(values) for values in stops] == [{0}, {1}] * 5


def test_resnet_batch_norm_unsynchronised_across_devices_differs(results):
  # The same run with per-device statistics is another computation: the test above can fail.
  assert results['resnet_unsynced/shard_map']['max_state_diff'] > 1e-3


def test_fsdp_shards_params_and_jit_replicates(results):
  assert "P(None, 'data')" in results['classification/fsdp']['param_specs']
  assert results['classification/jit']['param_specs'] == ['P()']


def test_fsdp_splits_floating_point_leaves_and_keeps_the_step_and_key_whole():
  # On two devices a raw key's shape (2,) divides evenly: split, the host's unjitted
  # fold_in on it failed after the first evaluation.
  result = run_python('''
      import json
      import jax, jax.numpy as jnp
      from train import parallel
      par = parallel.Parallel('fsdp', parallel.make_mesh(2), fsdp_min_size=0)
      state = {'kernel': jax.ShapeDtypeStruct((4, 6), jnp.float32),
               'moment': jax.ShapeDtypeStruct((6,), jnp.bfloat16),
               'rng': jax.ShapeDtypeStruct((2,), jnp.uint32),
               'key': jax.eval_shape(lambda: jax.random.key(0)),
               'step': jax.ShapeDtypeStruct((), jnp.int32)}
      shardings = par.state_shardings(state)
      print(json.dumps({k: str(s.spec) for k, s in shardings.items()}))
      ''', devices=2)
  assert result == {'kernel': "P(None, 'data')", 'moment': "P('data',)", 'rng': 'P()', 'key': 'P()',
                    'step': 'P()'}


@pytest.mark.parametrize('value', [-1, 1.5, None, True])
def test_a_wrong_fsdp_min_size_is_named(value):
  with pytest.raises(ValueError, match=f'parallel.fsdp_min_size must be a non-negative integer '
                                       f'.*got {value!r}'):
    parallel.Parallel('fsdp', parallel.make_mesh(1), fsdp_min_size=value)


@pytest.mark.parametrize('shape, axis_size, min_size, spec', [
    ((4, 6), 2, 24, (None, 'data')),  # 24 elements, not fewer than 24: split, along the 6
    ((4, 6), 2, 25, ()),  # fewer elements than fsdp_min_size: replicated
    ((6, 8), 4, 0, (None, 'data')),  # only the 8 divides by 4
    ((12, 8), 4, 0, ('data',)),  # both do: the larger, 12
    ((3, 5), 2, 0, ()),  # none does
])
def test_fsdp_splits_the_largest_dimension_the_axis_divides(shape, axis_size, min_size, spec):
  assert tuple(parallel.fsdp_spec(shape, axis_size, min_size)) == spec


_SETUP_BATCH_NORM_RUNS = '''
import json, sys
from experiments.configs import digits_mlp
from train import loop

out = {}
for mode, devices in (('jit', 1), ('shard_map', 2), ('pmap', 2)):
  config = digits_mlp.get_config()
  config.data.data_dir = sys.argv[1]
  config.model.update({'features': (16, 10), 'batch_norm': True, 'dropout_rate': 0.0})
  config.optimizer.warmup_steps = 0
  config.parallel.update({'mode': mode, 'num_devices': devices})
  config.update({'num_train_steps': 3, 'global_batch_size': 16, 'eval_batch_size': 40,
                 'log_every_steps': 3, 'eval_every_steps': 3, 'checkpoint_every_steps': 3})
  try:
    out[mode] = loop.setup(config, f'{sys.argv[2]}/{mode}').train()
  except ValueError as e:
    out[mode] = str(e)
print(json.dumps(out))
'''


def test_a_batch_norm_model_sets_up_and_trains_under_shard_map_and_pmap(data_dir, tmp_path):
  # Setup's trace of the first steps must map them over the devices as the mode runs them:
  # batch norm averages its statistics over the device axis, unbound outside the mapping.
  source = _SETUP_BATCH_NORM_RUNS.replace(
      'import json, sys', f'import json, sys; sys.argv[1:] = [{data_dir!r}, {str(tmp_path)!r}]')
  out = run_python(source, devices=2, fast_compile=True)
  for mode in ('shard_map', 'pmap'):
    assert isinstance(out[mode], dict), out[mode]
    for name, value in out['jit'].items():
      assert abs(out[mode][name] - value) < 1e-5, (mode, name, out[mode][name], value)


# In-process checks on this process's own device(s): the mesh, the rules, the layouts.


def test_a_device_count_outside_the_available_devices_is_refused():
  available = jax.device_count()
  for num_devices in (0, available + 1):
    with pytest.raises(ValueError, match=f'^parallel.num_devices={num_devices} is not between 1 '
                                         f'and the {available} available devices.$'):
      parallel.make_mesh(num_devices)


@pytest.mark.parametrize('model_parallelism', [0, -1, 1.0])
def test_a_model_parallelism_not_a_positive_integer_is_refused(model_parallelism):
  with pytest.raises(ValueError, match=f'^parallel.model_parallelism={model_parallelism!r} must '
                                       'be a positive integer that divides the 1 devices.$'):
    parallel.make_mesh(1, model_parallelism)


def test_logical_axis_rules_as_lists_become_tuples_and_malformed_ones_are_refused():
  # A config read from JSON or flags holds lists.
  rules = [['batch', ['data', 'model']], ['heads', 'model'], ['mlp', None]]
  assert parallel.check_rules(rules) == (
      ('batch', ('data', 'model')), ('heads', 'model'), ('mlp', None))
  with pytest.raises(ValueError, match=r"holds \('heads', 'model', None\); each rule is a pair"):
    parallel.check_rules([('heads', 'model', None)])
  for axes, shown in (('tensor', "'tensor'"), (['data', 'tensor'], "('data', 'tensor')")):
    with pytest.raises(ValueError) as info:
      parallel.check_rules([('batch', axes)])
    assert str(info.value).startswith(
        f"parallel.logical_axis_rules maps 'batch' to {shown}; allowed")
  # No rules at all (every leaf replicated) stay none, not the default.
  assert parallel.Parallel('tensor', parallel.make_mesh(1, 1), logical_axis_rules=()).rules == ()


def test_megatron_rules_split_heads_and_mlp_over_model_and_the_batch_over_data():
  """Shoeybi et al. (2019): W^{Q,K,V} [D, N, H] and W_1 [D, F] split by output, W^O [N, H, D] and
  W_2 [F, D] by input; embeddings replicated; activations [B, T, D] split by example. Read on a
  1 × 1 mesh, whose specs name the axes as on any other."""
  par = parallel.Parallel('tensor', parallel.make_mesh(1, 1))
  swapped = jax.sharding.Mesh(par.mesh.devices, ('model', 'data'))
  with pytest.raises(ValueError, match=r"^parallel.mode='tensor' needs a mesh with axes \('data'"):
    parallel.Parallel('tensor', swapped)
  boxed = lambda shape, names: nn.LogicallyPartitioned(jax.ShapeDtypeStruct(shape, jnp.float32),
                                                       names=names)
  state = {'query': boxed((4, 2, 3), ('embed', 'heads', 'kv')),
           'out': boxed((2, 3, 4), ('heads', 'kv', 'embed')),
           'hidden': boxed((4, 6), ('embed', 'mlp')), 'output': boxed((6, 4), ('mlp', 'embed')),
           'embedding': boxed((5, 4), ('vocab', 'embed')),
           # Boxed with mesh axes themselves (nn.with_partitioning): taken as they are.
           'mesh_named': nn.Partitioned(jax.ShapeDtypeStruct((4, 6), jnp.float32),
                                        names=(None, 'model')),
           'step': jax.ShapeDtypeStruct((), jnp.int32)}
  specs = {name: s.spec for name, s in par.state_shardings(state).items()}
  assert specs == {'query': P(None, 'model', None), 'out': P('model', None, None),
                   'hidden': P(None, 'model'), 'output': P('model', None), 'embedding': P(),
                   'mesh_named': P(None, 'model'), 'step': P()}
  assert nn.get_logical_axis_rules() == ()
  with par.context():  # where the steps trace: the activations' constraints take the rules
    assert nn.logical_to_mesh_axes(('batch', 'length', 'embed')) == P('data', None, None)
    assert nn.logical_to_mesh_axes(('batch', 'length', 'heads', 'kv')) == P(
        'data', None, 'model', None)
  assert nn.get_logical_axis_rules() == ()


def test_the_tensor_train_step_traces_inside_the_mesh_and_rules():
  par = parallel.Parallel('tensor', parallel.make_mesh(1, 1))
  init_fn = lambda rng: {'w': jnp.zeros(3)}
  traced_rules = []
  def train_step(state, batch):
    traced_rules.append(nn.get_logical_axis_rules())
    return state, {'n': jnp.sum(batch['x'])}
  step = par.compile_train_step(train_step, par.abstract_state(init_fn, jax.random.PRNGKey(0)))
  _, metrics = step(par.init_state(init_fn, jax.random.PRNGKey(0)),
                    par.shard_batch({'x': np.ones(4, np.float32)}))
  assert traced_rules == [par.rules] and float(metrics['n']) == 4.0


@pytest.mark.parametrize('mode, axis_name, spec', [
    ('jit', None, ()), ('fsdp', None, (None, 'data')), ('shard_map', 'data', ()),
    ('pmap', 'data', ()), ('tensor', None, ())])
def test_which_modes_map_over_devices_and_which_split_the_state(mode, axis_name, spec):
  """Only the mapped modes bind the axis batch statistics average over; only 'fsdp' splits a
  parameter (of at least fsdp_min_size elements) without names, along its largest dimension."""
  par = parallel.Parallel(mode, parallel.make_mesh(1, 1 if mode == 'tensor' else None),
                          fsdp_min_size=24)
  assert par.axis_name == axis_name
  kernel = jax.ShapeDtypeStruct((4, 6), jnp.float32)
  small = jax.ShapeDtypeStruct((4, 5), jnp.float32)
  shardings = par.state_shardings({'kernel': kernel, 'small': small,
                                   'boxed': nn.Partitioned(kernel, names=(None, None))})
  assert tuple(shardings['kernel'].spec) == spec
  assert tuple(shardings['small'].spec) == ()  # 20 elements, fewer than fsdp_min_size
  assert isinstance(shardings['boxed'], jax.sharding.NamedSharding)  # unboxed in every mode
  # The default fsdp_min_size, 1024, keeps the 24 elements whole; 0 is allowed.
  assert tuple(parallel.Parallel(mode, par.mesh).state_shardings(kernel).spec) == ()
  assert parallel.Parallel(mode, par.mesh, fsdp_min_size=0).fsdp_min_size == 0


def test_batches_are_split_over_data_and_pmap_gets_one_row_per_local_device():
  batch = {'x': np.arange(12).reshape(6, 2)}
  for mode in ('jit', 'shard_map'):
    sharded = parallel.Parallel(mode, parallel.make_mesh(1)).shard_batch(batch)['x']
    assert sharded.sharding.spec == P('data') and np.array_equal(sharded, batch['x'])
  pmapped = parallel.Parallel('pmap', parallel.make_mesh(1)).shard_batch(batch)['x']
  assert np.array_equal(pmapped, batch['x'][None])  # [devices, examples per device, ...]
