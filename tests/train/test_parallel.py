"""Every parallel mode on 8 simulated devices equals a 1-device run with the same global batch."""

import pytest

from tests.subprocess_util import run_python

_TRAIN_10_STEPS = '''
import functools, json
import jax, jax.numpy as jnp, numpy as np, ml_collections
from models.mlp import MLP
from train import optim, parallel, step, tasks
from train.state import init_train_state

def run(mode, num_devices):
  par = parallel.Parallel(mode, parallel.make_mesh(num_devices), fsdp_min_size=0)
  # Batch norm checks that batch statistics are averaged across devices.
  model = MLP(features=(32, 32, 10), batch_norm=True, batch_norm_axis_name=par.axis_name)
  opt = ml_collections.ConfigDict(dict(name='adam', learning_rate=1e-2, grad_clip_norm=1.0,
                                       schedule='warmup_cosine', warmup_steps=3))
  tx, lr = optim.make_optimizer(opt, 10)
  init_fn = lambda rng: init_train_state(model, tx, rng, jnp.zeros((1, 16)))
  rng = jax.random.PRNGKey(0)
  abstract = par.abstract_state(init_fn, rng)
  state = par.to_run_layout(par.init_state(init_fn, rng))
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=tasks.classification, tx=tx, learning_rate_fn=lr), abstract)
  data_rng = np.random.default_rng(0)
  losses = []
  for _ in range(10):
    batch = {'input': data_rng.normal(size=(64, 16)).astype(np.float32),
             'label': data_rng.integers(0, 10, size=64).astype(np.int32)}
    state, metrics = train_step(state, par.shard_batch(batch))
    losses.append(float(metrics['loss']))
  canonical = par.to_canonical(state)
  shardings = {str(l.sharding.spec) for l in jax.tree.leaves(canonical.params)}
  return jax.device_get(canonical), losses, sorted(shardings)

reference, ref_losses, _ = run('jit', 1)
out = {'devices': jax.device_count()}
for mode in ('jit', 'fsdp', 'shard_map', 'pmap'):
  state, losses, specs = run(mode, 8)
  diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - b))),
                       state, reference)
  out[mode] = {'max_state_diff': max(jax.tree.leaves(diffs)),
               'max_loss_diff': max(abs(a - b) for a, b in zip(losses, ref_losses)),
               'step': int(state.step), 'param_specs': specs,
               'loss_decreased': losses[-1] < losses[0]}
print(json.dumps(out))
'''


@pytest.fixture(scope='module')
def results():
  return run_python(_TRAIN_10_STEPS, devices=8)


@pytest.mark.parametrize('mode', ['jit', 'fsdp', 'shard_map', 'pmap'])
def test_mode_matches_single_device(results, mode):
  assert results['devices'] == 8
  r = results[mode]
  assert r['step'] == 10
  assert r['loss_decreased']
  # Params, optimiser state and running batch statistics after 10 steps.
  assert r['max_state_diff'] < 2e-5, r
  assert r['max_loss_diff'] < 2e-5, r


def test_fsdp_shards_params_and_jit_replicates(results):
  assert "P(None, 'data')" in results['fsdp']['param_specs']
  assert results['jit']['param_specs'] == ['P()']
