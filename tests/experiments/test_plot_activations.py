"""The activations figure: a panel per activation and one for a maxout unit, each with its
derivative, and the PNG is written."""

import os
import subprocess
import sys

import numpy as np

from experiments import plot_activations
from models import activations
from tests.subprocess_util import REPO_ROOT


def test_every_activation_and_a_maxout_unit_are_plotted_with_their_derivatives(tmp_path):
  path = str(tmp_path / 'activations.png')
  curves = plot_activations.plot(path)
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert set(curves) == set(activations.ACTIVATIONS) | {'maxout (3 pieces)'}
  x, phi, slope = (np.asarray(a, np.float64) for a in curves['maxout (3 pieces)'])
  # The largest of -x, x/2 and 2x - 3: -x below 0, x/2 up to 2, 2x - 3 beyond.
  np.testing.assert_allclose(phi, np.max([-x, x / 2, 2 * x - 3], axis=0), atol=1e-6)
  away = (np.abs(x) > 1e-3) & (np.abs(x - 2) > 1e-3)  # off the kinks
  np.testing.assert_array_equal(slope[away], np.select([x < 0, x < 2], [-1.0, 0.5], 2.0)[away])
  x, phi, slope = (np.asarray(a, np.float64) for a in curves['elu'])
  np.testing.assert_allclose(slope[x > 0], 1.0)
  np.testing.assert_allclose(slope[x < 0], np.exp(x[x < 0]), rtol=1e-5)


def test_a_file_name_without_a_figure_format_is_refused_before_plotting(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.plot_activations', f'--workdir={tmp_path}',
       '--filename=activations.pngg'], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 1
  assert result.stderr.strip().startswith(
      f'error: --filename={tmp_path}/activations.pngg must end in a figure format: ')
  assert '\n' not in result.stderr.strip() and not os.listdir(tmp_path)


def test_each_panel_draws_the_function_and_its_derivative(tmp_path, monkeypatch):
  figures = []
  monkeypatch.setattr(plot_activations.plt, 'close', figures.append)
  curves = plot_activations.plot(str(tmp_path / 'activations.png'))
  panels = {ax.get_title(): ax for ax in figures[0].axes if ax.get_title()}
  assert set(panels) == set(curves)
  for name, (x, phi, slope) in curves.items():
    x, phi, slope = (np.asarray(a, np.float64) for a in (x, phi, slope))
    lines = [line for line in panels[name].get_lines() if len(line.get_xdata()) == len(x)]
    drawn_phi, drawn_slope = lines
    np.testing.assert_allclose(drawn_phi.get_ydata(), phi)
    np.testing.assert_allclose(drawn_slope.get_ydata(), slope)
    assert drawn_slope.get_linestyle() == '--'
    # The derivative against central differences of φ, away from the kinks at 0 and 2.
    differences = (phi[2:] - phi[:-2]) / (x[2:] - x[:-2])
    smooth = (np.abs(x[1:-1]) > 0.02) & (np.abs(x[1:-1] - 2) > 0.02)
    np.testing.assert_allclose(slope[1:-1][smooth], differences[smooth], atol=2e-3, err_msg=name)
