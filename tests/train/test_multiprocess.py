"""Two local processes (gloo collectives on 127.0.0.1) train on a global batch split
across them and follow the loss curve of one process with the same global batch."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.subprocess_util import REPO_ROOT

_CONFIG = os.path.join(REPO_ROOT, 'experiments', 'configs', 'digits_mlp.py')
_STEPS = 40


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _command(workdir, data_dir, *extra):
  return [sys.executable, '-m', 'experiments.main', f'--config={_CONFIG}', f'--workdir={workdir}',
          f'--config.data.data_dir={data_dir}', f'--config.num_train_steps={_STEPS}',
          '--config.log_every_steps=1', '--config.eval_every_steps=20',
          '--config.checkpoint_every_steps=20', '--config.model.dropout_rate=0.0',
          '--config.optimizer.warmup_steps=5', *extra]


def _env():
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': REPO_ROOT,
          'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}


def _curve(workdir, split='train'):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  return {r['step']: r['loss'] for r in rows if r['split'] == split}


# Under pmap every process maps the step over every device of the run (not only its own), so
# the gradients are summed over both processes' examples.
@pytest.mark.parametrize('mode', ['jit', 'pmap'])
def test_two_processes_match_one(tmp_path, mode):
  data_dir = str(tmp_path / 'data')
  import data  # pylint: disable=g-import-not-at-top
  data.load('digits', 'train', data_dir=data_dir)  # prepare once, before both processes read it
  data.load('digits', 'test', data_dir=data_dir)

  single = str(tmp_path / 'single')
  mode_flag = f'--config.parallel.mode={mode}'
  subprocess.run(_command(single, data_dir, mode_flag), env=_env(), cwd=REPO_ROOT, check=True,
                 capture_output=True, timeout=600)

  multi = str(tmp_path / 'multi')
  address = f'127.0.0.1:{_free_port()}'
  # Process 0 joins through flags, process 1 through the environment.
  launches = [
      (_command(multi, data_dir, mode_flag, f'--coordinator_address={address}',
                '--num_processes=2', '--process_id=0'), _env()),
      (_command(multi, data_dir, mode_flag),
       {**_env(), 'JAX_COORDINATOR_ADDRESS': address, 'JAX_NUM_PROCESSES': '2',
        'JAX_PROCESS_ID': '1'}),
  ]
  processes = [subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for command, env in launches]
  outputs = [p.communicate(timeout=600)[0] for p in processes]
  for p, out in zip(processes, outputs):
    assert p.returncode == 0, out[-3000:]

  with open(os.path.join(multi, 'metrics.jsonl'), encoding='utf-8') as f:
    train_lines = [line for line in f if '"split": "train"' in line]
  assert len(train_lines) == _STEPS  # only process 0 writes: both joined one run
  one, two = _curve(single), _curve(multi)
  assert sorted(one) == sorted(two) == list(range(1, _STEPS + 1))
  np.testing.assert_allclose([two[s] for s in one], [one[s] for s in one], rtol=1e-4, atol=1e-5)
  assert one[_STEPS] < 0.5 * one[1]  # the curve is a real training curve
  np.testing.assert_allclose(_curve(multi, 'eval')[_STEPS], _curve(single, 'eval')[_STEPS],
                             rtol=1e-4)


def test_a_model_group_spanning_two_processes_is_refused_in_one_sentence(tmp_path):
  # Each process reads its own examples, so 'tensor' on a 1 x 4 mesh over two processes of two
  # devices would feed one model group two different halves of the batch (each process ran its
  # own model and they disagreed).
  address = f'127.0.0.1:{_free_port()}'
  env = {**_env(), 'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  processes = [subprocess.Popen(
      _command(str(tmp_path / 'w'), str(tmp_path / 'data'), '--config.parallel.mode=tensor',
               '--config.parallel.model_parallelism=4', f'--coordinator_address={address}',
               '--num_processes=2', f'--process_id={i}'),
      env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  for p in processes:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        'error: parallel.model_parallelism=4 puts the devices of several processes in one model '
        'group; in a multi-process run it must divide the 2 devices of each process.')
  assert not (tmp_path / 'w').exists()
