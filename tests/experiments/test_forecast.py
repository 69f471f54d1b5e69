"""experiments/forecast.py end to end: trains a tiny pooled forecaster through the shared train
loop (the loss falls), scores the test split against the baselines (checked against a hand
computation on the builder's records), appends the record, prints the table and draws the
figure; a rerun with other settings appends its record after the earlier one."""

import json
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from data import datasets
from experiments import forecast
from experiments.configs import co2_forecast_pooled
from tests.experiments import fake_runs
from tests.subprocess_util import REPO_ROOT


@pytest.fixture
def config(tmp_path, tmp_path_factory):
  c = co2_forecast_pooled.get_config()
  # The session's co2 folder (tests/data/test_co2.py prepares the same one).
  c.data.data_dir = str(tmp_path_factory.getbasetemp() / 'co2_data')
  c.data.series_window = 16
  c.data.series_horizon = 4
  c.model.channels = 8
  c.model.dilations = (1, 2, 4)
  # The mean over the window hides the season's phase, which 30 steps do not learn; the last
  # position's features show it.
  c.model.pooling = 'last'
  c.global_batch_size = 16
  c.eval_batch_size = 64
  c.num_train_steps = 30
  c.optimizer.warmup_steps = 5
  c.optimizer.learning_rate = 1e-2
  c.log_every_steps = 10
  c.eval_every_steps = 30
  c.checkpoint_every_steps = 30
  return c


def _months(data_dir):
  out = []
  for split in ('train', 'validation', 'test'):
    source = datasets.load('co2', split, data_dir=data_dir)
    out += [source[i]['co2'] for i in range(len(source))]
  return np.array(out, np.float64)


def test_forecast_script_scores_models_and_baselines_on_the_same_origins(config, tmp_path,
                                                                          capsys):
  workdir = str(tmp_path / 'run')
  figure = str(tmp_path / 'figures' / 'co2.png')
  record = forecast.run(config, workdir, num_steps=24, figure=figure)

  # Origins 473 … 501: every month whose next 24 lie in the test split (474 … 525).
  assert record['origin_indices'] == list(range(473, 502))
  assert record['origins'][0] == '1997-08' and record['origins'][-1] == '1999-12'
  x = _months(config.data.data_dir)
  origins = np.arange(473, 502)
  h = np.arange(1, 25)
  truth = x[origins[:, None] + h]
  np.testing.assert_allclose(record['truth'], truth)
  # The baselines by hand: x_o for every horizon; x_{o+h−12} for h ≤ 12, x_{o+h−24} after.
  last = np.abs(x[origins][:, None] - truth).mean(axis=0)
  seasonal_source = origins[:, None] + h - np.where(h <= 12, 12, 24)
  seasonal = np.abs(x[seasonal_source] - truth).mean(axis=0)
  methods = record['methods']
  np.testing.assert_allclose(methods['last value']['mae_by_horizon'], last, rtol=1e-6)
  np.testing.assert_allclose(methods['seasonal naive (12 months)']['mae_by_horizon'], seasonal,
                             rtol=1e-6)
  # The pooled model forecasts its 4 horizons directly, and all 24 one step at a time.
  direct = np.array(methods['causal_conv_pooled (direct)']['forecasts'])
  auto = np.array(methods['causal_conv_pooled (autoregressive)']['forecasts'])
  assert direct.shape == (29, 4) and auto.shape == (29, 24)
  np.testing.assert_allclose(methods['causal_conv_pooled (direct)']['mae_by_horizon'],
                             np.abs(direct - truth[:, :4]).mean(axis=0), rtol=1e-6)
  # The autoregressive forecast's first step is the direct forecast's horizon 1.
  np.testing.assert_allclose(auto[:, 0], direct[:, 0], rtol=1e-5)

  out = capsys.readouterr().out
  assert 'test MAE (ppm) over 29 forecast origins 1997-08 … 1999-12' in out
  assert (f'{"last value":<42}{last[0]:8.3f}{last[5]:8.3f}{last[11]:8.3f}{last[23]:8.3f}'
          f'{last.mean():8.3f}') in out
  direct_mae = methods['causal_conv_pooled (direct)']['mae_by_horizon']
  # Horizons past the pooled model's 4 have no direct forecast.
  row = f'{"causal_conv_pooled (direct)":<42}{direct_mae[0]:8.3f}'
  assert row + f'{"—":>8}' * 4 in out
  # One line, the record the run returned, with its settings.
  path = os.path.join(workdir, forecast.OUTPUT_FILE)
  with open(path, 'rb') as f:
    first = f.read()
  assert first.endswith(b'\n') and first.count(b'\n') == 1 and json.loads(first) == record
  assert (record['num_steps'], record['checkpoint_step'], record['weights']) == (24, 30, 'params')
  image = matplotlib.image.imread(figure)
  assert image.shape[0] > 300 and image.shape[1] > 1000
  # Trained through the shared loop: the loss fell, and the model beats the baselines.
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    train = [r['loss'] for r in map(json.loads, f) if r['split'] == 'train']
  assert len(train) == 3 and train[-1] < 0.5 * train[0]
  assert np.mean(direct_mae) < min(last[:4].mean(), seasonal[:4].mean())

  # A rerun with another --num_steps appends its record after the first, which stays byte for
  # byte (it was replaced), and leaves a forecast_test.json of the earlier format as it was.
  with open(os.path.join(workdir, 'forecast_test.json'), 'w', encoding='utf-8') as f:
    f.write('{"an": "earlier record"}\n')
  second = forecast.run(config, workdir, num_steps=6, figure=str(tmp_path / 'figures' / 'six.png'))
  origins = np.arange(473, 520)  # every month whose next 6 lie in the test split
  last_six = np.abs(x[origins][:, None] - x[origins[:, None] + h[:6]]).mean(axis=0)
  np.testing.assert_allclose(second['methods']['last value']['mae_by_horizon'], last_six,
                             rtol=1e-6)
  with open(path, 'rb') as f:
    both = f.read()
  assert both.startswith(first) and both[len(first):].count(b'\n') == 1
  assert json.loads(both[len(first):]) == second and second['num_steps'] == 6
  with open(os.path.join(workdir, 'forecast_test.json'), encoding='utf-8') as f:
    assert f.read() == '{"an": "earlier record"}\n'


