"""The forecasting task: weighted sums against hand computations, the reports in the series'
unit, and options checked in one sentence. A tiny pooled run through the shared train loop
(which lowers the loss) is in tests/experiments/test_forecast.py."""

import numpy as np
import pytest

from data import scaling
from tests.messages import one_sentence
from train import tasks

SCALER = scaling.Scaler(np.array([340.0], np.float32), np.array([2.0], np.float32))


def _task(kind='pooled', window=3, horizon=2):
  meta = {'series_window': window, 'series_horizon': horizon, 'scaler': SCALER, 'unit': 'ppm'}
  return tasks.build('forecasting', meta, kind=kind)


class _Fixed:
  """A 'model' returning fixed predictions and recording its inputs."""

  def __init__(self, prediction):
    self.prediction, self.inputs = np.asarray(prediction, np.float32), None

  def __call__(self, *inputs):
    self.inputs = inputs
    return self.prediction


def _sums(metrics):
  return {name: (float(np.sum(total)), float(np.sum(weight)))
          for name, (total, weight) in metrics.items()}


def test_pooled_loss_reads_the_context_and_scores_the_weighted_horizons():
  task = _task('pooled', window=3, horizon=2)
  # Windows of T + H = 5 values; weights[T − 1:] belong to the two horizons.
  batch = task.preprocess({'values': [[1, 2, 3, 4, 5], [0, 0, 1, 2, 9]],
                           'weights': [[0, 0, 1, 1], [0, 0, 1, 0]]})
  model = _Fixed([[4.5, 3.0], [1.0, 100.0]])
  sums = _sums(task.loss(model, batch))
  np.testing.assert_array_equal(model.inputs[0], [[1, 2, 3], [0, 0, 1]])
  # Errors: 0.5, −2 (weighted), −1 (weighted), 91 (weight 0).
  assert sums['loss'] == pytest.approx((0.25 + 4 + 1, 3))
  assert sums['mae'] == pytest.approx((0.5 + 2 + 1, 3))


def test_pooled_horizon_weights_start_at_the_last_context_position():
  # T = 4, H = 2: windows of 6 values, 5 weights of which weights[:, 3:] score the horizons.
  task = _task('pooled', window=4, horizon=2)
  batch = task.preprocess({'values': [[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 2, 3]],
                           'weights': [[1, 1, 1, 1, 0], [0, 0, 0, 0, 1]]})
  model = _Fixed([[4.0, 0.0], [9.0, 1.0]])
  sums = _sums(task.loss(model, batch))
  np.testing.assert_array_equal(model.inputs[0], [[1, 2, 3, 4], [0, 0, 0, 0]])
  # Errors: −1 (weighted), −6 (weight 0), 7 (weight 0), −2 (weighted).
  assert sums['loss'] == pytest.approx((1 + 4, 2))
  assert sums['mae'] == pytest.approx((1 + 2, 2))


def test_shifted_loss_scores_every_weighted_position_against_the_next_value():
  task = _task('shifted', window=3, horizon=1)
  batch = task.preprocess({'values': [[1, 2, 3, 5]], 'weights': [[1, 0, 1]]})
  model = _Fixed([[2.5, 0.0, 4.0]])
  sums = _sums(task.loss(model, batch))
  np.testing.assert_array_equal(model.inputs[0], [[1, 2, 3]])
  # Targets 2, 3, 5: errors 0.5 (weighted), −3 (weight 0), −1 (weighted).
  assert sums['loss'] == pytest.approx((0.25 + 1, 2))
  assert sums['mae'] == pytest.approx((0.5 + 1, 2))


def test_finalize_reports_errors_in_the_series_unit():
  task = _task()
  out = task.finalize({'loss': (2.0, 8.0), 'mae': (1.2, 8.0)})
  # σ = 2 ppm: MAE 0.15 → 0.3 ppm; RMSE √0.25 = 0.5 → 1.0 ppm.
  assert out == pytest.approx({'loss': 0.25, 'mae': 0.15, 'mae_ppm': 0.3, 'rmse_ppm': 1.0})


def test_options_are_checked_inone_sentence():
  assert "task.kind must be one of pooled, shifted, got 'direct'" in one_sentence(
      lambda: _task('direct'))
  assert 'config.data.series_window' in one_sentence(
      lambda: tasks.build('forecasting', {'features': ('x', 'label')}))
  assert "task.kind='shifted' needs config.data.series_horizon=1" in one_sentence(
      lambda: _task('shifted', horizon=2))


def test_a_model_output_of_the_wrong_shape_isone_sentence():
  task = _task('pooled', window=3, horizon=2)
  batch = task.preprocess({'values': np.zeros((2, 5)), 'weights': np.ones((2, 4))})
  message = one_sentence(lambda: task.loss(_Fixed(np.zeros((2, 3))), batch))
  assert message == ('The pooled forecasting task needs model outputs of shape (2, 2) (one value '
                     'per horizon), got (2, 3).')
