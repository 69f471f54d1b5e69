"""Executes every notebook in notebooks/; any cell error fails the test."""

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


def test_there_are_notebooks_to_run():
  assert NOTEBOOKS


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
