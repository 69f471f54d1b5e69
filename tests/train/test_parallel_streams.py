"""Under shard_map and pmap on 8 simulated devices every device draws its own dropout masks and
augmentations (the step key is folded with the device index), the named streams are independent
of each other, and every step draws afresh; in evaluation too. `jit` (one global draw) is the
control. The draws are read through `tests/train/stream_probe.py`'s metrics."""

import pytest

from tests.subprocess_util import run_python

_DRAW_ON_8_DEVICES = '''
import functools, json
import jax, numpy as np, ml_collections
from tests.train import stream_probe as probe
from train import optim, parallel, step
from train.state import init_train_state

DEVICES = 8
out = {'devices': jax.device_count()}
for mode in ('jit', 'shard_map', 'pmap'):
  par = parallel.Parallel(mode, parallel.make_mesh(DEVICES))
  model, task = probe.ProbeModel(), probe.ProbeTask()
  tx, lr = optim.make_optimizer(ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.1)), 10)
  batch = probe.batch(8 * DEVICES, DEVICES)
  init_fn = lambda rng: init_train_state(model, task, tx, rng, batch)
  rng = jax.random.PRNGKey(0)
  abstract = par.abstract_state(init_fn, rng)
  state = par.to_run_layout(par.init_state(init_fn, rng))
  train_step = par.compile_train_step(functools.partial(
      step.train_step, model=model, task=task, tx=tx, learning_rate_fn=lr), abstract)
  steps = []
  for _ in range(2):
    state, metrics = train_step(state, par.shard_batch(batch))
    steps.append({name: float(t) for name, (t, _) in jax.device_get(metrics['totals']).items()})
  eval_step = par.compile_eval_step(functools.partial(step.eval_step, model=model, task=task),
                                    abstract)
  eval_batch = {**batch, 'mask': np.ones(len(batch['input']), np.int32)}
  sums = jax.device_get(eval_step(par.to_canonical(state), eval_batch, np.int32(0)))
  out[mode] = {'train': steps, 'eval': {name: float(t) for name, (t, _) in sums.items()}}
print(json.dumps(out))
'''


@pytest.fixture(scope='module')
def draws():
  return run_python(_DRAW_ON_8_DEVICES, devices=8, fast_compile=True)


@pytest.mark.parametrize('mode', ['jit', 'shard_map', 'pmap'])
def test_every_device_draws_its_own_dropout_and_augmentation(draws, mode):
  assert draws['devices'] == 8
  for t, totals in enumerate(draws[mode]['train']):
    for device in range(1, 8):
      for stream in ('dropout', 'augment'):
        # Σ code over device 0's shard − Σ code over device `device`'s: 0 iff they drew alike.
        gap = totals[f'{stream}_contrast_{device}']
        assert abs(gap) > 1e-2, (mode, t, stream, device, gap)


@pytest.mark.parametrize('mode', ['jit', 'shard_map', 'pmap'])
def test_streams_differ_by_name_and_by_step(draws, mode):
  first, second = draws[mode]['train']
  # Mean |u_augment − u_dropout| over 32 draws per example is 32/3 for independent uniforms.
  assert first['stream_gap'] / 64 == pytest.approx(32 / 3, rel=0.1)
  for stream in ('dropout', 'augment'):
    assert abs(first[f'{stream}_code'] - second[f'{stream}_code']) > 1e-2, (mode, stream)


@pytest.mark.parametrize('mode', ['jit', 'shard_map', 'pmap'])
def test_every_device_draws_its_own_eval_stream(draws, mode):
  totals = draws[mode]['eval']
  for device in range(1, 8):
    assert abs(totals[f'augment_contrast_{device}']) > 1e-2, (mode, device)
  # In evaluation dropout keeps every unit: Σ code = 64 examples × Σ_k r_k (r = linspace(1, 2, 32)).
  assert totals['dropout_code'] == pytest.approx(64 * 48.0, rel=1e-6)
  assert abs(totals['augment_code'] - draws[mode]['train'][0]['augment_code']) > 1e-2
