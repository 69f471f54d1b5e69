"""The random-features and universal-approximation experiments: their figures come from the
quantities the theory predicts, and bad flags are refused before any work."""

import os
import subprocess
import sys
import types

from absl import app
import numpy as np
import pytest

from experiments import command_line
from experiments import random_features
from experiments import universal_approximation
from tests.messages import one_sentence
from tests.subprocess_util import REPO_ROOT


def test_random_features_accuracy_approaches_the_exact_kernel_machine_as_features_grow():
  x_train, x_test, y_train, y_test = random_features.load_split(0)
  gamma = 1.0 / (x_train.shape[1] * x_train.var())  # the script's default γ
  exact = random_features.exact_kernel_ridge_accuracy(x_train, y_train, x_test, y_test, gamma, 1e-2)
  assert abs(exact - 0.9926) < 2e-3  # the README's exact kernel ridge on this split
  accuracy = {d: np.mean([random_features.random_features_accuracy(
      x_train, y_train, x_test, y_test, gamma, 1e-2, d, seed) for seed in range(2)])
              for d in (20, 2000)}
  # z(x)ᵀz(y) → k(x, y) as D grows: 2,000 features give the exact machine's accuracy within one
  # point; 20 features are far from it (0.74-0.75 over three draws).
  assert abs(accuracy[2000] - exact) < 0.01
  assert accuracy[20] < exact - 0.1


@pytest.mark.parametrize('values', [['0', '5'], ['-50'], ['a'], []])
def test_feature_counts_must_be_positive_integers(values):
  # Zero features gave NaN accuracies, and no counts an empty table, after the exact machines.
  one_sentence(lambda: command_line.integers_at_least(values, 'num_features'),
               f'--num_features={",".join(values)} must be positive integers.', error=app.UsageError)


def test_the_constructed_network_meets_the_interpolation_bound_and_training_fits(
    tmp_path, monkeypatch):
  rows = universal_approximation.run([8, 32, 128], train_steps=0, learning_rate=1e-2, seed=0)
  for width, constructed, trained in rows:
    # Linear interpolation of sin on width - 2 grid points, spacing h = 2π / (width - 3):
    # max error h²/8 · max|sin''| = h²/8, attained near the peaks of |sin|.
    bound = (2 * np.pi / (width - 3)) ** 2 / 8
    assert 0.9 * bound < constructed < 1.01 * bound, (width, constructed, bound)
    assert np.isnan(trained)
  x_N = np.linspace(universal_approximation.LO, universal_approximation.HI, 2001)
  error = {steps: universal_approximation.max_error(
      universal_approximation.train_network(32, steps, 1e-2, 0), x_N) for steps in (1, 1000)}
  assert error[1000] < 0.2 < 0.5 < error[1]  # measured 0.127 after 1,000 Adam steps
  path = str(tmp_path / 'ua.png')
  figures = []
  monkeypatch.setattr(universal_approximation.plt, 'close', figures.append)
  universal_approximation.plot(rows, path)
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  # The figure draws the errors measured and, dashed, the bound they meet: the dashed line
  # must sit on the measured construction errors (within the 10% above), not just anywhere.
  (ax,) = figures[0].axes
  lines = {line.get_label(): line for line in ax.get_lines()}
  construction = next(line for label, line in lines.items() if label.startswith('construction'))
  bound = next(line for label, line in lines.items() if label.startswith('bound'))
  assert 'trained with Adam' not in lines  # no network was trained
  np.testing.assert_array_equal(construction.get_xdata(), [8, 32, 128])
  np.testing.assert_array_equal(bound.get_xdata(), [8, 32, 128])
  np.testing.assert_array_equal(construction.get_ydata(), [row[1] for row in rows])
  np.testing.assert_allclose(bound.get_ydata(), construction.get_ydata(), rtol=0.11)


@pytest.mark.parametrize('values', [['0'], ['3'], ['8', '2'], ['a'], []])
def test_widths_below_the_construction_are_refused(values):
  # Width 3 has one grid point to interpolate on; the script raised from the model after
  # training the widths before it, and an empty list wrote an empty table, then crashed.
  one_sentence(lambda: command_line.integers_at_least(values, 'widths', 4, 'why'),
               f'--widths={",".join(values)} must be integers of at least 4 (why).',
               error=app.UsageError)


def test_list_flags_of_integers_parse_in_order():
  assert command_line.integers_at_least(['500', '50'], 'num_features') == [500, 50]
  assert command_line.integers_at_least(['64', '4'], 'widths', 4) == [64, 4]


