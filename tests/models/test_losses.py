"""Losses against their definitions, identities and brute-force references."""

import itertools
import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import losses
from tests.messages import one_sentence

B, C = 8, 6
TOL = dict(rtol=1e-5, atol=1e-5)
PROPERTY = settings(max_examples=60, deadline=None)

logits_strategy = hnp.arrays(np.float32, (B, C), elements=st.floats(-30, 30, width=32))
labels_strategy = hnp.arrays(np.int32, (B,), elements=st.integers(0, C - 1))
smoothing_strategy = st.sampled_from([0.0, 0.1, 0.5, 1.0])

softmax = jax.jit(lambda z: jax.nn.softmax(z, axis=-1))
kl = jax.jit(losses.kl_divergence)
entropy = jax.jit(losses.entropy)
categorical_ce = jax.jit(losses.categorical_cross_entropy)
total_variation = jax.jit(losses.total_variation)
lp_distance = jax.jit(losses.lp_distance, static_argnums=2)
cross_entropy = jax.jit(losses.cross_entropy, static_argnums=2)
softmax_ce = jax.jit(losses.softmax_cross_entropy, static_argnums=2)


# Distances between distributions.


@PROPERTY
@given(logits_strategy, logits_strategy)
def test_kl_is_nonnegative_and_bounded_below_by_pinsker(z_p, z_q):
  p, q = softmax(z_p), softmax(z_q)
  divergence = np.asarray(kl(p, q))
  tv = np.asarray(total_variation(p, q))
  assert np.all(divergence >= -1e-6)
  # Pinsker, D_KL ≥ 2·TV², makes "D_KL = 0 only if p = q" quantitative.
  assert np.all(divergence >= 2 * tv**2 - 1e-6)


@PROPERTY
@given(logits_strategy)
def test_kl_of_a_distribution_with_itself_is_zero(z):
  p = softmax(z)
  np.testing.assert_allclose(kl(p, p), 0.0, atol=1e-6)


@PROPERTY
@given(logits_strategy, logits_strategy)
def test_cross_entropy_is_kl_plus_entropy(z_p, z_q):
  p, q = softmax(z_p), softmax(z_q)
  np.testing.assert_allclose(categorical_ce(p, q), kl(p, q) + entropy(p), rtol=1e-5, atol=2e-5)
  # The same identity for the loss on logits.
  np.testing.assert_allclose(softmax_ce(z_q, p, 0.0), kl(p, q) + entropy(p), rtol=1e-5, atol=2e-5)


@PROPERTY
@given(logits_strategy, logits_strategy)
def test_total_variation_is_half_the_l1_distance(z_p, z_q):
  p, q = softmax(z_p), softmax(z_q)
  np.testing.assert_allclose(total_variation(p, q), 0.5 * lp_distance(p, q, 1.0), atol=1e-6)


def test_total_variation_is_the_largest_event_probability_gap():
  # The definition: sup over all events A ⊂ [n] of |P(A) - Q(A)|.
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(C), size=4)
  q = rng.dirichlet(np.ones(C), size=4)
  events = [np.isin(np.arange(C), a) for r in range(C + 1) for a in itertools.combinations(range(C), r)]
  brute = np.array([max(abs(p[b, e].sum() - q[b, e].sum()) for e in events) for b in range(4)])
  np.testing.assert_allclose(total_variation(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)), brute,
                             atol=1e-6)


@pytest.mark.parametrize('order', [1.0, 2.0, 3.5])
def test_lp_distance_equals_the_written_out_sum(order):
  rng = np.random.default_rng(1)
  p, q = rng.dirichlet(np.ones(C), size=3), rng.dirichlet(np.ones(C), size=3)
  expected = [sum(abs(p[b, i] - q[b, i]) ** order for i in range(C)) ** (1 / order) for b in range(3)]
  np.testing.assert_allclose(losses.lp_distance(jnp.asarray(p), jnp.asarray(q), order), expected, **TOL)


@pytest.mark.parametrize('order', [100.0, 300.0])
def test_lp_distance_of_a_large_order_does_not_underflow(order):
  # |d|^order underflows float32 here (0.3^100 ≈ 5e-53): the plain sum would give 0.
  p, q = np.array([[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]]), np.array([[0.2, 0.3, 0.5], [0.25, 0.5, 0.25]])
  expected = [sum(abs(a - b) ** order for a, b in zip(p_b, q_b)) ** (1 / order)  # float64
              for p_b, q_b in zip(p, q)]
  got = losses.lp_distance(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32), order)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # The second row has two largest differences of 0.25: 0.25 · 2^(1/p), above the maximum.
  assert got[1] > 0.25


