r"""Causal convolution next-month forecaster on monthly Mauna Loa CO2, trained on shifted targets.

The monthly series of statsmodels' weekly CO2 (data set `co2`: 526 months,
1958-03 to 2001-12; train 422, validation 52, test 52, in time order) is
standard-scaled with the train split's mean and deviation. Windows of 49
months; a WaveNet stack (gated blocks of dilations 1…16, kernel 2, 32 channels,
receptive field 32 months) reads the first differences and predicts, at every
position, the change to the next month, like a language model over real values
(van den Oord et al. 2016; Bai et al. 2018). AdamW with warmup and cosine
decay; evaluated on the validation split (each month once, from the 48 before
it), reporting the MAE in ppm as well. Forecasts further ahead feed the
predictions back (`models.sequence.forecasting.forecast`).

  python -m experiments.main --config=experiments/configs/co2_forecast_shifted.py \
      --workdir=workdirs/co2_forecast_shifted

Test-split MAE of the 24-month autoregressive forecast at horizons 1, 6, 12, 24
against the last-value and seasonal naive baselines, and the figure:

  python -m experiments.forecast --config=experiments/configs/co2_forecast_shifted.py \
      --workdir=workdirs/co2_forecast_shifted
"""

from experiments.configs import co2_forecast_pooled


def get_config():
  """The pooled config's data, optimiser and schedule; one target per position instead."""
  config = co2_forecast_pooled.get_config()
  # data/series.py: windows of series_window context values and the next value.
  config.data.series_horizon = 1
  config.task.kind = 'shifted'
  del config.model['pooling']
  config.model.name = 'causal_conv_shifted'
  return config
