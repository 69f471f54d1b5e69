"""Executes every notebook in notebooks/; any cell error fails the test, and so does a cell
that shows a figure without a figure in its outputs."""

import ast
import glob
import os
import time

import nbclient
import nbformat
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO_ROOT, 'notebooks', '*.ipynb')))
# A notebook is documentation that runs; it should stay quick.
TIME_LIMIT_S = 60


def _shows_a_figure(source: str) -> bool:
  """Whether the cell's own statements (not the bodies of the functions it defines) call
  `plt.show`, a helper named `show…` or `display`."""
  def calls(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
      return False
    if isinstance(node, ast.Call):
      func = node.func
      name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', '')
      if name.startswith('show') or name == 'display':
        return True
    return any(calls(child) for child in ast.iter_child_nodes(node))

  return calls(ast.parse(source))


def cells_missing_a_figure(notebook) -> list[int]:
  """Indices of the executed notebook's code cells that show a figure but hold no image."""
  missing = []
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type != 'code' or not _shows_a_figure(cell.source):
      continue
    if not any('image/png' in output.get('data', {}) for output in cell.get('outputs', [])):
      missing.append(index)
  return missing


def test_there_are_notebooks_to_run():
  assert NOTEBOOKS


def test_a_cell_that_shows_a_figure_without_an_image_is_found():
  image = nbformat.v4.new_output('display_data', data={'image/png': 'iVBORw0KGgo=',
                                                       'text/plain': '<Figure>'})
  text = nbformat.v4.new_output('stream', name='stdout', text='done\n')
  notebook = nbformat.v4.new_notebook(cells=[
      nbformat.v4.new_markdown_cell('plt.show()'),
      # A helper whose body shows a figure: defining it shows nothing.
      nbformat.v4.new_code_cell('def show_row(images):\n  plt.imshow(images[0])\n  plt.show()'),
      nbformat.v4.new_code_cell('for image in images:\n  plt.imshow(image)\n  plt.show()', outputs=[image]),
      nbformat.v4.new_code_cell("show_row(images)\nprint('done')", outputs=[text]),
      nbformat.v4.new_code_cell('IPython.display.display(IPython.display.Image(filename=path))'),
      nbformat.v4.new_code_cell('x = 1 + 1\nprint(x)', outputs=[text]),
  ])
  assert cells_missing_a_figure(notebook) == [3, 4]


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path, monkeypatch):
  # The kernel imports this checkout's packages, whatever is installed.
  monkeypatch.setenv('PYTHONPATH', REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=TIME_LIMIT_S, kernel_name='python3',
                                   resources={'metadata': {'path': os.path.dirname(path)}})
  start = time.monotonic()
  client.execute()  # Raises CellExecutionError on the first failing cell.
  assert time.monotonic() - start < TIME_LIMIT_S
  # A figure that never reaches the outputs (a backend without display, a figure closed
  # before it is shown) raises nothing: the cell's outputs must hold it.
  assert not cells_missing_a_figure(notebook), (
      f'cells {cells_missing_a_figure(notebook)} of {os.path.basename(path)} show a figure '
      'but their outputs hold no image')
  assert any('image/png' in output.get('data', {}) for cell in notebook.cells
             for output in cell.get('outputs', [])), f'{os.path.basename(path)} shows no figure'
