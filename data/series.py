"""Random-access windows over a real-valued series, for forecasting.

A series data set (e.g. `co2`) stores one record per time step, its splits
consecutive in time (the builder's `SPLITS` order). The splits are joined into
one series x_0 … x_{n−1}; split s holds x_{start_s} … x_{stop_s − 1}.

Scaling: μ and σ of standard scaling (`data.scaling`) are fitted on the train
split's values only, and every window, of any split, is (x − μ) / σ with them.

A window of context T and horizon H is T + H consecutive values
v_j = x_{w+j} (j = 0 … T+H−1) and one weight per *target* v_{j+1}
(j = 0 … T+H−2), so one record serves both kinds of forecaster:

  pooled    reads v_0 … v_{T−1} (the context, ending at the forecast origin
            o = w + T − 1) and predicts v_T … v_{T+H−1}, i.e. x_{o+1} … x_{o+H}
            (targets weighted by weights[T−1:]);
  shifted   reads v_0 … v_{T+H−2} and predicts, at every position j, v_{j+1}
            (like a language model; targets weighted by all the weights).

  training    every window lying wholly inside the train split (offsets
              w = start … stop − T − H), all weights 1: no value of a later
              split (validation, test) is ever an input or a target;
  evaluation  one window per forecast origin o = start − 1 … stop − 2 (and
              o ≥ T − 1), so the first value of the split is the horizon-1
              target of the first window; the context may reach back into
              the splits before (the past, known at forecasting time). Only
              the targets after the origin that lie in the split are weighted
              (context positions and values past the split's end get 0; the
              latter are padded with 0), so at horizon h the values
              x_{o_1+h} … x_{stop−1} are each scored once, o_1 = max(start − 1,
              T − 1) being the first origin: the split's first h − 1 values
              (more if start < T) are not scored at horizon h.
"""

import numpy as np

from data import datasets
from data import pipeline
from data import scaling


class SeriesWindows:
  """Windows of `context` + `horizon` values over a scaled series, as a random-access source.

  Record i is {'values': float32[T + H], 'weights': float32[T + H − 1]} (see the
  module docstring). `values` holds the series up to the split's end only: a
  training source is built from the train split alone.

  Args:
    values: the scaled series from its first value to the end of the split.
    start: index of the split's first value in `values`.
    context, horizon: T and H.
    training: training windows (inside the split, every target weighted) or
      evaluation windows (one per forecast origin).
  """

  def __init__(self, values: np.ndarray, start: int, *, context: int, horizon: int, training: bool):
    self.values = np.asarray(values, np.float32)
    self.start, self.stop = int(start), len(self.values)
    self.context, self.horizon, self.training = int(context), int(horizon), training
    length = self.context + self.horizon
    if training:
      self._first = self.start  # the window offsets w
      self._len = self.stop - self.start - length + 1
      needed = f'at least T + H = {length} values'
    else:
      # Origins o = max(start − 1, T − 1) … stop − 2, window offset w = o − T + 1.
      self._first = max(self.start - 1, self.context - 1) - self.context + 1
      self._len = self.stop - 1 - (self._first + self.context - 1)
      needed = f'T = {self.context} values before its second value'
    if self._len < 1:
      kind = 'training' if training else 'evaluation'
      raise ValueError(f'A split of {self.stop - self.start} values (of {self.stop} up to its end) '
                       f'is too short for one {kind} window of context {self.context} and horizon '
                       f'{self.horizon}; it needs {needed}.')
    self._padded = np.concatenate([self.values, np.zeros(self.horizon, np.float32)])
    self._window = np.arange(length)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> dict:
    if not -self._len <= index < self._len:
      raise IndexError(f'Window {index} is out of range for {self._len} windows.')
    batch = self.gather(np.array([index % self._len]))
    return {key: value[0] for key, value in batch.items()}

  def origins(self, indices: np.ndarray) -> np.ndarray:
    """The forecast origin o (index of the last context value in the series) of each window."""
    return self._first + np.asarray(indices, np.int64) + self.context - 1

  def gather(self, indices: np.ndarray) -> dict:
    """The windows `indices` stacked: 'values' float32 [B, T + H], 'weights' [B, T + H − 1]."""
    indices = np.asarray(indices, np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= self._len):
      raise IndexError(f'Window indices must lie in [0, {self._len}).')
    positions_BxL = (self._first + indices)[:, None] + self._window
    targets_BxL1 = positions_BxL[:, 1:]
    weighted_BxL1 = targets_BxL1 < self.stop
    if not self.training:
      weighted_BxL1 &= targets_BxL1 > positions_BxL[:, self.context - 1:self.context]
    return {'values': self._padded[positions_BxL], 'weights': weighted_BxL1.astype(np.float32)}


