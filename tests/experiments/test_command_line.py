"""Shared checks of the scripts' flags (experiments/command_line.py): each refusal is one
sentence naming the flag and its value, given before the script does any work."""

import json
import os
import subprocess
import sys

from absl import app
import pytest

from experiments import command_line
from tests.messages import one_sentence
from tests.subprocess_util import REPO_ROOT


@pytest.mark.parametrize('name, figure', [('a.png', True), ('sub/dir/a.pdf', True),
                                          ('A.SVG', True), ('samples.txt', False)])
def test_output_files_that_can_be_written_are_returned_as_given(tmp_path, name, figure):
  path = str(tmp_path / name)
  assert command_line.output_file(path, 'output', figure=figure) == path


def test_an_existing_output_file_can_be_written_over(tmp_path):
  (tmp_path / 'old.png').write_bytes(b'an earlier figure')
  assert command_line.output_file(str(tmp_path / 'old.png'), 'output') == str(tmp_path / 'old.png')
  assert command_line.unwritable(str(tmp_path / 'old.png')) is None


def test_a_folder_is_not_an_output_file(tmp_path):
  for figure in (True, False):
    one_sentence(lambda: command_line.output_file(str(tmp_path), 'figure', figure=figure),
                 f'--figure={tmp_path} is a folder', error=app.UsageError)


@pytest.mark.parametrize('below', ['a.png', 'sub/dir/a.png'])
def test_an_output_file_under_a_file_is_refused(tmp_path, below):
  # The scripts made the folders and failed with FileExistsError after their work.
  (tmp_path / 'notes.txt').write_text('kept')
  path = str(tmp_path / 'notes.txt' / below)
  for figure in (True, False):
    one_sentence(lambda: command_line.output_file(path, 'output', figure=figure),
                 f'--output={path} cannot be written: {tmp_path / "notes.txt"} is a file, not a '
                 'folder.', error=app.UsageError)
  assert (tmp_path / 'notes.txt').read_text() == 'kept'


def test_an_output_file_under_a_folder_that_cannot_be_written_is_refused(tmp_path, monkeypatch):
  locked = tmp_path / 'locked'
  locked.mkdir()
  # As root os.access allows everything, so the refusal of writes to `locked` is simulated.
  access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode: str(p) != str(locked) and access(p, mode))
  for name in ('a.png', 'new/a.png'):
    path = str(locked / name)
    one_sentence(lambda: command_line.output_file(path, 'figure'),
                 f'--figure={path} cannot be written: permission denied on the folder '
                 f'{locked}.', error=app.UsageError)
  assert command_line.output_file(str(tmp_path / 'a.png'), 'figure') == str(tmp_path / 'a.png')


@pytest.mark.parametrize('denied', [os.W_OK, os.X_OK])
def test_a_folder_must_allow_both_writing_and_entering(tmp_path, monkeypatch, denied):
  # A file is made in a folder only with both its write and its search (x) permission.
  access = os.access  # as root os.access allows everything: the refusal is simulated
  monkeypatch.setattr(os, 'access', lambda p, mode: not (str(p) == str(tmp_path)
                                                         and mode & denied) and access(p, mode))
  assert command_line.unwritable(str(tmp_path / 'a.png')) == (
      f'permission denied on the folder {tmp_path}')


def test_a_record_file_or_its_folder_that_cannot_be_written_is_refused(tmp_path, monkeypatch):
  locked, kept = tmp_path / 'locked', tmp_path / 'kept'
  locked.mkdir()
  kept.mkdir()
  (kept / 'r.jsonl').write_text('{}\n')
  access = os.access  # as root os.access allows everything: the refusals are simulated
  refused = {str(locked), str(kept / 'r.jsonl')}
  monkeypatch.setattr(os, 'access', lambda p, mode: str(p) not in refused and access(p, mode))
  for folder, why in ((locked, f'permission denied on the folder {locked}'),
                      (locked / 'new', f'permission denied on the folder {locked}'),
                      (kept, f'permission denied on the file {kept / "r.jsonl"}')):
    one_sentence(lambda: command_line.record_file(str(folder), 'r.jsonl', 'the row is appended to'),
                 f"'{folder / 'r.jsonl'}', the file the row is appended to, cannot be written: "
                 f'{why}.')
  assert command_line.record_file(str(tmp_path), 'r.jsonl', 'x') == str(tmp_path / 'r.jsonl')
  assert (kept / 'r.jsonl').read_text() == '{}\n'


@pytest.mark.parametrize('name', ['a.pngg', 'a', 'a.txt'])
def test_a_figure_must_end_in_a_format_matplotlib_writes(tmp_path, name):
  message = one_sentence(lambda: command_line.output_file(str(tmp_path / name), 'output'),
                         f'--output={tmp_path / name} must end in a figure format',
                         error=app.UsageError)
  formats = message.split('figure format: ')[1].rstrip('.').split(', ')
  assert {'.png', '.pdf', '.svg'} <= set(formats) and '.pngg' not in formats and '.txt' not in formats


def test_records_are_appended_one_per_line_after_an_unended_last_line(tmp_path):
  path = str(tmp_path / 'records.jsonl')
  command_line.append_record(path, {'step': 2, 'loss': 0.5})
  assert open(path, encoding='utf-8').read() == '{"loss": 0.5, "step": 2}\n'
  # A run stopped while writing its line left it unended: the next record gets a line of its
  # own, and the bytes already there are kept.
  with open(path, 'a', encoding='utf-8') as f:
    f.write('{"loss": 0.4, "st')
  before = open(path, 'rb').read()
  command_line.append_record(path, {'step': 4, 'name': 'ü'})
  after = open(path, 'rb').read()
  assert after.startswith(before)
  lines = after.decode('utf-8').split('\n')
  assert lines[1:] == ['{"loss": 0.4, "st', lines[2], '']
  assert json.loads(lines[2]) == {'step': 4, 'name': 'ü'}


