"""Regression and classification losses, and distances between discrete distributions.

Every loss returns one value per example (shape B); the caller averages, so a
training step can weight or mask examples. Functions on probability vectors
treat the last axis as the distribution and every leading axis as a batch axis.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy


def _check_unit_interval(name: str, value) -> None:
  # A traced value cannot be checked; the train library passes Python floats.
  if isinstance(value, (int, float)) and not 0 <= value <= 1:
    raise ValueError(f'{name} must lie in [0, 1], got {value}.')


def _check_same_shape(a: jnp.ndarray, b: jnp.ndarray) -> None:
  if a.shape != b.shape:
    raise ValueError(f'Predictions of shape {a.shape} and targets of shape {b.shape} must have the same shape.')


def _per_example_mean(x: jnp.ndarray) -> jnp.ndarray:
  return jnp.mean(x.reshape(x.shape[0], -1), axis=1)


def mean_squared_error(pred_BxK: jnp.ndarray, target_BxK: jnp.ndarray) -> jnp.ndarray:
  """Mean squared error (1/d_out) Σ_j |v_j - w_j|², averaged over each example's entries."""
  _check_same_shape(pred_BxK, target_BxK)
  return _per_example_mean((pred_BxK - target_BxK) ** 2)


def mean_absolute_error(pred_BxK: jnp.ndarray, target_BxK: jnp.ndarray) -> jnp.ndarray:
  """Mean absolute error (1/d_out) Σ_j |v_j - w_j|, averaged over each example's entries."""
  _check_same_shape(pred_BxK, target_BxK)
  return _per_example_mean(jnp.abs(pred_BxK - target_BxK))


def binary_cross_entropy_with_logits(logits_B: jnp.ndarray, labels_B: jnp.ndarray) -> jnp.ndarray:
  """Cross-entropy CE(p, q) for two classes, with q = sigmoid(z) and p = (y, 1 - y).

  -y log σ(z) - (1 - y) log(1 - σ(z)) is rewritten as
  max(z, 0) - z·y + log(1 + e^{-|z|}) so that no exp overflows for large |z|.
  Elementwise; labels may be soft, in [0, 1].
  """
  _check_same_shape(logits_B, labels_B)
  return jnp.maximum(logits_B, 0) - logits_B * labels_B + jnp.log1p(jnp.exp(-jnp.abs(logits_B)))


def softmax_cross_entropy(logits_BxC: jnp.ndarray, targets_BxC: jnp.ndarray,
                          label_smoothing: float = 0.0) -> jnp.ndarray:
  """Cross-entropy CE(p, q) = -Σ_i p_i log q_i with q = softmax(logits) and p = targets.

  Targets are one-hot vectors or any distributions; label smoothing ε replaces
  them by (1 - ε)·p + ε/C. A class with p_i = 0 adds 0 (0 log 0 = 0), even
  where its logit is -∞.
  """
  _check_same_shape(logits_BxC, targets_BxC)
  _check_unit_interval('label_smoothing', label_smoothing)
  num_classes = logits_BxC.shape[-1]
  p_BxC = (1 - label_smoothing) * targets_BxC + label_smoothing / num_classes
  log_q_BxC = jax.nn.log_softmax(logits_BxC, axis=-1)
  return -jnp.sum(p_BxC * jnp.where(p_BxC == 0, 0, log_q_BxC), axis=-1)


def cross_entropy(logits_BxC: jnp.ndarray, labels_B: jnp.ndarray, label_smoothing: float = 0.0) -> jnp.ndarray:
  """Cross-entropy with integer labels: -log q_y when p is hot on y, per example.

  With label smoothing ε the target is (1 - ε)·onehot(y) + ε/C, so the loss is
  logsumexp(z) - (1 - ε)·z_y - ε·mean(z); a term whose weight is a Python 0 is
  left out (0 log 0 = 0), so a logit of -∞ outside the target gives no NaN.
  Labels must lie in [0, C): concrete labels outside are refused; traced ones
  (under `jax.jit`) give NaN for their example, so masked positions need labels
  in range even when their weight is 0. Floating-point labels, traced or not, are
  refused rather than truncated (soft targets go to `softmax_cross_entropy`).
  """
  if labels_B.shape != logits_BxC.shape[:-1]:
    raise ValueError(f'Labels of shape {labels_B.shape} do not match logits of shape {logits_BxC.shape}; '
                     'expected one integer label per row of logits.')
  _check_unit_interval('label_smoothing', label_smoothing)
  num_classes = logits_BxC.shape[-1]
  concrete = not isinstance(labels_B, jax.core.Tracer)
  if jnp.issubdtype(labels_B.dtype, jnp.inexact):  # cast to int32 below, 0.9 would be class 0
    values = np.asarray(labels_B).ravel() if concrete else np.zeros(0)
    values = np.concatenate([values[values != np.round(values)], values])
    example = f' such as {values[0]!s}' if values.size else ''  # a fraction first
    raise ValueError(f'Labels must be integer class indices, got {labels_B.dtype} labels{example}.')
  if concrete and labels_B.size:
    labels = np.asarray(labels_B)
    outside = labels[(labels < 0) | (labels >= num_classes)]
    if outside.size:
      raise ValueError(f'Labels must lie in [0, {num_classes}) for {num_classes} classes, got {outside[0]}.')
  labels_B = labels_B.astype(jnp.int32)
  in_range_B = (labels_B >= 0) & (labels_B < num_classes)
  z_y_B = jnp.take_along_axis(logits_BxC, jnp.where(in_range_B, labels_B, 0)[..., None], axis=-1)[..., 0]
  loss_B = jax.nn.logsumexp(logits_BxC, axis=-1)
  if not (isinstance(label_smoothing, (int, float)) and label_smoothing == 1):
    loss_B = loss_B - (1 - label_smoothing) * z_y_B
  if not (isinstance(label_smoothing, (int, float)) and label_smoothing == 0):
    loss_B = loss_B - label_smoothing * jnp.mean(logits_BxC, axis=-1)
  return jnp.where(in_range_B, loss_B, jnp.nan)


