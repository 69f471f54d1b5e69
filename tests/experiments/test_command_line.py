"""Shared checks of the scripts' flags (experiments/command_line.py): each refusal is one
sentence naming the flag and its value, given before the script does any work."""

from absl import app
import pytest

from experiments import command_line
from tests.messages import one_sentence


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
