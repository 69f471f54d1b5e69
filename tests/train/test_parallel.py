"""Every parallel mode on 8 simulated devices equals a 1-device run with the same global batch:
a classifier with batch norm (also over 2 micro-batches, against 1 device's 2), a ResNet
(per-channel batch norm of convolutions, synchronised across devices), and a token-weighted
language-model loss whose padding differs from device to device (the global token average, not
a mean of per-device means)."""

import pytest

from tests.subprocess_util import run_python

_TRAIN_10_STEPS = '''
import functools, json
import flax.linen as nn
import jax, jax.numpy as jnp, numpy as np, ml_collections
from data import tokenizers
from models.mlp import MLP
from models.vision import resnet
from train import optim, parallel, step, tasks
from train.state import init_train_state

class TokenModel(nn.Module):
  @nn.compact
  def __call__(self, tokens_BxT, *, train=False):
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
    model = TokenModel()
    meta = {'tokenizer': tokenizers.CharTokenizer(list('abcdefg')),
            'token_units': np.ones(7, np.float32), 'unit': 'char'}
    task = tasks.build('language_model', meta, sample_length=0)
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
  losses = []
  for batch in batches:
    state, metrics = train_step(state, par.shard_batch(batch))
    total, weight = metrics['totals']['loss']
    losses.append(float(total) / float(weight))
  canonical = par.to_canonical(state)
  shardings = {str(l.sharding.spec) for l in jax.tree.leaves(canonical.params)}
  return jax.device_get(canonical), losses, sorted(shardings)

out = {'devices': jax.device_count()}
references = {}
for kind in ('classification', 'resnet', 'resnet_unsynced', 'token_weighted'):
  runs = [(mode, mode, 1) for mode in ('jit', 'fsdp', 'shard_map', 'pmap')]
  if kind == 'resnet_unsynced':
    runs = [('shard_map', 'shard_map', 1)]
  if kind == 'token_weighted':  # without batch norm, 2 micro-batches are the whole batch
    runs.append(('shard_map_accumulate_2', 'shard_map', 2))
  if kind == 'classification':  # batch norm over each micro-batch: against 1 device's 2
    runs += [(f'{mode}_accumulate_2', mode, 2) for mode in ('shard_map', 'pmap')]
  for name, mode, accumulate in runs:
    reference_accumulate = 2 if kind == 'classification' and accumulate == 2 else 1
    if (kind, reference_accumulate) not in references:
      references[kind, reference_accumulate] = run(kind, 'jit', 1, reference_accumulate)[:2]
    reference, ref_losses = references[kind, reference_accumulate]
    state, losses, specs = run(kind, mode, 8, accumulate)
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - b))),
                         state, reference)
    out[f'{kind}/{name}'] = {
        'max_state_diff': max(jax.tree.leaves(diffs)),
        'max_loss_diff': max(abs(a - b) for a, b in zip(losses, ref_losses)),
        'step': int(state.step), 'param_specs': specs, 'loss_decreased': losses[-1] < losses[0]}
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
  from train import parallel  # pylint: disable=g-import-not-at-top
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
  from train import parallel  # pylint: disable=g-import-not-at-top
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
