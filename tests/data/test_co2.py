"""The CO2 builder and the series windows against independent references.

References: the weekly statsmodels data averaged per calendar month by a plain
NumPy loop (not pandas' resample) with its gaps interpolated by hand, the split
rule worked out by hand (526 months: 422 / 52 / 52), and brute-force slicing of
the series for every window.
"""

import ml_collections
import numpy as np
import pytest

from data import datasets
from data import series
from data.builders import co2

SPLITS = ('train', 'validation', 'test')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  # One folder per session (tests/experiments/test_forecast.py uses it too), prepared once.
  path = str(tmp_path_factory.getbasetemp() / 'co2_data')
  for split in SPLITS:
    datasets.load('co2', split, data_dir=path)
  return path


def _records(data_dir, split):
  source = datasets.load('co2', split, data_dir=data_dir)
  return [source[i] for i in range(len(source))]


def _monthly_by_hand():
  """(year, month, value, was_gap) per month from the weekly data, by a NumPy loop."""
  from statsmodels.datasets import co2 as statsmodels_co2  # pylint: disable=g-import-not-at-top
  weekly = statsmodels_co2.load_pandas().data['co2']
  keys = np.array([d.year * 12 + d.month - 1 for d in weekly.index])
  values = weekly.to_numpy(np.float64)
  first, last = keys.min(), keys.max()
  months = np.arange(first, last + 1)
  means = np.full(len(months), np.nan)
  for i, key in enumerate(months):
    measured = values[(keys == key) & ~np.isnan(values)]
    if len(measured):
      means[i] = measured.sum() / len(measured)
  gaps = np.isnan(means)
  known = np.flatnonzero(~gaps)
  for i in np.flatnonzero(gaps):
    a, b = known[known < i].max(), known[known > i].min()
    means[i] = means[a] + (means[b] - means[a]) * (i - a) / (b - a)
  return months // 12, months % 12 + 1, means, gaps


def test_split_sizes_follow_the_rule_worked_out_by_hand(data_dir):
  sizes = {split: len(datasets.load('co2', split, data_dir=data_dir)) for split in SPLITS}
  # 526 months; n // 10 = 52 for test, 52 for validation, 526 − 104 = 422 for train.
  assert sizes == {'train': 422, 'validation': 52, 'test': 52}
  assert co2.split_bounds(526) == {'train': (0, 422), 'validation': (422, 474), 'test': (474, 526)}


def test_split_bounds_of_the_shortest_series_and_refusal_of_shorter_ones():
  # n // 10 months each for test and validation: 1 each from n = 10 to 19, 2 at n = 20.
  assert co2.split_bounds(10) == {'train': (0, 8), 'validation': (8, 9), 'test': (9, 10)}
  assert co2.split_bounds(19) == {'train': (0, 17), 'validation': (17, 18), 'test': (18, 19)}
  assert co2.split_bounds(20) == {'train': (0, 16), 'validation': (16, 18), 'test': (18, 20)}
  for n in (9, 1):
    with pytest.raises(ValueError, match='too short to split'):
      co2.split_bounds(n)


def test_splits_are_consecutive_months_in_time_order_without_overlap(data_dir):
  months = [(r['year'], r['month']) for split in SPLITS for r in _records(data_dir, split)]
  index = [12 * year + month - 1 for year, month in months]
  # Every month follows the one before: ordered, no month twice, none missing, and the
  # last month of each split is followed by the first of the next.
  assert np.all(np.diff(index) == 1)
  assert months[0] == (1958, 3) and months[-1] == (2001, 12)
  firsts = {split: (_records(data_dir, split)[0]['year'], _records(data_dir, split)[0]['month'])
            for split in SPLITS}
  assert firsts == {'train': (1958, 3), 'validation': (1993, 5), 'test': (1997, 9)}


def test_values_are_monthly_means_with_gaps_interpolated(data_dir):
  years, months, means, gaps = _monthly_by_hand()
  got = [r for split in SPLITS for r in _records(data_dir, split)]
  assert len(got) == len(means) == 526
  assert [r['year'] for r in got] == years.tolist()
  assert [r['month'] for r in got] == months.tolist()
  np.testing.assert_allclose([r['co2'] for r in got], means, rtol=1e-6)
  assert [r['interpolated'] for r in got] == gaps.tolist()
  filled = [(r['year'], r['month']) for r in got if r['interpolated']]
  assert filled == [(1958, 6), (1958, 10), (1964, 2), (1964, 3), (1964, 4)]


def _config(data_dir, window=24, horizon=6, eval_split='test'):
  return ml_collections.ConfigDict({
      'name': 'co2', 'train_split': 'train', 'eval_split': eval_split, 'data_dir': data_dir,
      'options': {}, 'series_key': 'co2', 'series_window': window, 'series_horizon': horizon})


