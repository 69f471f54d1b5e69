"""Preparing a local data set says so in one line, cleans up after an interrupted
preparation, and happens once when two processes ask for it together."""

import os
import subprocess
import sys
import types

import ml_collections
import numpy as np

from data import inputs
from data import pipeline
from tests.subprocess_util import REPO_ROOT

_LOAD_DIGITS = '''
import sys
import data
for split in ('train', 'test'):
  print(split, len(data.load('digits', split, data_dir=sys.argv[1])))
'''


def _start(data_dir):
  """A process loading both splits of digits, its stdout and stderr piped (not a terminal)."""
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.Popen([sys.executable, '-c', _LOAD_DIGITS, str(data_dir)], env=env,
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process):
  out, err = process.communicate(timeout=300)
  assert process.returncode == 0, err[-3000:]
  assert out.splitlines() == ['train 1437', 'test 360']  # no TFDS banner on stdout
  return err


def test_preparation_is_one_line_without_escape_codes(tmp_path):
  version_dir = tmp_path / 'jaxlab_digits' / '1.0.0'
  err = _finish(_start(tmp_path))
  assert '\x1b' not in err and '\r' not in err
  lines = err.splitlines()
  assert len(lines) == 1, err
  prefix = f"preparing data set 'digits' in {version_dir} ... done (1,797 examples, "
  assert lines[0].startswith(prefix) and lines[0].endswith(' s)'), lines[0]
  assert _finish(_start(tmp_path)) == ''  # prepared: read silently


def test_stale_incomplete_folder_is_removed_and_nothing_else(tmp_path):
  folder = tmp_path / 'jaxlab_digits'
  stale = folder / 'incomplete.QX7Z2A_1.0.0'
  stale.mkdir(parents=True)
  (stale / 'jaxlab_digits-train.array_record-00000-of-00001').write_bytes(b'half written')
  other_version = folder / 'incomplete.QX7Z2A_0.9.0'  # not the version being prepared
  other_version.mkdir()
  prepared = folder / '0.9.0'
  prepared.mkdir()
  (prepared / 'dataset_info.json').write_text('{}')

  err = _finish(_start(tmp_path))
  assert len(err.splitlines()) == 1, err
  assert not stale.exists()
  assert other_version.is_dir() and (prepared / 'dataset_info.json').read_text() == '{}'
  assert sorted(p.name for p in folder.iterdir()) == ['.preparing.lock', '0.9.0', '1.0.0',
                                                      'incomplete.QX7Z2A_0.9.0']


def test_two_processes_prepare_once(tmp_path):
  processes = [_start(tmp_path), _start(tmp_path)]
  errs = [_finish(p) for p in processes]
  lines = [line for err in errs for line in err.splitlines()]
  assert len(lines) == 1 and lines[0].startswith("preparing data set 'digits' "), errs


def test_a_record_data_set_reaches_a_run_in_memory_with_its_classes_and_shapes(tmp_path,
                                                                             monkeypatch):
  # data.inputs on a stand-in for a prepared data set (nothing is prepared): the splits the
  # config names, held in memory, and what the model and task read from the records.
  sizes = {'train': 5, 'test': 3}
  def load(name, split, data_dir=None):
    assert (name, data_dir) == ('digits', str(tmp_path))
    # Label first: meta lists the features sorted.
    return [{'label': i % 10, 'image': np.full((8, 8, 1), i, np.uint8)}
            for i in range(sizes[split])]
  label = types.SimpleNamespace(num_classes=10)
  monkeypatch.setattr(inputs.datasets, 'load', load)
  monkeypatch.setattr(inputs.datasets, 'info', lambda name, data_dir=None: types.SimpleNamespace(
      features={'image': None, 'label': label}))
  config = ml_collections.ConfigDict({'name': 'digits', 'train_split': 'train',
                                      'eval_split': 'test', 'data_dir': str(tmp_path)})
  train, evaluation, meta = inputs.make_sources(config, str(tmp_path / 'work'))
  assert (len(train), len(evaluation)) == (5, 3)
  assert isinstance(train, pipeline.InMemorySource)
  assert isinstance(evaluation, pipeline.InMemorySource)
  assert meta == {'num_classes': 10, 'model_defaults': {'num_classes': 10},
                  'features': ('image', 'label'), 'shapes': {'image': (8, 8, 1), 'label': ()}}
