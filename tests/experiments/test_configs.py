"""Every experiment config names a command that parses, and passes `loop.setup`.

For each file of `experiments/configs/` (but `default.py`), the module
docstring's `python -m experiments.main --config=experiments/configs/<file>`
command is parsed with the entry point's flags, overrides included, and the
resulting config is set up (checked, built and its first train and eval step
traced, not compiled) on a temporary
work directory with its data set prepared in a temporary data directory.

Data sets read from local files (Fashion-MNIST, Tiny Shakespeare) use the folder
their builder would use ($FASHION_MNIST_DIR, ...), else the repository's
`shared/data` copy ($JAXLAB_SHARED_DATA, else `shared/data` beside the
repository); their configs skip when neither holds the files. Of Fashion-MNIST's
IDX files only the first records are copied and prepared, which keeps the
features (shapes, types, classes) and takes a second instead of preparing 70,000.
"""

import ast
import glob
import gzip
import os
import re
import shlex
import struct

from absl import flags
from ml_collections import config_flags
import numpy as np
import pytest

from data import datasets
from data import idx
from data import pipeline
from data.builders import sources
from tests.subprocess_util import REPO_ROOT
from train import loop

CONFIG_DIR = os.path.join(REPO_ROOT, 'experiments', 'configs')
NOT_EXPERIMENTS = ('__init__.py', 'default.py')
# Folders of the repository's local copies, by data set name.
SHARED_FOLDERS = {'fashion_mnist': 'fashion-mnist', 'tiny_shakespeare': 'tinyshakespeare',
                  'shakespeare_case': 'tinyshakespeare'}
# Records of each Fashion-MNIST IDX file copied for setup.
FASHION_MNIST_RECORDS = 16
_COMMAND = re.compile(r'python -m experiments\.main (?:[^\n]*\\\n)*[^\n]*')

CONFIG_FILES = sorted(os.path.basename(path) for path in glob.glob(os.path.join(CONFIG_DIR, '*.py'))
                      if os.path.basename(path) not in NOT_EXPERIMENTS)


def _module_docstring(filename: str) -> str:
  with open(os.path.join(CONFIG_DIR, filename), encoding='utf-8') as f:
    return ast.get_docstring(ast.parse(f.read())) or ''


def _commands(filename: str) -> list[list[str]]:
  """The `python -m experiments.main` commands of the docstring, as argument lists."""
  return [shlex.split(match.replace('\\\n', ' ')) for match in _COMMAND.findall(
      _module_docstring(filename))]


def _parse(argv: list[str]):
  """Parses `argv` with the entry point's --config and --workdir; returns (config, workdir)."""
  argv = ['experiments.main'] + argv
  flag_values = flags.FlagValues()
  # The --config.KEY overrides are defined from the arguments, as sys.argv would be.
  config_flag = config_flags.DEFINE_config_file('config', None, 'Experiment config file.',
                                                flag_values=flag_values, lock_config=True,
                                                sys_argv=argv)
  workdir_flag = flags.DEFINE_string('workdir', None, 'Work directory.', flag_values=flag_values)
  flag_values(argv)
  return config_flag.value, workdir_flag.value


def _own_command(filename: str) -> list[str]:
  own = f'--config=experiments/configs/{filename}'
  for command in _commands(filename):
    if own in command:
      return command
  pytest.fail(f'the docstring of {filename} has no `python -m experiments.main {own} ...` command')


def _find_local_files(name: str) -> str:
  """The folder of `name`'s local files, or skips the test."""
  builder_cls = datasets.LOCAL_BUILDERS[name]
  try:
    return sources.find_dir(name, builder_cls, None, '')
  except FileNotFoundError:
    pass
  root = os.environ.get('JAXLAB_SHARED_DATA') or os.path.join(REPO_ROOT, '..', 'shared', 'data')
  folder = os.path.join(root, SHARED_FOLDERS.get(name, name))
  if all(os.path.isfile(os.path.join(folder, f)) for f in builder_cls.SOURCE_FILES):
    return folder
  pytest.skip(f'no local files of {name} (set ${builder_cls.SOURCE_ENV_VAR} to the folder of '
              f'{", ".join(builder_cls.SOURCE_FILES)})')


def _copy_first_records(source_dir: str, target_dir: str, filenames, count: int) -> None:
  """Writes the first `count` records of each uint8 IDX file as a gzip IDX file."""
  for filename in filenames:
    array = idx.read_idx(os.path.join(source_dir, filename))[:count]
    assert array.dtype == 'uint8', (filename, array.dtype)
    header = struct.pack('>HBB', 0, 0x08, array.ndim) + struct.pack(f'>{array.ndim}I', *array.shape)
    with gzip.open(os.path.join(target_dir, filename), 'wb') as f:
      f.write(header + array.tobytes())


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """One data directory per test session, so each data set is prepared once."""
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='session')
def local_source_dir(tmp_path_factory):
  """name -> the folder of its local files (a short copy for Fashion-MNIST), or a skip."""
  folders = {}

  def get(name: str) -> str:
    if name not in folders:
      folder = _find_local_files(name)
      if name == 'fashion_mnist':
        copy = str(tmp_path_factory.mktemp('fashion_mnist'))
        _copy_first_records(folder, copy, datasets.LOCAL_BUILDERS[name].SOURCE_FILES,
                            FASHION_MNIST_RECORDS)
        folder = copy
      folders[name] = folder
    return folders[name]
  return get


def test_every_experiment_config_is_collected():
  assert 'digits_mlp.py' in CONFIG_FILES and 'mnist1d_mlp.py' in CONFIG_FILES
  assert not set(NOT_EXPERIMENTS) & set(CONFIG_FILES)


@pytest.mark.parametrize('filename', CONFIG_FILES)
def test_docstring_command_parses(filename, monkeypatch):
  command = _own_command(filename)
  assert command[:3] == ['python', '-m', 'experiments.main']
  assert any(arg.startswith('--workdir=') for arg in command), command
  monkeypatch.chdir(REPO_ROOT)
  config, workdir = _parse(command[3:])
  assert config.data.name and workdir


@pytest.mark.parametrize('filename', CONFIG_FILES)
def test_config_passes_setup(filename, data_dir, local_source_dir, tmp_path, monkeypatch):
  monkeypatch.chdir(REPO_ROOT)
  config, _ = _parse(_own_command(filename)[3:])
  name = config.data.name
  if name in datasets.LOCAL_BUILDERS:
    config.data.data_dir = data_dir
    builder_cls = datasets.LOCAL_BUILDERS[name]
    if sources.reads_local_files(builder_cls):
      monkeypatch.setenv(builder_cls.SOURCE_ENV_VAR, local_source_dir(name))
  try:
    run = loop.setup(config, str(tmp_path / 'workdir'))
  except FileNotFoundError as e:
    if name in datasets.LOCAL_BUILDERS:
      raise
    pytest.skip(f'catalog data set {name} is not available offline: {e}')
  assert len(run.train_source) > 0 and len(run.eval_source) > 0
  # setup traced the first train and eval step; the task reads the source's records.
  example = run.task.preprocess(pipeline.read_batch(run.train_source, np.arange(2)))
  assert {x.shape[0] for x in example.values()} == {2}
  assert run.workdir == str(tmp_path / 'workdir')
