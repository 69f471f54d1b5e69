"""The Fréchet distance between Gaussians fitted to two sets of features (Heusel et al. 2017,
"GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash Equilibrium", §4; the
2-Wasserstein distance between the Gaussians, Dowson & Landau 1982):

  d²((μ₁, Σ₁), (μ₂, Σ₂)) = ‖μ₁ − μ₂‖² + tr(Σ₁ + Σ₂ − 2 (Σ₁^{½} Σ₂ Σ₁^{½})^{½}).

Heusel et al. take the features of Inception-v3 (the FID); any feature map defines such a
distance, and distances in different feature spaces are not comparable. The trace of the
square root is Σ √λ over the eigenvalues λ of the symmetric positive semi-definite
Σ₁^{½} Σ₂ Σ₁^{½}, which has the same eigenvalues as Σ₁Σ₂, so the distance is symmetric.
Computed in float64 with NumPy.
"""

import numpy as np


def feature_statistics(features_NxF) -> tuple[np.ndarray, np.ndarray]:
  """(mean [F], covariance [F, F]) of N ≥ 2 feature vectors, the covariance with N − 1."""
  features_NxF = np.asarray(features_NxF, np.float64)
  if features_NxF.ndim != 2 or features_NxF.shape[0] < 2:
    raise ValueError(f'Features of shape {features_NxF.shape} must be [N, F] with N ≥ 2.')
  return features_NxF.mean(axis=0), np.cov(features_NxF, rowvar=False).reshape(
      features_NxF.shape[1], features_NxF.shape[1])


def _psd_sqrt(matrix_FxF: np.ndarray) -> np.ndarray:
  """The symmetric square root of a symmetric positive semi-definite matrix (eigenvalues
  below 0 from rounding are set to 0)."""
  eigenvalues_F, vectors_FxF = np.linalg.eigh((matrix_FxF + matrix_FxF.T) / 2)
  return (vectors_FxF * np.sqrt(np.clip(eigenvalues_F, 0, None))) @ vectors_FxF.T


def frechet_distance(mean1_F, cov1_FxF, mean2_F, cov2_FxF) -> float:
  """d² of the module doc (a squared distance, ≥ 0) between N(mean1, cov1) and N(mean2, cov2)."""
  mean1_F, mean2_F = np.asarray(mean1_F, np.float64), np.asarray(mean2_F, np.float64)
  cov1_FxF, cov2_FxF = np.asarray(cov1_FxF, np.float64), np.asarray(cov2_FxF, np.float64)
  dims = mean1_F.shape[0]
  for name, value, shape in (('mean2', mean2_F, (dims,)), ('cov1', cov1_FxF, (dims, dims)),
                             ('cov2', cov2_FxF, (dims, dims))):
    if value.shape != shape:
      raise ValueError(f'{name} of shape {value.shape} does not match means of {dims} features; '
                       f'expected {shape}.')
  root1_FxF = _psd_sqrt(cov1_FxF)
  middle_FxF = root1_FxF @ cov2_FxF @ root1_FxF
  trace_sqrt = np.sum(np.sqrt(np.clip(np.linalg.eigvalsh((middle_FxF + middle_FxF.T) / 2), 0,
                                      None)))
  distance = (np.sum(np.square(mean1_F - mean2_F)) + np.trace(cov1_FxF) + np.trace(cov2_FxF)
              - 2 * trace_sqrt)
  return float(max(distance, 0.0))