def test_a_bad_step_count_stops_before_training_in_one_sentence(config, tmp_path):
  with pytest.raises(SystemExit) as info:
    forecast.run(config, str(tmp_path / 'run'), num_steps=0)
  assert str(info.value) == 'error: --num_steps must be a positive integer, got 0.'
  assert not os.path.exists(tmp_path / 'run')


def test_a_config_that_forecasts_no_series_stops_before_training(tmp_path):
  from experiments.configs import digits_mlp  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as info:
    forecast.run(digits_mlp.get_config(), str(tmp_path / 'run'))
  assert str(info.value) == ("error: The config of data set 'digits' does not forecast a series "
                             "(it sets no data.series_window).")
  assert not os.path.exists(tmp_path / 'run')


def test_more_steps_than_the_test_split_holds_stop_before_training(config, tmp_path):
  test_months = len(datasets.load('co2', 'test', data_dir=config.data.data_dir))
  # The first origin is the month before the test split (the window and the season are
  # shorter than the months before it), so a forecast of test_months steps is the longest.
  with pytest.raises(SystemExit) as info:
    forecast.run(config, str(tmp_path / 'run'), num_steps=test_months + 1)
  assert str(info.value) == (f"error: The test split of 'co2' has {test_months} values, too few "
                             f"for one forecast of --num_steps={test_months + 1}; give at most "
                             f"{test_months}.")
  assert not os.path.exists(tmp_path / 'run')
  meta = {'series_window': config.data.series_window, 'series_key': 'co2'}
  _, origins = forecast.forecast_origins(config, meta, test_months)
  assert len(origins) == 1


@pytest.mark.parametrize('name', ['figure.pngg', 'folder'])
def test_a_figure_that_cannot_be_written_stops_before_training(config, tmp_path, name):
  (tmp_path / 'folder').mkdir()
  with pytest.raises(SystemExit) as info:
    forecast.run(config, str(tmp_path / 'run'), figure=str(tmp_path / name))
  assert str(info.value).startswith(f'error: --figure={tmp_path / name} ')
  assert not os.path.exists(tmp_path / 'run')


def test_checkpoints_of_another_config_resume_with_allow_config_change(config, tmp_path):
  # The refusal advised --allow_config_change, which the script did not define.
  workdir = fake_runs.save_random_run(config, str(tmp_path / 'run'), step=config.num_train_steps)
  config.optimizer.learning_rate = 3e-3
  with pytest.raises(SystemExit) as info:
    forecast.run(config, workdir, num_steps=4)
  assert 'optimizer.learning_rate (0.01 -> 0.003) differ' in str(info.value)
  assert '--allow_config_change' in str(info.value)
  record = forecast.run(config, workdir, num_steps=4, allow_config_change=True)
  assert record['checkpoint_step'] == config.num_train_steps
  # The flag parses: the command gets as far as its first check, the figure's.
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.forecast',
       '--config=experiments/configs/co2_forecast_pooled.py', f'--workdir={workdir}',
       '--allow_config_change', f'--figure={tmp_path}'], cwd=REPO_ROOT,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True, timeout=120)
  assert result.stderr == f'error: --figure={tmp_path} is a folder; give the file to write in it.\n'