def test_lp_distance_of_order_infinity_is_the_largest_difference():
  p, q = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]), jnp.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
  np.testing.assert_allclose(losses.lp_distance(p, q, math.inf), [0.3, 0.0], atol=1e-7)
  np.testing.assert_allclose(losses.lp_distance(p, q, 2.0)[1], 0.0)  # equal rows: no 0/0


def test_kl_conventions_for_zero_probabilities():
  p = jnp.array([0.5, 0.5, 0.0])
  q = jnp.array([0.25, 0.75, 0.0])
  # 0·log(0/0) = 0.
  np.testing.assert_allclose(losses.kl_divergence(p, q), 0.5 * math.log(2) + 0.5 * math.log(2 / 3), **TOL)
  # p(i) > 0 = q(i) gives +∞.
  assert losses.kl_divergence(q, jnp.array([0.5, 0.0, 0.5])) == np.inf
  np.testing.assert_allclose(losses.entropy(jnp.array([1.0, 0.0, 0.0])), 0.0)
  np.testing.assert_allclose(losses.entropy(jnp.full(4, 0.25)), math.log(4), **TOL)


# Losses on logits.


@PROPERTY
@given(logits_strategy, labels_strategy, smoothing_strategy)
def test_integer_label_cross_entropy_equals_one_hot_cross_entropy(logits, labels, smoothing):
  one_hot = jax.nn.one_hot(labels, C)
  np.testing.assert_allclose(cross_entropy(logits, labels, smoothing), softmax_ce(logits, one_hot, smoothing),
                             rtol=1e-5, atol=1e-4)


def test_cross_entropy_is_minus_log_probability_of_the_label():
  # If p is hot on position i, CE(p, q) = -log q_i.
  logits = np.random.default_rng(2).normal(size=(B, C)).astype(np.float32)
  labels = np.arange(B) % C
  q = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(losses.cross_entropy(logits, labels), -np.log(q[np.arange(B), labels]), **TOL)
  assert losses.cross_entropy(logits, labels).shape == (B,)


# 0.8: a smoothing above ½, where the label's weight 1 − ε is below the uniform part's.
@pytest.mark.parametrize('eps', [0.2, 0.8])
def test_label_smoothing_targets_mix_in_the_uniform_distribution(eps):
  logits = np.random.default_rng(3).normal(size=(B, C)).astype(np.float32)
  labels = np.arange(B) % C
  targets = (1 - eps) * np.eye(C)[labels] + eps / C
  log_q = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(losses.cross_entropy(logits, labels, label_smoothing=eps),
                             -(targets * log_q).sum(-1), **TOL)
  # Uniform logits cost log C whatever the label and smoothing.
  np.testing.assert_allclose(losses.cross_entropy(jnp.zeros((2, C)), jnp.array([0, 3]), eps), math.log(C), **TOL)


def test_binary_cross_entropy_equals_the_two_class_formula():
  z = np.linspace(-8, 8, 41).astype(np.float32)
  y = np.linspace(0, 1, 41).astype(np.float32)
  s = 1 / (1 + np.exp(-z.astype(np.float64)))
  expected = -y * np.log(s) - (1 - y) * np.log(1 - s)
  np.testing.assert_allclose(losses.binary_cross_entropy_with_logits(z, y), expected, **TOL)
  # It is the softmax cross-entropy of logits (z, 0) against (y, 1 - y).
  two_class = losses.softmax_cross_entropy(np.stack([z, 0 * z], -1), np.stack([y, 1 - y], -1))
  np.testing.assert_allclose(losses.binary_cross_entropy_with_logits(z, y), two_class, **TOL)


