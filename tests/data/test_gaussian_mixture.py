"""The `gaussian_mixture` data set holds the points `toy2d.dataset` draws, and nothing else."""

import jax
import numpy as np
import pytest

from data import datasets
from data import pipeline
from data.builders import gaussian_mixture
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


def test_ring_and_grid_means_weights_and_covariances_by_hand():
  ring = toy2d.ring(4, radius=2.0, std=0.5)
  np.testing.assert_allclose(ring.means_KxD, [[2, 0], [0, 2], [-2, 0], [0, -2]], atol=1e-6)
  np.testing.assert_allclose(ring.weights_K, [0.25] * 4)
  np.testing.assert_allclose(ring.covariances_KxDxD, np.tile(0.25 * np.eye(2), (4, 1, 1)))
  weighted = toy2d.ring(2, weights=[1.0, 3.0])
  np.testing.assert_allclose(weighted.weights_K, [0.25, 0.75])
  grid = toy2d.grid(2, spacing=3.0, std=0.1)
  np.testing.assert_allclose(grid.means_KxD, [[-1.5, -1.5], [-1.5, 1.5], [1.5, -1.5], [1.5, 1.5]])
  np.testing.assert_allclose(toy2d.grid(3).means_KxD.mean(axis=0), [0, 0], atol=1e-6)


@pytest.mark.parametrize('option, value', [('num_train', 0), ('num_test', 0), ('num_train', 2.5)])
def test_empty_or_fractional_split_sizes_are_refused(option, value):
  with pytest.raises(ValueError) as error:
    toy2d.dataset('ring', **{option: value})
  assert_one_sentence(str(error.value), f'{option}={value!r}', 'positive integer')


def test_the_default_data_set_is_the_ring_with_its_split_sizes(tmp_path):
  assert gaussian_mixture.GaussianMixture(data_dir=tmp_path).mixture == 'ring'
  points = toy2d.dataset()
  assert points['train'].shape == (10_000, 2) and points['test'].shape == (2_000, 2)
  # Every point of the ring (radius 2, std 0.2) lies within 1 of the circle.
  assert np.all(np.abs(np.linalg.norm(points['train'], axis=-1) - 2) < 1)


def test_each_split_is_drawn_from_its_own_fold_of_the_seed():
  points = toy2d.dataset('grid', num_train=5, num_test=5, seed=5)
  key = jax.random.PRNGKey(5)
  # GaussianMixture.sample, compiled as `dataset` compiles it (one program for both).
  for i, split in enumerate(('train', 'test')):
    np.testing.assert_array_equal(points[split],
                                  toy2d._sample(toy2d.grid(), jax.random.fold_in(key, i), 5))


def test_a_zero_weight_or_a_singular_covariance_is_refused():
  # log w_k would be −∞, and a singular Σ_k has no Cholesky factor (NaN densities and draws).
  with pytest.raises(ValueError, match='positive numbers'):
    toy2d.gaussian_mixture([1.0, 0.0], [[0, 0], [1, 1]], np.tile(np.eye(2), (2, 1, 1)))
  with pytest.raises(ValueError, match='positive definite'):
    toy2d.gaussian_mixture([1.0, 1.0], [[0, 0], [1, 1]], [np.eye(2), np.diag([1.0, 0.0])])