def test_scaler_is_fitted_on_the_train_split_only(data_dir):
  train, _, meta = series.make_sources(_config(data_dir), '')
  raw = np.array([r['co2'] for split in SPLITS for r in _records(data_dir, split)], np.float64)
  mu, sigma = raw[:422].mean(), raw[:422].std()
  # Fitted on all 526 months the mean would be 339.6 ppm, not the train split's 333.8.
  assert abs(raw.mean() - mu) > 5
  np.testing.assert_allclose(np.asarray(meta['scaler'].mean), [mu], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(meta['scaler'].scale), [sigma], rtol=1e-5)
  window = train[0]['values']
  np.testing.assert_allclose(window, (raw[:30] - mu) / sigma, rtol=1e-5, atol=1e-5)
  assert meta['unit'] == 'ppm' and meta['model_defaults'] == {'horizon': 6}
  assert meta['series_window'] == 24 and meta['series_horizon'] == 6


def test_the_horizon_defaults_to_one(data_dir):
  config = _config(data_dir, window=24)
  config.series_horizon = None
  train, evaluation, meta = series.make_sources(config, '')
  assert meta['series_horizon'] == 1 and meta['model_defaults'] == {'horizon': 1}
  # Windows of T + 1 values: offsets 0 … 422 − 25, and one origin per test month.
  assert train[0]['values'].shape == (25,) and len(train) == 422 - 25 + 1
  assert len(evaluation) == 52


def test_training_windows_lie_inside_the_train_split(data_dir):
  train, _, meta = series.make_sources(_config(data_dir), '')
  raw = np.array([r['co2'] for r in _records(data_dir, 'train')], np.float32)
  scaled = series.scale(meta['scaler'], raw)
  # Every offset w = 0 … 422 − 30: no value of validation or test is an input or a target.
  assert len(train) == 422 - 30 + 1 and len(train.values) == 422
  batch = train.gather(np.arange(len(train)))
  expected = np.stack([scaled[w:w + 30] for w in range(len(train))])
  np.testing.assert_array_equal(batch['values'], expected)
  assert np.all(batch['weights'] == 1)


@pytest.mark.parametrize('context, horizon, start', [(4, 3, 10), (4, 1, 10), (6, 2, 3), (1, 2, 0)])
def test_evaluation_windows_equal_brute_force_slices(context, horizon, start):
  x = np.arange(100, 118, dtype=np.float32)  # the series up to the split's end
  windows = series.SeriesWindows(x, start, context=context, horizon=horizon, training=False)
  stop = len(x)
  origins = [o for o in range(start - 1, stop - 1) if o >= context - 1]
  assert len(windows) == len(origins)
  batch = windows.gather(np.arange(len(windows)))
  for i, o in enumerate(origins):
    values = [x[t] if t < stop else 0 for t in range(o - context + 1, o + horizon + 1)]
    # Target j is x[o − T + 2 + j]; weighted iff after the origin and inside the split.
    weights = [float(o < t < stop) for t in range(o - context + 2, o + horizon + 1)]
    np.testing.assert_array_equal(batch['values'][i], values)
    np.testing.assert_array_equal(batch['weights'][i], weights)
  assert batch['values'].dtype == np.float32 and batch['weights'].dtype == np.float32
  assert windows.origins(np.arange(len(windows))).tolist() == origins
  # At every horizon h each value of the split after the first origin's is scored once.
  scored = batch['weights'][:, context - 1:].sum(axis=0)
  first = max(start, context)
  assert scored.tolist() == [stop - first - h + 1 for h in range(1, horizon + 1)]


def test_evaluation_context_reaches_back_but_targets_stay_in_the_split(data_dir):
  _, evaluation, meta = series.make_sources(_config(data_dir, window=24, horizon=6), '')
  raw = np.array([r['co2'] for split in SPLITS for r in _records(data_dir, split)], np.float32)
  scaled = series.scale(meta['scaler'], raw)
  assert len(evaluation) == 52  # one origin per test month: 473 … 524
  first = evaluation[0]
  np.testing.assert_array_equal(first['values'], scaled[473 - 23:473 + 7])
  assert first['weights'][:23].sum() == 0 and first['weights'][23:].tolist() == [1] * 6
  last = evaluation[51]  # origin 524: only its horizon-1 target, month 525, is in the split
  assert last['weights'][23:].tolist() == [1, 0, 0, 0, 0, 0]


