"""A full disk or an unwritable checkpoint folder stops the run with one sentence and leaves
the earlier checkpoints intact (a small tmpfs where mounting is allowed, else skipped)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.subprocess_util import REPO_ROOT
from train import checkpoint

_CONFIG = os.path.join(REPO_ROOT, 'experiments', 'configs', 'digits_mlp.py')


def _command(workdir, data_dir):
  return [sys.executable, '-m', 'experiments.main', f'--config={_CONFIG}', f'--workdir={workdir}',
          f'--config.data.data_dir={data_dir}', '--config.num_train_steps=2000',
          '--config.checkpoint_every_steps=100', '--config.checkpoints_to_keep=20',
          '--config.eval_every_steps=1000000', '--config.log_every_steps=100']


def _env():
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': REPO_ROOT}


@pytest.fixture
def small_disk(tmp_path):
  """A 4 MB tmpfs: room for a few digits checkpoints (about 1 MB each), not twenty."""
  mount_point = tmp_path / 'small'
  mount_point.mkdir()
  result = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4M', 'tmpfs', str(mount_point)],
                          capture_output=True, text=True)
  if result.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here: {result.stderr.strip()}')
  yield str(mount_point)
  subprocess.run(['umount', '-l', str(mount_point)], check=False)


def _steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())


def test_disk_full_stops_in_one_sentence_and_keeps_earlier_checkpoints(small_disk, tmp_path):
  data_dir = str(tmp_path / 'data')
  workdir = os.path.join(small_disk, 'run')
  result = subprocess.run(_command(workdir, data_dir), capture_output=True, text=True,
                          cwd=REPO_ROOT, env=_env(), timeout=600)
  assert result.returncode == 1, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: Writing a checkpoint in '{workdir}/checkpoints' failed (No space "
                         'left on device); the checkpoints written before are intact'), last
  assert 'Traceback' not in result.stderr and len(result.stderr.strip().splitlines()) < 30
  steps = _steps(workdir)
  assert steps and steps[-1] < 2000
  for step in steps:  # every checkpoint left behind is whole and verifies
    state = checkpoint.restore_arrays(workdir, step)
    assert int(state['step']) == step and np.isfinite(state['params']['Dense_0']['kernel']).all()


def test_read_only_checkpoint_folder_stops_in_one_sentence(tmp_path):
  """`checkpoints/` on a read-only file system (which even root cannot write)."""
  data_dir = str(tmp_path / 'data')
  workdir = tmp_path / 'run'
  (workdir / 'checkpoints').mkdir(parents=True)
  result = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1M', 'tmpfs',
                           str(workdir / 'checkpoints')], capture_output=True, text=True)
  if result.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here: {result.stderr.strip()}')
  try:
    result = subprocess.run(_command(str(workdir), data_dir), capture_output=True, text=True,
                            cwd=REPO_ROOT, env=_env(), timeout=600)
  finally:
    subprocess.run(['umount', '-l', str(workdir / 'checkpoints')], check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: Writing a checkpoint in ') and 'Read-only file system' in last, last
  assert 'Traceback' not in result.stderr
