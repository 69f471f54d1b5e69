"""The Fréchet distance against closed forms (one dimension, commuting covariances) and
against SciPy's general matrix square root of Σ₁Σ₂."""

import numpy as np
import pytest
import scipy.linalg

from models.generative import frechet


def random_covariance(rng, dims):
  a = rng.normal(size=(dims, 2 * dims))
  return a @ a.T / (2 * dims)


def test_one_dimension_is_the_difference_of_means_and_of_standard_deviations():
  # W₂² between N(μ₁, σ₁²) and N(μ₂, σ₂²) is (μ₁ − μ₂)² + (σ₁ − σ₂)².
  assert frechet.frechet_distance([1.0], [[4.0]], [-2.0], [[0.25]]) == pytest.approx(
      9.0 + 1.5**2, rel=1e-12)


def test_commuting_covariances_compare_their_eigenvalue_roots():
  rng = np.random.default_rng(0)
  rotation, _ = np.linalg.qr(rng.normal(size=(5, 5)))
  a, b = rng.uniform(0.1, 3, 5), rng.uniform(0.1, 3, 5)
  mean1, mean2 = rng.normal(size=5), rng.normal(size=5)
  expected = np.sum((mean1 - mean2)**2) + np.sum((np.sqrt(a) - np.sqrt(b))**2)
  got = frechet.frechet_distance(mean1, rotation @ np.diag(a) @ rotation.T, mean2,
                                 rotation @ np.diag(b) @ rotation.T)
  assert got == pytest.approx(expected, rel=1e-9)


def test_general_covariances_match_scipy_and_the_distance_is_symmetric():
  rng = np.random.default_rng(1)
  cov1, cov2 = random_covariance(rng, 6), random_covariance(rng, 6)
  mean1, mean2 = rng.normal(size=6), rng.normal(size=6)
  # Heusel et al.'s formula with tr((Σ₁Σ₂)^½) by SciPy's general (non-symmetric) sqrtm.
  reference = (np.sum((mean1 - mean2)**2) + np.trace(cov1) + np.trace(cov2)
               - 2 * np.trace(scipy.linalg.sqrtm(cov1 @ cov2)).real)
  assert frechet.frechet_distance(mean1, cov1, mean2, cov2) == pytest.approx(reference, rel=1e-8)
  assert frechet.frechet_distance(mean2, cov2, mean1, cov1) == pytest.approx(reference, rel=1e-8)
  assert frechet.frechet_distance(mean1, cov1, mean1, cov1) == pytest.approx(0.0, abs=1e-9)


def test_statistics_of_features_and_the_distance_between_samples():
  rng = np.random.default_rng(2)
  features = rng.normal(size=(4000, 3)) * [1.0, 2.0, 0.5] + [1.0, 0.0, -1.0]
  mean, cov = frechet.feature_statistics(features)
  np.testing.assert_allclose(cov, np.cov(features.T), rtol=1e-12)
  np.testing.assert_allclose(mean, features.mean(0), rtol=1e-12)
  # Two samples of one distribution are close; shifting one changes only the means' term.
  other = rng.normal(size=(4000, 3)) * [1.0, 2.0, 0.5] + [1.0, 0.0, -1.0]
  same = frechet.frechet_distance(mean, cov, *frechet.feature_statistics(other))
  shift = np.array([3.0, 0.0, 0.0])
  shifted = frechet.frechet_distance(mean, cov, *frechet.feature_statistics(other + shift))
  gap = mean - other.mean(0)
  assert same < 0.01  # measured 0.0067
  assert shifted - same == pytest.approx(np.sum((gap - shift)**2) - np.sum(gap**2), rel=1e-9)


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match=r'must be \[N, F\] with N ≥ 2'):
    frechet.feature_statistics(np.zeros((1, 3)))
  with pytest.raises(ValueError, match='cov2 of shape'):
    frechet.frechet_distance(np.zeros(2), np.eye(2), np.zeros(2), np.eye(3))
  # A mean of one feature would broadcast against the other's three.
  with pytest.raises(ValueError, match='mean2 of shape'):
    frechet.frechet_distance(np.zeros(3), np.eye(3), np.ones(1), np.eye(3))


def test_rank_deficient_covariances_give_the_closed_form_not_nan():
  # Fewer samples than features give singular covariances, whose zero eigenvalues come out of
  # eigh as ±1e-16; √ of a negative one was nan. Commuting covariances with zero eigenvalues
  # against Σ (√a − √b)².
  rng = np.random.default_rng(0)
  rotation, _ = np.linalg.qr(rng.normal(size=(5, 5)))
  a, b = np.array([0.0, 0.0, 1.0, 2.0, 3.0]), np.array([0.0, 1.5, 0.0, 2.0, 0.5])
  mean1, mean2 = rng.normal(size=5), rng.normal(size=5)
  expected = np.sum((mean1 - mean2)**2) + np.sum((np.sqrt(a) - np.sqrt(b))**2)
  got = frechet.frechet_distance(mean1, rotation @ np.diag(a) @ rotation.T, mean2,
                                 rotation @ np.diag(b) @ rotation.T)
  assert got == pytest.approx(expected, rel=1e-7)
  # Statistics of 3 samples of 6 features against themselves shifted by 1: d² = ‖1‖² = 6.
  mean, cov = frechet.feature_statistics(rng.normal(size=(3, 6)))
  assert frechet.frechet_distance(mean, cov, mean + 1, cov) == pytest.approx(6.0, rel=1e-6)


def test_distance_between_identical_statistics_is_never_negative():
  # d² ≥ 0: for Σ₁ = Σ₂ the trace terms cancel up to rounding, which falls below 0 for
  # about a third of these covariances (down to −1e-15).
  rng = np.random.default_rng(4)
  for dims in range(2, 12):
    cov, mean = random_covariance(rng, dims), rng.normal(size=dims)
    got = frechet.frechet_distance(mean, cov, mean, cov)
    assert 0.0 <= got < 1e-9, (dims, got)
