"""Forecasting a real-valued series: squared error, weighted per target, and absolute error.

Batches are windows of T + H scaled values with one weight per target
(`data.series`). Two kinds of model:

  pooled   `model(x [B, T]) → ŷ [B, H]`: the T context values in, the next H
           values out (targets v_T … v_{T+H−1}, weights[:, T−1:]);
  shifted  `model(x [B, T+H−1]) → ŷ [B, T+H−1]`, causal: position t predicts
           v_{t+1} (targets shifted by one, one weight per position, like a
           language model); with H = 1, so that evaluation scores only the
           forecast from the window's origin.

Reports, as weighted sums over every weighted target, `loss` (the mean squared
error) and `mae` in the scaled unit (standard scaling fitted on the train
split), and in `finalize` the same errors in the series' own unit: with
x = σ z + μ, |x̂ − x| = σ |ẑ − z|, so `mae_<unit>` = σ · mae and
`rmse_<unit>` = σ · √loss (e.g. `mae_ppm` for CO2).
"""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from train.tasks import base

KINDS = ('pooled', 'shifted')


@dataclasses.dataclass(frozen=True)
class Forecasting(base.Task):
  """Squared-error forecasting of a scaled series (see the module docstring).

  Options:
    kind: 'pooled' (the model forecasts the H values after its T inputs) or
      'shifted' (the model predicts the next value at every position).
  """
  kind: str = 'pooled'

  def validate(self):
    if self.kind not in KINDS:
      raise ValueError(f'task.kind must be one of {", ".join(KINDS)}, got {self.kind!r}.')
    if 'series_window' not in self.meta:
      raise ValueError('The forecasting task needs series windows: set config.data.series_window '
                       '(and config.data.series_key, config.data.series_horizon).')
    if self.kind == 'shifted' and self.meta['series_horizon'] != 1:
      raise ValueError(f'task.kind=\'shifted\' needs config.data.series_horizon=1 (the model '
                       f'forecasts further by feeding back its predictions), got '
                       f'{self.meta["series_horizon"]!r}.')

  @property
  def context(self) -> int:
    return self.meta['series_window']

  def preprocess(self, records):
    return {'values': np.asarray(records['values'], np.float32),
            'weights': np.asarray(records['weights'], np.float32)}

  def model_inputs(self, batch):
    values = batch['values']
    return (values[:, :self.context],) if self.kind == 'pooled' else (values[:, :-1],)

  def targets(self, batch):
    """(targets, weights) matching the model's output for `batch`."""
    values, weights = batch['values'], batch['weights']
    if self.kind == 'pooled':
      return values[:, self.context:], weights[:, self.context - 1:]
    return values[:, 1:], weights

  def loss(self, model, batch):
    prediction = model(*self.model_inputs(batch)).astype(jnp.float32)
    targets, weights = self.targets(batch)
    if prediction.shape != targets.shape:
      what = ('one value per horizon' if self.kind == 'pooled' else
              'one next value per input position')
      raise ValueError(f'The {self.kind} forecasting task needs model outputs of shape '
                       f'{tuple(targets.shape)} ({what}), got {tuple(prediction.shape)}.')
    error = prediction - targets
    return {'loss': base.mean_over(jnp.square(error), weights),
            'mae': base.mean_over(jnp.abs(error), weights)}

  def finalize(self, totals):
    out = super().finalize(totals)
    sigma = float(np.asarray(self.meta['scaler'].scale).reshape(-1)[0])
    unit = self.meta.get('unit', 'unscaled')
    out[f'mae_{unit}'] = sigma * out['mae']
    out[f'rmse_{unit}'] = sigma * math.sqrt(out['loss'])
    return out