def entropy(p_BxC: jnp.ndarray) -> jnp.ndarray:
  """H(p) = -Σ_i p_i log p_i, with 0 log 0 = 0 (Shannon 1948); CE(p, q) = H(p) + D_KL(p‖q)."""
  return -jnp.sum(xlogy(p_BxC, p_BxC), axis=-1)


def kl_divergence(p_BxC: jnp.ndarray, q_BxC: jnp.ndarray) -> jnp.ndarray:
  """Kullback & Leibler 1951: D_KL(p‖q) = Σ_i p_i log(p_i / q_i).

  With 0 log(0/q) = 0, and +∞ where p_i > 0 = q_i.
  """
  _check_same_shape(p_BxC, q_BxC)
  return jnp.sum(xlogy(p_BxC, p_BxC) - xlogy(p_BxC, q_BxC), axis=-1)


def categorical_cross_entropy(p_BxC: jnp.ndarray, q_BxC: jnp.ndarray) -> jnp.ndarray:
  """Cross-entropy CE(p, q) = -Σ_i p_i log q_i between two probability vectors."""
  _check_same_shape(p_BxC, q_BxC)
  return -jnp.sum(xlogy(p_BxC, q_BxC), axis=-1)


def lp_distance(p_BxC: jnp.ndarray, q_BxC: jnp.ndarray, order: float = 2.0) -> jnp.ndarray:
  """L^p distance d_{L^p}(P, Q) = (Σ_i |P(i) - Q(i)|^p)^{1/p} for p ≥ 1, and max_i |P(i) - Q(i)|
  for p = ∞.

  Computed as m (Σ_i (|P(i) - Q(i)| / m)^p)^{1/p} with m the largest difference, so that
  large orders do not underflow (0.3^100 is below float32's smallest number).
  """
  if isinstance(order, (int, float)) and not order >= 1:
    raise ValueError(f'The L^p order must be at least 1 (or inf), got {order}.')
  _check_same_shape(p_BxC, q_BxC)
  diff_BxC = jnp.abs(p_BxC - q_BxC)
  largest_B = jnp.max(diff_BxC, axis=-1)
  if isinstance(order, (int, float)) and math.isinf(order):
    return largest_B
  scale_B = jnp.where(largest_B > 0, largest_B, 1)
  return largest_B * jnp.sum((diff_BxC / scale_B[..., None]) ** order, axis=-1) ** (1 / order)


def total_variation(p_BxC: jnp.ndarray, q_BxC: jnp.ndarray) -> jnp.ndarray:
  """Total variation d_total(P, Q) = sup_A |P(A) - Q(A)|, computed at A = {i : P(i) ≥ Q(i)}.

  Since P(A) - Q(A) = Q(Aᶜ) - P(Aᶜ) for every A, |P(A) - Q(A)| ≤ ½ Σ_i |P(i) - Q(i)|, with
  equality for that set: the value equals ½ d_{L^1}.
  """
  _check_same_shape(p_BxC, q_BxC)
  diff_BxC = p_BxC - q_BxC
  return jnp.sum(jnp.where(diff_BxC >= 0, diff_BxC, 0), axis=-1)


def language_model_summary(nats: float, tokens: float, units: float, unit: str) -> dict:
  """Loss, perplexity and bits per unit of a language model, from totals over a text.

  `nats` is the summed negative log-likelihood of `tokens` scored tokens that
  spell `units` characters or bytes (`unit` names which: 'char' or 'byte').
  Perplexity is exp(mean NLL per token); bits per unit, nats / units / ln 2,
  compares models with different tokenizers on the same text. Host-side: it
  takes the totals after every batch (and device) has been summed.
  """
  mean_nll = float(nats) / float(tokens)
  return {'loss': mean_nll, 'perplexity': float(np.exp(mean_nll)),
          f'bits_per_{unit}': float(nats) / float(units) / float(np.log(2))}
