"""Shared checks of the scripts' flags (experiments/command_line.py): each refusal is one
sentence naming the flag and its value, given before the script does any work."""

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


def test_a_folder_is_not_an_output_file(tmp_path):
  for figure in (True, False):
    one_sentence(lambda: command_line.output_file(str(tmp_path), 'figure', figure=figure),
                 f'--figure={tmp_path} is a folder', error=app.UsageError)


@pytest.mark.parametrize('name', ['a.pngg', 'a', 'a.txt'])
def test_a_figure_must_end_in_a_format_matplotlib_writes(tmp_path, name):
  message = one_sentence(lambda: command_line.output_file(str(tmp_path / name), 'output'),
                         f'--output={tmp_path / name} must end in a figure format',
                         error=app.UsageError)
  formats = message.split('figure format: ')[1].rstrip('.').split(', ')
  assert {'.png', '.pdf', '.svg'} <= set(formats) and '.pngg' not in formats and '.txt' not in formats


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
