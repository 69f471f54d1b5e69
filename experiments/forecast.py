r"""Trains a forecasting config, then scores multi-step forecasts of the test split against
naive baselines and draws one forecast.

  python -m experiments.forecast --config=experiments/configs/co2_forecast_shifted.py \
      --workdir=workdirs/co2_forecast_shifted [--num_steps=24 --figure=PATH.png]

1. Trains with the shared train library, as `experiments.main` does (rerunning
   resumes, or finds the run finished and evaluates it again; under a changed
   config only with --allow_config_change).
2. Restores the run's parameters (the EMA when kept) and, on the series of its
   data set, takes every forecast origin o whose next `num_steps` months all
   lie in the test split (o = first test index − 1 … last − num_steps: with
   CO2's 52 test months and 24 steps, 29 origins, 1997-08 to 1999-12). From
   each, with the T context months before it (scaled with the train split's
   statistics, as in training), it forecasts `num_steps` months:
     direct          the pooled model's own H outputs (h ≤ H);
     autoregressive  `models.sequence.forecasting.forecast`: the next-value
                     prediction fed back as input (the pooled model's h = 1
                     head reads the last T values, as in training);
   and scores them, back in ppm, against the truth and against two baselines
   on the same origins and horizons: the last value and the seasonal naive
   forecast (period 12 months).
3. Prints the mean absolute error at horizons 1, 6, 12, 24 and over 1 … N,
   appends every horizon's, with the forecasts, `num_steps`, the checkpoint step
   and the weights evaluated ('ema' or 'params'), as one line to
   `<workdir>/forecast_test.jsonl` (so a rerun with other settings keeps the
   earlier lines; a `forecast_test.json` written before is left as it is), and
   draws a figure (`--figure`, default `<workdir>/forecast.png`): the forecasts
   from the first test origin against the truth, and the MAE at every horizon.
"""

import functools
import os
import sys

from absl import app
from absl import flags
from absl import logging

OUTPUT_FILE = 'forecast_test.jsonl'
REPORTED_HORIZONS = (1, 6, 12, 24)
SEASON = 12  # months


def _check_num_steps(num_steps) -> None:
  if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
    raise ValueError(f'--num_steps must be a positive integer, got {num_steps!r}.')