@pytest.mark.parametrize('loss', ['cross_entropy', 'softmax_cross_entropy', 'binary_cross_entropy_with_logits'])
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_extreme_logits_give_finite_values_and_gradients(loss, smoothing):
  logits = jnp.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4], [1e4, 1e4, 1e4], [-1e4, 1e4, -1e4]])
  labels = jnp.array([1, 0, 2, 1])
  if loss == 'cross_entropy':
    fn = lambda z: losses.cross_entropy(z, labels, smoothing)
  elif loss == 'softmax_cross_entropy':
    fn = lambda z: losses.softmax_cross_entropy(z, jax.nn.one_hot(labels, 3), smoothing)
  else:
    fn = lambda z: losses.binary_cross_entropy_with_logits(z, jnp.full(z.shape, 1 - smoothing))
  values = fn(logits)
  grads = jax.grad(lambda z: jnp.sum(fn(z)))(logits)
  assert np.all(np.isfinite(values)) and np.all(np.isfinite(grads))
  if loss != 'binary_cross_entropy_with_logits' and smoothing == 0:
    # Row 0 puts all mass on class 0 but the label is 1: the loss is the logit gap z_0 - z_1.
    np.testing.assert_allclose(values[0], 2e4, rtol=1e-6)


@pytest.mark.parametrize('jit', [False, True])
def test_a_minus_infinite_logit_outside_the_target_scores_zero_probability(jit):
  # Class 1 is impossible (logit -∞); 0 · log 0 = 0 for the examples not labelled 1.
  logits = np.array([[2.0, -np.inf, 0.5, -1.0], [0.0, -np.inf, 3.0, 1.0]], np.float32)
  labels = np.array([0, 3])
  z = logits.astype(np.float64)
  log_softmax = z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
  expected = -log_softmax[np.arange(2), labels]
  grad_expected = np.exp(log_softmax) - np.eye(4)[labels]
  one_hot = jax.nn.one_hot(labels, 4)
  wrap = jax.jit if jit else lambda fn: fn
  for fn in (wrap(lambda z: losses.cross_entropy(z, jnp.asarray(labels))),
             wrap(lambda z: losses.softmax_cross_entropy(z, one_hot))):
    np.testing.assert_allclose(fn(jnp.asarray(logits)), expected, **TOL)
    np.testing.assert_allclose(jax.grad(lambda z: jnp.sum(fn(z)))(jnp.asarray(logits)), grad_expected, **TOL)


def test_a_minus_infinite_logit_inside_the_target_gives_infinite_loss():
  # -log q = +∞ when the target puts mass on a class of probability 0.
  logits = jnp.array([[2.0, -jnp.inf, 0.5]])
  for labels, smoothing in [([1], 0.0), ([0], 0.1), ([1], 1.0), ([0], 1.0)]:
    labels = jnp.asarray(labels)
    assert losses.cross_entropy(logits, labels, smoothing)[0] == np.inf, (labels, smoothing)
    assert losses.softmax_cross_entropy(logits, jax.nn.one_hot(labels, 3), smoothing)[0] == np.inf


def test_cross_entropy_of_labels_beyond_the_int8_range():
  # A vocabulary of 300 classes: labels 200 and 299 wrap around in a narrow integer type.
  logits = np.random.default_rng(6).normal(size=(3, 300)).astype(np.float32)
  labels = np.array([200, 299, 5])
  z = logits.astype(np.float64)
  log_q = z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
  np.testing.assert_allclose(cross_entropy(jnp.asarray(logits), jnp.asarray(labels), 0.0),
                             -log_q[np.arange(3), labels], **TOL)


@pytest.mark.parametrize('label', [-1, C, C + 5])
def test_concrete_labels_outside_the_classes_are_refused(label):
  labels = jnp.array([0, label, 2])
  one_sentence(lambda: losses.cross_entropy(jnp.zeros((3, C)), labels), f'[0, {C})', f'got {label}')
  one_sentence(lambda: losses.cross_entropy(jnp.zeros((3, C)), np.asarray(labels)), f'[0, {C})', f'got {label}')


def test_float_labels_are_refused_not_truncated():
  # [0.9, 2.5] were cast to classes [0, 2]; traced float labels were too.
  logits = jnp.asarray(np.random.default_rng(5).normal(size=(2, C)), jnp.float32)
  for labels, words in [(jnp.array([0.9, 2.5]), 'float32 labels such as 0.9'),
                        (np.array([2.0, 2.5]), 'float64 labels such as 2.5'),
                        (np.array([1.0, 3.0]), 'float64 labels such as 1.0')]:
    one_sentence(lambda: losses.cross_entropy(logits, labels), 'integer class indices', words)
  one_sentence(lambda: cross_entropy(logits, jnp.array([0.9, 2.5]), 0.0), 'integer class indices',
               'float32 labels')
  # Integer labels of any width give -log q_y as before.
  log_q = np.asarray(jax.nn.log_softmax(logits))
  for labels in (np.array([0, 2], np.int64), jnp.array([0, 2], jnp.int8), [0, 2]):
    np.testing.assert_allclose(losses.cross_entropy(logits, jnp.asarray(labels)),
                               -log_q[[0, 1], [0, 2]], **TOL)