@pytest.mark.parametrize('window, first', [(4, 11), (16, 15)])
def test_train_split_origins_leave_room_for_the_window_and_the_season(config, window, first):
  # From the train split's start (month 0), the first origin needs a whole context window and a
  # whole season (12 months) of history, the seasonal naive baseline's, before it; the last one
  # leaves num_steps months after it inside the split (422 months).
  meta = {'series_window': window, 'series_key': 'co2'}
  values, origins = forecast.forecast_origins(config, meta, 6, 'train')
  assert len(values) == 526
  assert origins.tolist() == list(range(first, 422 - 6))


def test_a_record_file_that_is_a_folder_stops_before_training(config, tmp_path, monkeypatch):
  # It was an IsADirectoryError traceback after training and forecasting, leaving a .tmp file.
  workdir = tmp_path / 'run'
  (workdir / forecast.OUTPUT_FILE).mkdir(parents=True)
  monkeypatch.setattr(forecast, 'train', lambda *a, **k: pytest.fail('trained'))
  with pytest.raises(SystemExit) as info:
    forecast.run(config, str(workdir))
  assert str(info.value) == (f"error: '{workdir / forecast.OUTPUT_FILE}', the file the record is "
                             'appended to, is a folder.')
  assert os.listdir(workdir) == [forecast.OUTPUT_FILE]


def test_a_missing_config_suggests_a_forecasting_config(tmp_path):
  # It suggested digits_mlp.py, which this script refuses (the digits are not a series).
  result = subprocess.run([sys.executable, '-m', 'experiments.forecast', f'--workdir={tmp_path}'],
                          cwd=REPO_ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
                          capture_output=True, text=True, timeout=120)
  assert result.stderr == ('error: --config is missing; give the experiment config file, e.g. '
                           '--config=experiments/configs/co2_forecast_shifted.py.\n')
  assert os.listdir(tmp_path) == []


def test_a_short_window_slides_and_the_baselines_still_read_a_whole_season(config, tmp_path):
  # A context of 4 months, shorter than the season, and fewer steps (2) than the model's 4
  # horizons; random parameters, nothing trained. Mean pooling: the model sees every position.
  config.data.series_window = 4
  config.model.pooling = 'mean'
  workdir = fake_runs.save_random_run(config, str(tmp_path / 'run'), step=3)
  record = forecast.evaluate(config, workdir, num_steps=2)
  from train import checkpoint, loop  # pylint: disable=g-import-not-at-top
  module = loop.build_parts(config, workdir)[4]
  variables = checkpoint.eval_variables(checkpoint.restore_arrays(workdir))

  x = _months(config.data.data_dir)
  origins = np.array(record['origin_indices'])
  assert origins[0] == 473 and origins[-1] == 525 - 2
  truth = x[origins[:, None] + np.array([1, 2])]
  # Scaled with the train split's mean and 1/n deviation, written out.
  train = x[:len(datasets.load('co2', 'train', data_dir=config.data.data_dir))]
  mean, std = train.mean(), train.std()
  apply = lambda window: np.asarray(
      module.apply(variables, ((window - mean) / std).astype(np.float32), train=False),
      np.float64) * std + mean
  window = x[origins[:, None] + np.arange(-3, 1)]
  direct = apply(window)
  # Autoregressive by hand: h = 1 from the last 4 values, then from the last 3 and ŷ_1.
  first = direct[:, 0]
  second = apply(np.concatenate([window[:, 1:], first[:, None]], axis=1))[:, 0]
  methods = record['methods']
  np.testing.assert_allclose(methods['causal_conv_pooled (direct)']['forecasts'],
                             direct[:, :2], rtol=1e-5)
  np.testing.assert_allclose(methods['causal_conv_pooled (autoregressive)']['forecasts'],
                             np.stack([first, second], axis=1), rtol=1e-5)
  np.testing.assert_allclose(methods['causal_conv_pooled (direct)']['mae_by_horizon'],
                             np.abs(direct[:, :2] - truth).mean(axis=0), rtol=1e-5)
  # The seasonal naive forecast reads 12 months back, beyond the 4-month window.
  np.testing.assert_allclose(methods['seasonal naive (12 months)']['mae_by_horizon'],
                             np.abs(x[origins[:, None] + np.array([1, 2]) - 12] - truth)
                             .mean(axis=0), rtol=1e-6)