def forecast_origins(config, meta: dict, num_steps: int, split: str = 'test'):
  """(the series, the indices of `split`'s forecast origins), or ValueError in one sentence
  when the config forecasts no series or `split` is too short for one forecast."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from data import series  # pylint: disable=g-import-not-at-top
  _check_num_steps(num_steps)
  if 'series_window' not in meta:
    raise ValueError(f'The config of data set {config.data.name!r} does not forecast a series '
                     '(it sets no data.series_window).')
  name, options = config.data.name, dict(config.data.get('options') or {})
  values, bounds = series.load_series(name, meta['series_key'],
                                      data_dir=config.data.get('data_dir'), **options)
  if split not in bounds:
    raise ValueError(f'{split!r} is not a split of {name!r}; its splits are: '
                     f'{", ".join(bounds)}.')
  start, stop = bounds[split]
  first = max(start - 1, meta['series_window'] - 1, SEASON - 1)
  origins = np.arange(first, stop - num_steps)
  if not len(origins):
    raise ValueError(f'The {split} split of {name!r} has {stop - start} values, too few for one '
                     f'forecast of --num_steps={num_steps}; give at most {stop - 1 - first}.')
  return values, origins


def train(config, workdir: str, *, allow_config_change: bool = False) -> dict:
  """Trains (or resumes) the run with the shared train library; its final eval metrics."""
  from train import loop  # pylint: disable=g-import-not-at-top
  return loop.setup(config, workdir, allow_config_change=allow_config_change).train()


def evaluate(config, workdir: str, *, num_steps: int = 24, split: str = 'test') -> dict:
  """Forecasts from every origin of `split` and scores them (see the module docstring).

  Returns a JSON-ready record: `num_steps`, the checkpoint step and the weights
  evaluated ('ema' or 'params'), the origins, and for each method the forecasts
  (ppm) and the MAE at every horizon 1 … num_steps.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from data import series  # pylint: disable=g-import-not-at-top
  from models.sequence import forecasting  # pylint: disable=g-import-not-at-top
  from train import checkpoint, loop  # pylint: disable=g-import-not-at-top

  _, _, meta, task, module = loop.build_parts(config, workdir)
  values, origins = forecast_origins(config, meta, num_steps, split)
  load = lambda key: series.load_series(config.data.name, key,
                                        data_dir=config.data.get('data_dir'),
                                        **dict(config.data.get('options') or {}))[0]
  years, months = load('year'), load('month')
  context = meta['series_window']
  history = lambda length: values[origins[:, None] + np.arange(-length + 1, 1)]
  truth_NxS = values[origins[:, None] + np.arange(1, num_steps + 1)]

  saved = checkpoint.restore_arrays(workdir)
  variables = checkpoint.eval_variables(saved)
  scaler = meta['scaler']
  scaled_NxT = series.scale(scaler, history(context))
  model = config.model.name
  forecasts = {}
  if task.kind == 'pooled':
    direct_NxH = series.unscale(scaler, jax.device_get(
        module.apply(variables, scaled_NxT, train=False)))
    forecasts[f'{model} (direct)'] = direct_NxH[:, :num_steps]
  window = context if task.kind == 'pooled' else None
  auto_NxS = forecasting.forecast(module, variables, scaled_NxT, num_steps, window=window)
  forecasts[f'{model} (autoregressive)'] = series.unscale(scaler, jax.device_get(auto_NxS))
  baseline_history = history(max(context, SEASON))
  forecasts['last value'] = forecasting.last_value_forecast(baseline_history, num_steps)
  forecasts[f'seasonal naive ({SEASON} months)'] = forecasting.seasonal_naive_forecast(
      baseline_history, num_steps, SEASON)

  date = lambda i: f'{int(years[i]):04d}-{int(months[i]):02d}'
  methods = {}
  for method, forecast_NxS in forecasts.items():
    forecast_NxS = np.asarray(forecast_NxS, np.float64)
    error_NxS = np.abs(forecast_NxS - truth_NxS[:, :forecast_NxS.shape[1]])
    methods[method] = {'mae_by_horizon': error_NxS.mean(axis=0).tolist(),
                       'forecasts': forecast_NxS.tolist()}
  return {'split': split, 'unit': meta['unit'], 'num_steps': num_steps,
          'context': context, 'checkpoint_step': int(saved['step']),
          'weights': 'params' if saved.get('ema_params') is None else 'ema',
          'origins': [date(i) for i in origins],
          'origin_indices': origins.tolist(), 'truth': truth_NxS.tolist(),
          'history': history(context).tolist(),
          'dates': [date(i) for i in range(len(values))],
          'methods': methods}


def table(record: dict) -> str:
  """The MAE at the reported horizons and over all of them, one row per method."""
  steps = record['num_steps']
  horizons = [h for h in REPORTED_HORIZONS if h <= steps]
  header = f'{"method":<42}' + ''.join(f'{f"h={h}":>8}' for h in horizons) + f'{f"1-{steps}":>8}'
  lines = [f'{record["split"]} MAE ({record["unit"]}) over {len(record["origins"])} forecast '
           f'origins {record["origins"][0]} … {record["origins"][-1]}', header]
  for method, scores in record['methods'].items():
    mae = scores['mae_by_horizon']
    cells = ''.join(f'{mae[h - 1]:8.3f}' if h <= len(mae) else f'{"—":>8}' for h in horizons)
    mean = f'{sum(mae) / len(mae):8.3f}' if len(mae) == steps else f'{"—":>8}'
    lines.append(f'{method:<42}{cells}{mean}')
  return '\n'.join(lines)


