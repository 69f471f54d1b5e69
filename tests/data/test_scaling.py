"""Standard scaling against scikit-learn's StandardScaler and the formulas for μ and σ² written out."""

import jax
import numpy as np
import pytest
from sklearn import preprocessing

from data import scaling


def _splits(seed=0, n_train=200, n_test=50, features=6):
  rng = np.random.default_rng(seed)
  locations = rng.uniform(-100, 100, features)
  # |location| / spread stays below ~200, so float32 keeps about 5 significant digits.
  spreads = rng.uniform(0.5, 30, features)
  make = lambda n: (locations + spreads * rng.standard_normal((n, features))).astype(np.float32)
  return make(n_train), make(n_test)


@pytest.mark.parametrize('seed', range(3))
def test_matches_sklearn_on_train_and_test_splits(seed):
  train, test = _splits(seed)
  reference = preprocessing.StandardScaler().fit(train.astype(np.float64))
  scaler = scaling.fit(train)
  np.testing.assert_allclose(scaler.mean, reference.mean_, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(scaler.scale, reference.scale_, rtol=1e-5)
  for split in (train, test):
    np.testing.assert_allclose(scaling.transform(scaler, split),
                               reference.transform(split.astype(np.float64)), atol=1e-4)


def test_training_split_gets_zero_mean_and_unit_population_variance():
  train, _ = _splits(3)
  scaled = np.asarray(scaling.transform(scaling.fit(train), train), np.float64)
  np.testing.assert_allclose(scaled.mean(axis=0), 0, atol=1e-5)
  np.testing.assert_allclose(scaled.var(axis=0, ddof=0), 1, rtol=1e-4)


def test_other_splits_use_the_training_statistics():
  train, test = _splits(4)
  mean = train.astype(np.float64).mean(axis=0)
  std = np.sqrt(((train - mean) ** 2).mean(axis=0))
  np.testing.assert_allclose(scaling.transform(scaling.fit(train), test), (test - mean) / std,
                             rtol=1e-4, atol=1e-4)


def test_inverse_undoes_transform():
  train, test = _splits(5)
  scaler = scaling.fit(train)
  np.testing.assert_allclose(scaling.inverse_transform(scaler, scaling.transform(scaler, test)),
                             test, rtol=1e-5, atol=1e-4)


def test_zero_variance_features_map_to_zero_and_keep_offsets():
  train, test = _splits(6)
  train[:, 2] = 0.1  # Not exactly representable: a float mean would miss it.
  train[:, 4] = -7.0
  scaler = scaling.fit(train)
  scaled_train = np.asarray(scaling.transform(scaler, train))
  scaled_test = np.asarray(scaling.transform(scaler, test))
  assert np.all(scaled_train[:, [2, 4]] == 0)
  np.testing.assert_allclose(scaled_test[:, 2], test[:, 2] - np.float32(0.1), atol=1e-5)
  np.testing.assert_allclose(scaled_test[:, 4], test[:, 4] + 7, atol=1e-4)
  assert np.all(np.isfinite(scaled_test))
  reference = preprocessing.StandardScaler().fit(train.astype(np.float64))
  np.testing.assert_allclose(scaled_test, reference.transform(test.astype(np.float64)), atol=1e-4)


def test_feature_shapes_beyond_one_axis_scale_elementwise():
  rng = np.random.default_rng(7)
  images = rng.uniform(0, 255, (40, 4, 5, 2)).astype(np.float32)
  scaled = scaling.transform(scaling.fit(images), images)
  flat = preprocessing.StandardScaler().fit_transform(images.reshape(40, -1).astype(np.float64))
  np.testing.assert_allclose(np.asarray(scaled).reshape(40, -1), flat, atol=1e-4)


def test_scaler_passes_through_jit():
  train, test = _splits(8)
  scaler = jax.jit(scaling.fit)(train)
  np.testing.assert_allclose(jax.jit(scaling.transform)(scaler, test),
                             scaling.transform(scaling.fit(train), test), atol=1e-5)


def test_bad_shapes_raise_clear_errors():
  with pytest.raises(ValueError, match=r'shape \(n, features...\) with n >= 1; got shape \(5,\)'):
    scaling.fit(np.zeros(5))
  with pytest.raises(ValueError, match=r'shape \(n, features...\) with n >= 1; got shape \(0, 3\)'):
    scaling.fit(np.zeros((0, 3)))
  scaler = scaling.fit(np.ones((4, 3)))
  with pytest.raises(ValueError, match=r'\(2, 4\) does not match .* features of shape \(3,\)'):
    scaling.transform(scaler, np.zeros((2, 4)))


def test_data_whose_feature_shape_would_broadcast_is_refused():
  # Every feature axis must match, not only the last: (2, 1, 3) would broadcast to (2, 4, 3).
  scaler = scaling.fit(np.random.default_rng(9).normal(size=(10, 4, 3)))
  for shape in ((2, 1, 3), (2, 3)):
    with pytest.raises(ValueError, match=r'does not match .* features of shape \(4, 3\)'):
      scaling.transform(scaler, np.zeros(shape))
    with pytest.raises(ValueError, match=r'does not match .* features of shape \(4, 3\)'):
      scaling.inverse_transform(scaler, np.zeros(shape))
