"""The `gaussian_mixture` data set holds the points `toy2d.dataset` draws, and nothing else."""

import numpy as np
import pytest

from data import datasets
from data import pipeline
from data import toy2d
from tests.messages import assert_one_sentence


def test_records_are_the_mixture_draws(tmp_path):
  expected = toy2d.dataset('grid')
  for split, points in expected.items():
    arrays = pipeline.InMemorySource(datasets.load('gaussian_mixture', split, data_dir=tmp_path,
                                                   mixture='grid')).arrays
    assert arrays['x'].dtype == np.float32 and set(arrays) == {'x'}
    np.testing.assert_array_equal(arrays['x'], points)
  # The grid's nine means lie on {−2, 0, 2}²: most points are within 3 std of one.
  nearest = np.abs(expected['train'] - np.round(expected['train'] / 2) * 2).max(-1)
  assert np.mean(nearest < 0.6) > 0.99


def test_an_unknown_mixture_is_refused(tmp_path):
  with pytest.raises(ValueError) as error:
    datasets.load('gaussian_mixture', 'train', data_dir=tmp_path, mixture='moons')
  assert_one_sentence(str(error.value), "'moons'", 'ring, grid')
  assert not any(tmp_path.iterdir())