def test_evaluation_on_a_middle_split_holds_no_value_of_the_splits_after_it(data_dir):
  _, evaluation, meta = series.make_sources(
      _config(data_dir, window=24, horizon=6, eval_split='validation'), '')
  raw = np.array([r['co2'] for split in SPLITS for r in _records(data_dir, split)], np.float32)
  scaled = series.scale(meta['scaler'], raw)
  # Validation is months 422 … 473: one origin per month, 421 … 472.
  assert len(evaluation) == 52 and len(evaluation.values) == 474
  batch = evaluation.gather(np.arange(52))
  np.testing.assert_array_equal(batch['values'][0], scaled[421 - 23:421 + 7])
  # Origin 472: its horizon-1 target, month 473, ends the split; the test months after it
  # are padded with 0 and not scored.
  last = evaluation[51]
  np.testing.assert_array_equal(last['values'], np.append(scaled[472 - 23:474], [0] * 5))
  assert last['weights'][23:].tolist() == [1, 0, 0, 0, 0, 0]
  # At horizon h the months 421 + h … 473 are scored, each once.
  assert batch['weights'][:, 23:].sum(axis=0).tolist() == [53 - h for h in range(1, 7)]


def test_unscale_undoes_scale_with_the_train_statistics():
  # Train values 1 and 3: μ = 2, σ = 1 (the 1/n standard deviation).
  scaler = series.fit_scaler(np.array([1.0, 3.0, 10.0, 20.0]), {'train': (0, 2)})
  x = np.array([[2.5, 1.0], [10.0, -4.0]], np.float32)
  np.testing.assert_allclose(series.scale(scaler, x), x - 2, atol=1e-6)
  np.testing.assert_allclose(series.unscale(scaler, np.array([0.5, -1.0])), [2.5, 1.0], atol=1e-6)
  scaler = series.fit_scaler(np.array([0.0, 4.0, 100.0]), {'train': (0, 2)})  # μ = 2, σ = 2
  np.testing.assert_allclose(series.unscale(scaler, series.scale(scaler, x)), x, atol=1e-5)
  np.testing.assert_allclose(series.unscale(scaler, np.array([1.5])), [5.0], atol=1e-6)


def test_scaler_reads_the_train_split_where_its_bounds_put_it():
  # A train split after another one: values 1 and 3 only, μ = 2 and σ = 1.
  scaler = series.fit_scaler(np.array([50.0, -20.0, 1.0, 3.0, 9.0]), {'train': (2, 4)})
  np.testing.assert_allclose(series.scale(scaler, np.array([2.0, 4.0])), [0.0, 2.0], atol=1e-6)


@pytest.mark.parametrize('key, value, words', [
    ('series_window', 0, 'data.series_window must be a positive integer, not 0'),
    ('series_horizon', -1, 'data.series_horizon must be a positive integer, not -1'),
    ('series_window', True, 'data.series_window must be a positive integer, not True'),
    ('train_split', 'training', "data.train_split='training' is not a split of the series 'co2'"),
    ('eval_split', 'valid', "data.eval_split='valid' is not a split of the series 'co2'"),
    ('series_key', 'ppm', "Data set 'co2' has no feature 'ppm'"),
])
def test_bad_options_fail_in_one_sentence(data_dir, key, value, words):
  config = _config(data_dir)
  config[key] = value
  with pytest.raises(ValueError) as info:
    series.make_sources(config, '')
  message = str(info.value)
  assert words in message and '\n' not in message and message.endswith('.')


def test_a_window_longer_than_the_train_split_is_refused(data_dir):
  with pytest.raises(ValueError, match='too short for one training window of context 420 and '
                                       'horizon 6'):
    series.make_sources(_config(data_dir, window=420), '')


@pytest.mark.parametrize('training, size', [(True, 7), (False, 5)])
def test_a_split_one_value_too_short_for_its_first_window_is_refused(training, size):
  # T = 4, H = 3: a training window needs T + H = 7 values; the first evaluation origin
  # (o = T − 1 = 3 for a split starting at 0) needs one value after it, 5 values.
  x = np.arange(size, dtype=np.float32)
  assert len(series.SeriesWindows(x, 0, context=4, horizon=3, training=training)) == 1
  with pytest.raises(ValueError, match='too short for one'):
    series.SeriesWindows(x[:-1], 0, context=4, horizon=3, training=training)


@pytest.mark.parametrize('training', [True, False])
def test_window_indices_outside_the_source_are_refused(training):
  x = np.arange(100, 112, dtype=np.float32)
  windows = series.SeriesWindows(x, 4, context=3, horizon=2, training=training)
  n = len(windows)
  assert n == (12 - 4 - 5 + 1 if training else 12 - 1 - 3)  # offsets 4 … 7, or origins 3 … 10
  with pytest.raises(IndexError):
    windows.gather(np.array([0, n]))
  with pytest.raises(IndexError):
    windows.gather(np.array([-1]))
  with pytest.raises(IndexError):
    windows[n]
  with pytest.raises(IndexError):
    windows[-n - 1]
  # Negative indices count from the end, as for a list.
  np.testing.assert_array_equal(windows[-1]['values'], windows[n - 1]['values'])
  np.testing.assert_array_equal(windows[-n]['values'], windows[0]['values'])