@pytest.mark.parametrize('flag, message', [
    ('--widths=', '--widths= must be integers of at least 4'),
    ('--train_steps=-1', 'flag --train_steps=-1: -1 is not a non-negative integer'),
    ('--learning_rate=0', '--learning_rate must be positive'),
    # An infinite rate trained NaN networks and tabled their error as nan.
    ('--learning_rate=inf', '--learning_rate must be positive and finite'),
])
def test_the_script_refuses_bad_flags_and_keeps_an_earlier_table(tmp_path, flag, message):
  table = tmp_path / 'universal_approximation.tsv'
  table.write_text('an earlier run\n')
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.universal_approximation', f'--workdir={tmp_path}', flag],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
  assert table.read_text() == 'an earlier run\n'
  assert 'width' not in result.stdout  # refused before the table's header was printed


def test_random_features_refuses_a_split_seed_scikit_learn_cannot_take(tmp_path):
  # scikit-learn takes seeds in [0, 2³² − 1] and raised its own traceback after the data
  # was loaded.
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.random_features', f'--workdir={tmp_path}',
       '--split_seed=-1'], cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert 'flag --split_seed=-1: -1 is not an integer in the range [0, 4294967295]' in result.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('flag, message', [
    ('--gamma=inf', '--gamma must be positive and finite'),
    ('--ridge=inf', '--ridge must be finite'),
    ('--svc_c=0', '--svc_c must be positive'),
])
def test_random_features_refuses_an_infinite_gamma_or_ridge_or_a_zero_c_at_parsing(
    tmp_path, flag, message):
  # The first two passed the flag checks and ended in scikit-learn's InvalidParameterError
  # traceback after the data was loaded, as C = 0 would.
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.random_features', f'--workdir={tmp_path}',
       '--num_features=10', '--draws=1', flag], cwd=REPO_ROOT,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1 and result.stdout == '', result.stderr[-2000:]
  assert 'Traceback' not in result.stderr and message in result.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('script, flags', [
    ('random_features', ['--num_features=10', '--draws=1']),
    ('universal_approximation', ['--widths=4', '--train_steps=0']),
])
def test_a_workdir_that_is_a_file_is_refused_before_any_work(tmp_path, script, flags):
  # It was a FileExistsError traceback, for random_features after the whole table.
  workdir = tmp_path / 'results'
  workdir.write_text('an earlier file\n')
  result = subprocess.run(
      [sys.executable, '-m', f'experiments.{script}', f'--workdir={workdir}', *flags],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 1 and result.stdout == '', result.stderr[-2000:]
  assert result.stderr == (f"error: The work directory '{workdir}' is not writable "
                           f"('{workdir}' is a file).\n")
  assert workdir.read_text() == 'an earlier file\n'


def test_digits_split_is_stratified_70_30_and_scaled_to_the_unit_interval():
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  x, y = datasets.load_digits(return_X_y=True)
  x_train, x_test, y_train, y_test = random_features.load_split(0)
  assert len(x_test) == 540 and len(x_train) == 1257  # ceil(0.3 · 1,797) for test
  assert x_train.min() == 0 and x_train.max() == 1
  # Every class keeps its share: its test count is within one of 30% of its size.
  for label in range(10):
    assert abs(np.sum(y_test == label) - 0.3 * np.sum(y == label)) <= 1, label
  # The two splits are the data set, each image once.
  rows = sorted(map(tuple, np.concatenate([x_train, x_test]) * 16))
  assert rows == sorted(map(tuple, x.astype(float)))


def test_random_features_script_uses_the_scale_rule_for_gamma_and_reports_the_exact_machines(
    tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.random_features', f'--workdir={tmp_path}',
       '--num_features=20', '--draws=1'], cwd=REPO_ROOT,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  from sklearn import svm  # pylint: disable=g-import-not-at-top
  x_train, x_test, y_train, y_test = random_features.load_split(0)
  # The default γ is scikit-learn's gamma='scale', 1 / (input_dim · Var x) over the train inputs.
  assert f'gamma = {1 / (64 * x_train.var()):.4f}' in result.stdout
  scale_svc = svm.SVC(kernel='rbf', gamma='scale', C=10.0).fit(x_train, y_train)
  rows = {line.split('\t')[0]: line.split('\t')
          for line in (tmp_path / 'random_features.tsv').read_text().splitlines()[1:]}
  assert float(rows['exact_svc'][2]) == pytest.approx(scale_svc.score(x_test, y_test), abs=1e-6)
  assert float(rows['exact_kernel_ridge'][2]) == pytest.approx(0.9926, abs=2e-3)
  assert rows['rff_ridge'][1] == '20' and float(rows['rff_ridge'][3]) == 0  # one draw


@pytest.mark.parametrize('script, flags, blocked, kept', [
    ('random_features', ['--num_features=10', '--draws=1'], 'random_features.tsv', None),
    ('universal_approximation', ['--widths=4', '--train_steps=0'], 'universal_approximation.png',
     'universal_approximation.tsv'),
])
def test_an_output_file_that_is_a_folder_is_refused_before_any_work(tmp_path, script, flags,
                                                                    blocked, kept):
  # Each was an IsADirectoryError traceback after the work; universal_approximation had
  # already replaced its earlier table.
  (tmp_path / blocked).mkdir()
  if kept:
    (tmp_path / kept).write_text('an earlier table\n')
  result = subprocess.run(
      [sys.executable, '-m', f'experiments.{script}', f'--workdir={tmp_path}', *flags],
      cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 1 and result.stdout == '', result.stderr[-2000:]
  message = result.stderr
  assert message.startswith(f"error: '{tmp_path / blocked}', the ") and message.endswith(
      ', is a folder.\n'), message
  if kept:
    assert (tmp_path / kept).read_text() == 'an earlier table\n'


def test_universal_approximation_tables_the_errors_of_each_width(tmp_path, monkeypatch, capsys):
  # The run's rows (width, construction error, trained error) as given, with its flags.
  monkeypatch.setattr(universal_approximation, 'FLAGS', types.SimpleNamespace(
      workdir=str(tmp_path), widths=['8', '16'], train_steps=7, learning_rate=0.25, seed=3))
  calls = []
  rows = [(8, 0.0123, 0.0456), (16, 0.00321, float('nan'))]
  monkeypatch.setattr(universal_approximation, 'run', lambda *args: calls.append(args) or rows)
  universal_approximation.main(['universal_approximation'])
  assert calls == [([8, 16], 7, 0.25, 3)]
  lines = (tmp_path / 'universal_approximation.tsv').read_text().splitlines()
  assert lines == ['width\tconstruction_max_error\ttrained_max_error',
                   '8\t1.230000e-02\t4.560000e-02', '16\t3.210000e-03\tnan']
  assert os.path.getsize(tmp_path / 'universal_approximation.png') > 1000
  capsys.readouterr()
  # Width 3 interpolates on a single point: refused before any file is written.
  (tmp_path / 'universal_approximation.tsv').unlink()
  monkeypatch.setattr(universal_approximation.FLAGS, 'widths', ['16', '3'])
  with pytest.raises(app.UsageError, match='must be integers of at least 4'):
    universal_approximation.main(['universal_approximation'])
  assert len(calls) == 1 and not (tmp_path / 'universal_approximation.tsv').exists()


def test_random_features_tables_the_mean_and_spread_over_independent_draws(tmp_path, monkeypatch,
                                                                         capsys):
  """The table from stand-in accuracies 0.5 + D/1000 + 0.1 · seed: each D is drawn with the
  seeds 0 … draws − 1, and its row holds their mean and (population) standard deviation."""
  monkeypatch.setattr(random_features, 'FLAGS', types.SimpleNamespace(
      workdir=str(tmp_path), num_features=['10', '30'], draws=3, gamma=None, ridge=0.5,
      svc_c=2.0, split_seed=0))
  calls = []

  def accuracy(x_train, y_train, x_test, y_test, gamma, ridge, num_features, seed):
    calls.append((num_features, seed, gamma, ridge))
    return 0.5 + num_features / 1000 + 0.1 * seed
  monkeypatch.setattr(random_features, 'random_features_accuracy', accuracy)
  monkeypatch.setattr(random_features, 'exact_kernel_ridge_accuracy',
                      lambda *args: calls.append(('ridge', *args[4:])) or 0.75)
  monkeypatch.setattr(random_features, 'svc_accuracy',
                      lambda *args: calls.append(('svc', *args[4:])) or 0.875)
  random_features.main(['random_features'])
  x_train, _, _, _ = random_features.load_split(0)
  gamma = 1 / (64 * x_train.var())
  assert calls == [('ridge', gamma, 0.5), ('svc', gamma, 2.0)] + [
      (d, seed, gamma, 0.5) for d in (10, 30) for seed in range(3)]
  lines = (tmp_path / 'random_features.tsv').read_text().splitlines()
  assert lines[0] == 'model\tnum_features\tmean_accuracy\tstd_accuracy'
  for line, d in zip(lines[1:3], (10, 30)):
    values = [0.5 + d / 1000 + 0.1 * seed for seed in range(3)]
    name, count, mean, std = line.split('\t')
    assert (name, count) == ('rff_ridge', str(d))
    assert float(mean) == pytest.approx(sum(values) / 3, abs=1e-6)
    assert float(std) == pytest.approx(0.1 * np.sqrt(2 / 3), abs=1e-6)
  assert lines[3:] == ['exact_kernel_ridge\t\t0.750000\t', 'exact_svc\t\t0.875000\t']
  capsys.readouterr()