def split_order(name: str) -> tuple[str, ...]:
  """The splits of series data set `name` in time order (its builder's `SPLITS`)."""
  builder_cls = datasets.LOCAL_BUILDERS.get(name)
  if builder_cls is None:
    raise ValueError(f'data.series_window needs a local series data set whose splits follow '
                     f'each other in time; {name!r} is not one of: '
                     f'{", ".join(datasets.LOCAL_BUILDERS)}.')
  return tuple(builder_cls.SPLITS)


def load_series(name: str, key: str, *, data_dir=None, **options) -> tuple[np.ndarray, dict]:
  """(x float64 [n], {split: (start, stop)}): every split's `key` values joined in time order."""
  pieces, bounds, start = [], {}, 0
  for split in split_order(name):
    source = datasets.load(name, split, data_dir=data_dir, **options)
    records = pipeline.read_batch(source, np.arange(len(source)))
    if key not in records:
      raise ValueError(f'Data set {name!r} has no feature {key!r}; its features are: '
                       f'{", ".join(sorted(records))}.')
    values = np.asarray(records[key], np.float64)
    if values.ndim != 1:
      raise ValueError(f'Feature {key!r} of data set {name!r} has shape {values.shape[1:]} per '
                       'record; a series needs one number per record.')
    pieces.append(values)
    bounds[split] = (start, start + len(values))
    start += len(values)
  return np.concatenate(pieces), bounds


def fit_scaler(series: np.ndarray, bounds: dict, train_split: str = 'train') -> scaling.Scaler:
  """Standard scaling fitted on the train split's values only."""
  start, stop = bounds[train_split]
  return scaling.fit(np.asarray(series[start:stop], np.float32)[:, None])


def scale(scaler: scaling.Scaler, x: np.ndarray) -> np.ndarray:
  """(x − μ) / σ of any array of series values."""
  x = np.asarray(x, np.float32)
  return np.asarray(scaling.transform(scaler, x.reshape(-1, 1)), np.float32).reshape(x.shape)


def unscale(scaler: scaling.Scaler, z: np.ndarray) -> np.ndarray:
  """z σ + μ: scaled values back in the series' unit."""
  z = np.asarray(z, np.float32)
  x = scaling.inverse_transform(scaler, z.reshape(-1, 1))
  return np.asarray(x, np.float32).reshape(z.shape)


def _positive_int(data_config, key: str, default=None) -> int:
  value = data_config.get(key, default)
  if value is None:
    value = default
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f'data.{key} must be a positive integer, not {value!r}.')
  return value


def make_sources(data_config, workdir: str) -> tuple[SeriesWindows, SeriesWindows, dict]:
  """Training and evaluation windows of a series data set, and what task and model need.

  Args:
    data_config: `name`, `train_split`, `eval_split`, `data_dir`, `options`,
      `series_key` (the feature holding the series), `series_window` (T) and
      `series_horizon` (H, default 1).
    workdir: unused (the scaler is refitted from the train split every time).

  Returns:
    (train windows, eval windows, meta) with meta holding 'scaler' (fitted on
    the train split), 'unit' (the builder's `UNIT`, e.g. 'ppm'),
    'series_window', 'series_horizon' and 'model_defaults' {'horizon': H}.
  """
  del workdir
  name = data_config.name
  context = _positive_int(data_config, 'series_window')
  horizon = _positive_int(data_config, 'series_horizon', 1)
  order = split_order(name)
  for which in ('train_split', 'eval_split'):
    if data_config[which] not in order:
      raise ValueError(f'data.{which}={data_config[which]!r} is not a split of the series '
                       f'{name!r}; its splits, in time order, are: {", ".join(order)}.')
  key = data_config.get('series_key')
  if not key:
    raise ValueError(f'data.series_key must name the feature of {name!r} that holds the series.')
  series, bounds = load_series(name, key, data_dir=data_config.get('data_dir'),
                               **dict(data_config.get('options') or {}))
  scaler = fit_scaler(series, bounds, data_config.train_split)
  scaled = scale(scaler, series)
  train_start, train_stop = bounds[data_config.train_split]
  eval_start, eval_stop = bounds[data_config.eval_split]
  # The training source never holds a value after the train split (nor before it).
  train = SeriesWindows(scaled[train_start:train_stop], 0, context=context, horizon=horizon,
                        training=True)
  evaluation = SeriesWindows(scaled[:eval_stop], eval_start, context=context, horizon=horizon,
                             training=False)
  meta = {'scaler': scaler, 'unit': getattr(datasets.LOCAL_BUILDERS[name], 'UNIT', 'unscaled'),
          'series_key': key, 'series_window': context, 'series_horizon': horizon,
          'model_defaults': {'horizon': horizon}}
  return train, evaluation, meta
