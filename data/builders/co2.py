"""Mauna Loa atmospheric CO2 as a monthly series, split chronologically.

The weekly flask measurements shipped inside statsmodels
(`statsmodels.datasets.co2`, Keeling & Whorf 2004, "Atmospheric CO2
concentrations derived from flask air samples at sites in the SIO network";
2,284 weeks from 1958-03-29 to 2001-12-29, 59 of them missing) become one value
per calendar month:

  1. monthly mean of the weeks measured in that month (pandas
     `resample('MS').mean()`, which skips missing weeks): 526 months from
     1958-03 to 2001-12, of which 5 have no measured week (1958-06, 1958-10,
     1964-02, 1964-03, 1964-04);
  2. those 5 gaps filled by linear interpolation between the neighbouring
     months (`interpolate(method='linear')`, equal spacing per month); their
     records say `interpolated`.

Record `i` is month `i` (in ppm, parts per million by volume). The splits are
consecutive and do not overlap, in time order: the last `n // 10` months are
'test', the `n // 10` before them 'validation', the rest 'train' — for n = 526:
train 422 (1958-03 to 1993-04), validation 52 (1993-05 to 1997-08), test 52
(1997-09 to 2001-12). Preparing reads the CSV file inside the statsmodels
package, so it needs no network.
"""

import numpy as np
import tensorflow_datasets as tfds

# The splits in time order; `data.series` builds evaluation windows whose context
# reaches back into the splits before.
SPLITS = ('train', 'validation', 'test')
UNIT = 'ppm'


class Co2(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """One record per month: 'co2' (ppm), 'year', 'month' (1..12), 'interpolated'."""

  name = 'jaxlab_co2'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = SPLITS
  UNIT = UNIT  # of 'co2', for reports in the original unit (`data.series`)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'co2': tfds.features.Tensor(shape=(), dtype=np.float32),
            'year': tfds.features.Tensor(shape=(), dtype=np.int32),
            'month': tfds.features.Tensor(shape=(), dtype=np.int32),
            'interpolated': tfds.features.Tensor(shape=(), dtype=np.bool_),
        }),
        homepage='https://www.statsmodels.org/stable/datasets/generated/co2.html',
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    months = monthly_series()
    bounds = split_bounds(len(months['co2']))
    return {name: self._generate_examples(months, *bounds[name]) for name in SPLITS}

  def _generate_examples(self, months, start, stop):
    for i in range(start, stop):
      yield i, {key: values[i] for key, values in months.items()}


def monthly_series() -> dict[str, np.ndarray]:
  """The whole monthly series (see the module docstring) as arrays of equal length."""
  # Imported here: only preparing needs statsmodels and pandas.
  from statsmodels.datasets import co2  # pylint: disable=g-import-not-at-top
  weekly = co2.load_pandas().data['co2']
  monthly = weekly.resample('MS').mean()
  gaps = monthly.isna().to_numpy()
  filled = monthly.interpolate(method='linear')
  return {'co2': filled.to_numpy(np.float32),
          'year': monthly.index.year.to_numpy(np.int32),
          'month': monthly.index.month.to_numpy(np.int32),
          'interpolated': gaps}


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
  """[start, stop) of each split of a series of `n` months: the last n // 10 test, the n // 10
  before validation, the rest train."""
  held_out = n // 10
  if held_out < 1:
    raise ValueError(f'A series of {n} months is too short to split; it needs at least 10.')
  train_stop = n - 2 * held_out
  return {'train': (0, train_stop), 'validation': (train_stop, n - held_out),
          'test': (n - held_out, n)}