def plot(record: dict, output: str, title: str = '') -> None:
  """Left: every method's forecast from the first origin, the truth and the context before it;
  right: the MAE at every horizon."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')  # Files only; no display is needed.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def year(date):
    y, m = date.split('-')
    return int(y) + (int(m) - 1) / 12

  origin = record['origin_indices'][0]
  steps, context = record['num_steps'], record['context']
  dates = record['dates']
  past = [year(dates[i]) for i in range(origin - context + 1, origin + 1)]
  future = [year(dates[i]) for i in range(origin + 1, origin + 1 + steps)]
  fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=[3, 2])
  left.plot(past, record['history'][0], color='black', label=f'context ({context} months)')
  left.plot(future, record['truth'][0], color='black', linestyle='--', marker='.',
            label='truth (test split)')
  horizons = np.arange(1, steps + 1)
  for method, scores in record['methods'].items():
    forecast = scores['forecasts'][0]
    baseline = method.startswith(('last value', 'seasonal naive'))
    style = dict(linewidth=1, alpha=0.7) if baseline else dict(linewidth=2)
    left.plot(future[:len(forecast)], forecast, label=method, **style)
    right.plot(horizons[:len(scores['mae_by_horizon'])], scores['mae_by_horizon'], label=method,
               **style)
  left.axvline(year(dates[origin]), color='grey', linewidth=0.5)
  left.set_xlabel('year')
  left.set_ylabel(f'CO2 ({record["unit"]})' if record['unit'] == 'ppm' else record['unit'])
  left.set_title(f'forecast from {dates[origin]} ({steps} months)')
  left.legend(fontsize=8)
  right.set_xlabel('horizon h (months)')
  right.set_ylabel(f'MAE ({record["unit"]})')
  right.set_title(f'{record["split"]} MAE over {len(record["origins"])} origins')
  right.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=100)
  plt.close(fig)


def write_record(workdir: str, record: dict) -> str:
  """Appends `record` as one line to `<workdir>/forecast_test.jsonl`; returns the path."""
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.abspath(workdir), OUTPUT_FILE)
  command_line.append_record(path, record)
  return path


def run(config, workdir: str, *, num_steps: int = 24, figure: str | None = None,
        allow_config_change: bool = False) -> dict:
  """The command: trains, evaluates, prints the table, appends the record and draws the
  figure."""
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  from train import loop  # pylint: disable=g-import-not-at-top
  figure = figure or os.path.join(workdir, 'forecast.png')
  try:
    command_line.output_file(figure, 'figure')
    command_line.record_file(workdir, OUTPUT_FILE, 'the record is appended to')
    # Whether the config forecasts and the test split holds a forecast, before training.
    forecast_origins(config, loop.build_parts(config, workdir)[2], num_steps)
    final = train(config, workdir, allow_config_change=allow_config_change)
    print('final eval: ' + ' '.join(f'{k}={v:.4f}' for k, v in sorted(final.items())))
    record = evaluate(config, workdir, num_steps=num_steps)
  except loop.Stopped as e:
    sys.stderr.write(f'{e}\n')
    sys.exit(e.exit_code)
  except (ValueError, FileNotFoundError, app.UsageError) as e:
    sys.exit(f'error: {e}')
  print(table(record))
  path = write_record(workdir, record)
  plot(record, figure, title=f'{config.model.name} on {config.data.name}, step '
       f'{record["checkpoint_step"]}')
  print(f'appended to {path}; figure written to {figure}', file=sys.stderr)
  return record


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (a forecasting one).')
  command_line.load_config_files_with('config')
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs, metrics and the results.')
  flags.DEFINE_integer('num_steps', 24, 'Months forecast from each test origin.')
  flags.DEFINE_string('figure', None, 'PNG to write (default: <workdir>/forecast.png).')
  flags.DEFINE_bool('allow_config_change', False, 'Resume the checkpoints of --workdir although '
                    'the config differs from the one that wrote them beyond what a resume takes '
                    'as it is (step counts, intervals, checkpoints_to_keep, max_bad_steps, '
                    'profile_steps, parallel settings, data paths and reader threads).')


def main(argv):
  del argv  # parse_flags refused any positional argument
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO.
  run(flags.FLAGS.config, flags.FLAGS.workdir, num_steps=flags.FLAGS.num_steps,
      figure=flags.FLAGS.figure, allow_config_change=flags.FLAGS.allow_config_change)


if __name__ == '__main__':
  from experiments import command_line  # pylint: disable=g-import-not-at-top
  define_flags()
  command_line.run(main, flags_parser=functools.partial(command_line.parse_flags, doc=__doc__,
                                                             example='co2_forecast_shifted'))