def test_traced_labels_outside_the_classes_give_nan_for_their_example_only():
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(4, C)), jnp.float32)
  labels = jnp.array([1, -1, C, 0])
  got = np.asarray(cross_entropy(logits, labels, 0.0))
  assert np.isnan(got[1]) and np.isnan(got[2]), got
  z = np.asarray(logits, np.float64)
  log_q = z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
  np.testing.assert_allclose(got[[0, 3]], [-log_q[0, 1], -log_q[3, 0]], **TOL)


# Regression losses.


def test_mean_squared_and_absolute_errors_equal_the_written_out_average():
  rng = np.random.default_rng(4)
  v, w = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
  for loss, power in [(losses.mean_squared_error, 2), (losses.mean_absolute_error, 1)]:
    expected = [sum(abs(v[n, j] - w[n, j]) ** power for j in range(3)) / 3 for n in range(5)]
    np.testing.assert_allclose(loss(jnp.asarray(v), jnp.asarray(w)), expected, **TOL)


def test_regression_losses_reduce_all_but_the_batch_axis():
  pred = jnp.ones((4, 2, 3))
  assert losses.mean_squared_error(pred, 0 * pred).shape == (4,)
  np.testing.assert_allclose(losses.mean_absolute_error(jnp.arange(4.0), jnp.zeros(4)), [0, 1, 2, 3])


# Language-model summaries.


def test_language_model_summary_by_hand():
  # 6 tokens spelling 12 characters with a summed NLL of 12 ln 2 nats: 2 ln 2 nats per token,
  # perplexity e^{2 ln 2} = 4, and 12 ln 2 / 12 / ln 2 = 1 bit per character.
  summary = losses.language_model_summary(12 * math.log(2), 6, 12, 'char')
  assert set(summary) == {'loss', 'perplexity', 'bits_per_char'}
  np.testing.assert_allclose(summary['loss'], 2 * math.log(2), rtol=1e-12)
  np.testing.assert_allclose(summary['perplexity'], 4.0, rtol=1e-12)
  np.testing.assert_allclose(summary['bits_per_char'], 1.0, rtol=1e-12)
  # Bits are per unit, not per token: 3 bytes of the same 6 tokens are 4 bits each.
  np.testing.assert_allclose(losses.language_model_summary(12 * math.log(2), 6, 3, 'byte')['bits_per_byte'],
                             4.0, rtol=1e-12)


# Bad input.


@pytest.mark.parametrize('loss', ['mean_squared_error', 'mean_absolute_error',
                                  'binary_cross_entropy_with_logits', 'softmax_cross_entropy',
                                  'kl_divergence', 'categorical_cross_entropy', 'lp_distance',
                                  'total_variation'])
def test_predictions_and_targets_of_different_shapes_are_refused(loss):
  # (4, 1) against (4,) would broadcast to (4, 4) and give 4 values per example.
  with pytest.raises(ValueError, match=r'shape \(4, 1\) and targets of shape \(4,\)'):
    getattr(losses, loss)(jnp.full((4, 1), 0.5), jnp.full((4,), 0.5))


def test_bad_arguments_are_rejected():
  with pytest.raises(ValueError, match='label_smoothing must lie in'):
    losses.cross_entropy(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), label_smoothing=1.5)
  with pytest.raises(ValueError, match='one integer label per row'):
    losses.cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2, 3), jnp.int32))
  with pytest.raises(ValueError, match='same shape'):
    losses.mean_squared_error(jnp.zeros((2, 3)), jnp.zeros((3, 2)))
  with pytest.raises(ValueError, match='at least 1'):
    losses.lp_distance(jnp.zeros(3), jnp.zeros(3), 0.5)
  with pytest.raises(ValueError, match='at least 1'):
    losses.lp_distance(jnp.zeros(3), jnp.zeros(3), math.nan)