def _config_file(tmp_path, source: str) -> str:
  path = tmp_path / 'config.py'
  path.write_text(source)
  return str(path)


def test_a_config_file_argument_is_all_that_follows_the_first_colon(tmp_path, monkeypatch):
  monkeypatch.setattr(command_line.ConfigFileParser, 'overrides', {})
  path = _config_file(tmp_path, 'import ml_collections\n'
                      'def get_config(argument=None):\n'
                      '  return ml_collections.ConfigDict({"argument": argument})\n')
  parser = command_line.ConfigFileParser('config')
  assert parser.parse(path).argument is None
  config = parser.parse(f'{path}:host:8080')
  assert config.argument == 'host:8080' and config.is_locked and parser.config is config


@pytest.mark.parametrize('source, part', [
    (None, 'does not exist; the experiment configs are: experiments/configs/'),
    ('get_config = 1\n', 'defines no get_config()'),
    ('def get_config():\n  return {"seed": 1}\n',
     'returned dict, not an ml_collections.ConfigDict'),
    ('def get_config():\n  raise ValueError("no seed given\\nsee the docs")\n',
     'failed: ValueError: no seed given.'),  # the first line of the error
    ('import no_such_module_of_configs\n',
     "failed: ModuleNotFoundError: No module named 'no_such_module_of_configs'")])
def test_a_config_file_that_cannot_give_a_config_is_one_sentence(tmp_path, monkeypatch, source,
                                                                 part):
  monkeypatch.setattr(command_line.ConfigFileParser, 'overrides', {})
  path = str(tmp_path) if source is None else _config_file(tmp_path, source)  # None: a folder
  one_sentence(lambda: command_line.ConfigFileParser('config').parse(path), f"'{path}'", part,
               error=command_line.ConfigError)


def test_boolean_options_the_config_leaves_out_are_added_as_absl_reads_them():
  from experiments.configs import digits_mlp  # pylint: disable=g-import-not-at-top
  config = digits_mlp.get_config()
  assert not {'batch_norm', 'layer_norm', 'residual'} & set(config.model)
  argv = ['main', '--config.model.batch_norm', '--noconfig.model.layer_norm',
          '--config.model.residual=false']
  command_line._add_unlisted_options(config, command_line._overrides(argv))  # pylint: disable=protected-access
  assert (config.model.batch_norm, config.model.layer_norm, config.model.residual) == (
      True, False, False)


@pytest.mark.parametrize('text, value', [
    ('TRUE', True), ('False', False), ('0.25', 0.25), ('(8, 10)', (8, 10)), ('gelu', 'gelu'),
    ('data/my file', 'data/my file'), ('(8,', '(8,')])
def test_an_added_option_takes_the_value_as_typed_read_as_python_where_it_parses(text, value):
  # A value that is no Python literal (a name, a path, a broken tuple) stays the text typed.
  literal = command_line._literal(text)  # pylint: disable=protected-access
  assert literal == value and type(literal) is type(value)


def test_options_are_those_of_the_model_and_task_an_override_names():
  # The MLP of digits_mlp.py takes no num_classes and the classification task no mask_rate:
  # they are added because --config.model.name and --config.task.name name ones that do.
  from experiments.configs import digits_mlp  # pylint: disable=g-import-not-at-top
  config = digits_mlp.get_config()
  # As absl does, the last of a repeated flag wins.
  argv = ['main', '--config.model.name=mlp', '--config.model.name=lenet5',
          '--config.model.num_classes=7', '--config.task.name=masked_language_model',
          '--config.task.mask_rate=0.25']
  overrides = command_line._overrides(argv)  # pylint: disable=protected-access
  command_line._add_unlisted_options(config, overrides)  # pylint: disable=protected-access
  assert (config.model.num_classes, config.task.mask_rate) == (7, 0.25)


def test_a_usage_error_from_main_is_one_error_line_without_the_usage(tmp_path):
  # absl's app.run prints the module's whole usage (docstring and flags) before the message.
  script = tmp_path / 'script.py'
  script.write_text(
      '"""A long docstring that absl would print as the usage."""\n'
      'from absl import app\n'
      'from experiments import command_line\n'
      'def main(argv):\n'
      '  raise app.UsageError("--things=0 must be positive integers.")\n'
      'command_line.run(main)\n')
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, 'PYTHONPATH': REPO_ROOT})
  assert result.returncode == 1
  assert result.stderr == 'error: --things=0 must be positive integers.\n'


def test_a_benchmark_parses_its_config_without_a_workdir(tmp_path):
  # parse_flags(needs_workdir=False), as the benchmarks call it: they define no --workdir.
  script = tmp_path / 'bench.py'
  script.write_text(
      'import functools\n'
      'from ml_collections import config_flags\n'
      'from experiments import command_line\n'
      '_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.")\n'
      'command_line.load_config_files_with("config")\n'
      'def main(argv):\n'
      '  print(_CONFIG.value.seed, _CONFIG.value.model.features)\n'
      'command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc="d",\n'
      '                                                     needs_workdir=False))\n')
  config = 'experiments/configs/digits_mlp.py'
  result = subprocess.run(
      [sys.executable, str(script), f'--config={config}', '--config.seed=5'], capture_output=True,
      text=True, timeout=60, cwd=REPO_ROOT, env={**os.environ, 'PYTHONPATH': REPO_ROOT})
  assert (result.returncode, result.stdout, result.stderr) == (0, '5 (256, 256, 10)\n', '')
