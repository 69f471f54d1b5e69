"""A run killed with SIGKILL and restarted ends bit-identical to an uninterrupted run;
a checkpoint written on 8 devices restores on 1."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np

from tests.subprocess_util import REPO_ROOT, run_python
from train import checkpoint

_CONFIG = os.path.join(REPO_ROOT, 'experiments', 'configs', 'digits_mlp.py')


def _command(workdir, data_dir, steps):
  return [sys.executable, '-m', 'experiments.main', f'--config={_CONFIG}', f'--workdir={workdir}',
          f'--config.data.data_dir={data_dir}', f'--config.num_train_steps={steps}',
          '--config.checkpoint_every_steps=100', '--config.eval_every_steps=1000000',
          '--config.log_every_steps=100', '--config.optimizer.warmup_steps=10']


def _env():
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': REPO_ROOT}


def _checkpoint_steps(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def test_sigkill_and_restart_is_bit_identical(tmp_path, data_dir):
  steps = 1000
  straight, killed = str(tmp_path / 'straight'), str(tmp_path / 'killed')
  subprocess.run(_command(straight, data_dir, steps), env=_env(), cwd=REPO_ROOT, check=True,
                 capture_output=True, timeout=600)
  assert _checkpoint_steps(straight) == [800, 900, 1000]  # every 100 steps, the last 3 kept

  process = subprocess.Popen(_command(killed, data_dir, steps), env=_env(), cwd=REPO_ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while not any(s >= 400 for s in _checkpoint_steps(killed)):
    assert process.poll() is None, 'the run ended before it could be killed'
    assert time.time() < deadline
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert process.returncode == -signal.SIGKILL
  steps_at_kill = _checkpoint_steps(killed)
  assert max(steps_at_kill) < steps, steps_at_kill

  with open(os.path.join(killed, 'metrics.jsonl'), encoding='utf-8') as f:
    before = [line for line in f if '"split": "train"' in line]
  rerun = subprocess.run(_command(killed, data_dir, steps), env=_env(), cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True, timeout=600)
  assert f'resuming from step {max(steps_at_kill)} of {steps}' in rerun.stderr, rerun.stderr[-2000:]
  a, b = checkpoint.restore_arrays(straight), checkpoint.restore_arrays(killed)
  assert int(a['step']) == int(b['step']) == steps
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)  # bit-identical, not merely close
  # The restarted run resumed rather than starting over: the killed session's records up to
  # its last checkpoint are kept as they were (a run from step 0 would have rewritten them, with
  # other wall times), the records it wrote after that checkpoint are dropped, and every step
  # is logged once.
  with open(os.path.join(killed, 'metrics.jsonl'), encoding='utf-8') as f:
    logged = [line for line in f if '"split": "train"' in line]
  kept = [line for line in before if json.loads(line)['step'] <= max(steps_at_kill)]
  assert kept and logged[:len(kept)] == kept
  assert [json.loads(line)['step'] for line in logged] == list(range(100, steps + 1, 100))


_TRAIN_ON_8_DEVICES = '''
import json, ml_collections
import jax, numpy as np
from experiments.configs import digits_mlp
from train import loop
config = digits_mlp.get_config()
config.data.data_dir = {data_dir!r}
config.parallel.mode = 'fsdp'
config.parallel.fsdp_min_size = 0
config.num_train_steps = 20
config.optimizer.warmup_steps = 5
config.eval_every_steps = 20
run = loop.setup(config, {workdir!r})
run.train()
state, _ = run.checkpointer.restore(run.parallel.abstract_state(run.init_fn, run.rng))
specs = sorted({{str(x.sharding.spec) for x in jax.tree.leaves(state.params)}})
np.savez({dump!r}, *[np.asarray(x) for x in jax.tree.leaves(state)])
print(json.dumps({{'devices': jax.device_count(), 'specs': specs}}))
'''

_RESTORE_ON_1_DEVICE = '''
import json
import jax, numpy as np
from experiments.configs import digits_mlp
from train import loop
config = digits_mlp.get_config()
config.data.data_dir = {data_dir!r}
config.num_train_steps = 20
config.optimizer.warmup_steps = 5
run = loop.setup(config, {workdir!r})
state, data_state = run.checkpointer.restore(run.parallel.abstract_state(run.init_fn, run.rng))
saved = np.load({dump!r})
leaves = jax.tree.leaves(state)
equal = all(np.array_equal(np.asarray(x), saved[f'arr_{{i}}']) for i, x in enumerate(leaves))
print(json.dumps({{'devices': jax.device_count(), 'equal': equal, 'n': len(leaves),
                  'step': int(state.step), 'iterator': data_state['iterator']}}))
'''


def test_checkpoint_from_8_devices_restores_on_1(tmp_path, data_dir):
  args = dict(data_dir=data_dir, workdir=str(tmp_path / 'run'), dump=str(tmp_path / 'state.npz'))
  saved = run_python(_TRAIN_ON_8_DEVICES.format(**args), devices=8)
  assert saved['devices'] == 8
  assert "P(None, 'data')" in saved['specs']  # the checkpoint really was sharded
  restored = run_python(_RESTORE_ON_1_DEVICE.format(**args), devices=1)
  assert restored['devices'] == 1
  assert restored['equal'] and restored['n'] > 5 and restored['step'] == 20
  assert restored['iterator'] == {'next_index': 20}
