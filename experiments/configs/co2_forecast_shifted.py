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

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'co2'
  config.data.train_split = 'train'
  config.data.eval_split = 'validation'
  # data/series.py: windows of series_window context values and the next value.
  config.data.series_key = 'co2'
  config.data.series_window = 48
  config.data.series_horizon = 1
  config.task = ml_collections.ConfigDict({'name': 'forecasting', 'kind': 'shifted'})
  config.model = ml_collections.ConfigDict({
      'name': 'causal_conv_shifted', 'channels': 32, 'kernel_size': 2,
      'dilations': (1, 2, 4, 8, 16), 'num_stacks': 1, 'predict_change': True,
      'dropout_rate': 0.0, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 1e-4
  config.optimizer.grad_clip_norm = 1.0
  config.global_batch_size = 32
  config.eval_batch_size = 64
  config.num_train_steps = 2000
  config.log_every_steps = 200
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 1000
  return config
