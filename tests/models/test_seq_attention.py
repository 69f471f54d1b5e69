"""Encoder attention (Bahdanau et al. 2015; Luong et al. 2015) against explicit
loops over positions: scores e_{t,i}, softmax weights α_{t,i} over the valid positions and the
context c_t = Σ_i α_{t,i} h_i; masking, empty rows and the width check."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.sequence.attention import EncoderAttention, masked_softmax

# float32 module against a float64 loop: the largest difference measured is 1.8e-7 (additive
# context).
TOL = dict(rtol=1e-5, atol=1e-6)

B, S = 3, 6
# A full row, two partial ones with gaps (padding need not be at the end for the attention).
MASK = np.array([[1, 1, 1, 1, 1, 1],
                 [1, 1, 0, 1, 0, 0],
                 [0, 0, 0, 0, 0, 1]], bool)


def draw(shape, seed, scale=1.0):
  return np.random.default_rng(seed).normal(scale=scale, size=shape).astype(np.float32)


def reference(score_fn, query_BxD, keys_BxSxH, mask_BxS):
  """Loops over examples and positions: e_i = score(s, h_i), α_i = exp(e_i) / Σ_{j valid}
  exp(e_j) (0 where masked), c = Σ_i α_i h_i. Returns (context, weights, scores)."""
  s, h = np.asarray(query_BxD, np.float64), np.asarray(keys_BxSxH, np.float64)
  batch, steps, width = h.shape
  context, weights, scores = np.zeros((batch, width)), np.zeros((batch, steps)), np.zeros((batch, steps))
  for b in range(batch):
    valid = [i for i in range(steps) if mask_BxS[b, i]]
    for i in range(steps):
      scores[b, i] = score_fn(s[b], h[b, i])
    if not valid:
      continue
    largest = max(scores[b, i] for i in valid)
    total = sum(np.exp(scores[b, j] - largest) for j in valid)
    for i in valid:
      weights[b, i] = np.exp(scores[b, i] - largest) / total
      context[b] += weights[b, i] * h[b, i]
  return context, weights, scores


def dot_score(s, h):
  return sum(s[d] * h[d] for d in range(len(s)))  # e = sᵀ h


def additive_params(query_width, key_width, features, seed):
  """W [A×D], b [A], U [A×H], v [A] in column-vector notation, rounded to float32."""
  shapes = {'W': (features, query_width), 'b': (features,), 'U': (features, key_width),
            'v': (features,)}
  return {name: draw(shape, seed + k, scale=0.7).astype(np.float64)
          for k, (name, shape) in enumerate(shapes.items())}


def additive_variables(p):
  t = lambda m: jnp.asarray(np.asarray(m).T, jnp.float32)
  return {'params': {'query': {'kernel': t(p['W']), 'bias': t(p['b'])}, 'key': {'kernel': t(p['U'])},
                     'energy': {'kernel': jnp.asarray(p['v'][:, None], jnp.float32)}}}


def additive_score(p):
  return lambda s, h: p['v'] @ np.tanh(p['W'] @ s + p['b'] + p['U'] @ h)  # e = vᵀ tanh(W s + b + U h)


def test_dot_attention_equals_the_loop_over_positions():
  query, keys = draw((B, 4), 0), draw((B, S, 4), 1)
  attention = EncoderAttention('dot')
  context, weights = attention.apply({}, query, keys, MASK)
  expected_context, expected_weights, _ = reference(dot_score, query, keys, MASK)
  np.testing.assert_allclose(weights, expected_weights, **TOL)
  np.testing.assert_allclose(context, expected_context, **TOL)
  assert weights.dtype == jnp.float32


def test_additive_attention_equals_the_loop_over_positions():
  # Decoder width D = 3, encoder width H = 5, score width A = 7: a transposed or swapped
  # projection cannot even run.
  query, keys = draw((B, 3), 2), draw((B, S, 5), 3)
  p = additive_params(3, 5, 7, seed=4)
  attention = EncoderAttention('additive', features=7)
  variables = additive_variables(p)
  initialised = jax.eval_shape(lambda: attention.init(jax.random.PRNGKey(0), query, keys, MASK))
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(lambda a: a.shape, initialised)
  context, weights = attention.apply(variables, query, keys, MASK)
  expected_context, expected_weights, scores = reference(additive_score(p), query, keys, MASK)
  assert np.ptp(scores[0]) > 0.5  # the weights are far from uniform
  np.testing.assert_allclose(weights, expected_weights, **TOL)
  np.testing.assert_allclose(context, expected_context, **TOL)


@pytest.mark.parametrize('score', ['dot', 'additive'])
def test_weights_sum_to_one_over_valid_positions_and_are_zero_elsewhere(score):
  query, keys = draw((B, 4), 5), draw((B, S, 4), 6)
  attention = EncoderAttention(score, features=8)
  variables = attention.init(jax.random.PRNGKey(0), query, keys, MASK)
  context, weights = attention.apply(variables, query, keys, MASK)
  weights = np.asarray(weights)
  np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(weights[~MASK], 0.0)  # exactly 0, not merely small
  assert np.all(weights[MASK] > 0)
  # Row 2 has one valid position: all the weight, and the context is that encoder state.
  np.testing.assert_allclose(context[2], keys[2, 5], **TOL)
  # No mask is every position valid.
  unmasked = attention.apply(variables, query, keys)
  all_valid = attention.apply(variables, query, keys, np.ones((B, S), bool))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), unmasked, all_valid)


@pytest.mark.parametrize('score', ['dot', 'additive'])
def test_masked_values_change_nothing(score):
  query, keys = draw((B, 4), 7), draw((B, S, 4), 8)
  attention = EncoderAttention(score, features=8)
  variables = attention.init(jax.random.PRNGKey(0), query, keys, MASK)
  perturbed = np.where(MASK[..., None], keys, draw(keys.shape, 9, scale=1e3))
  got = attention.apply(variables, query, perturbed, MASK)
  expected = attention.apply(variables, query, keys, MASK)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), got, expected)


@pytest.mark.parametrize('score', ['dot', 'additive'])
def test_a_fully_masked_row_gives_zeros_and_finite_gradients(score):
  query, keys = draw((B, 4), 10), draw((B, S, 4), 11)
  mask = MASK.copy()
  mask[1] = False
  attention = EncoderAttention(score, features=8)
  variables = attention.init(jax.random.PRNGKey(0), query, keys, mask)
  context, weights = attention.apply(variables, query, keys, mask)
  np.testing.assert_array_equal(weights[1], 0.0)
  np.testing.assert_array_equal(context[1], 0.0)
  assert np.all(np.isfinite(context)) and np.all(np.isfinite(weights))
  # Training through it is safe too: no NaN in any gradient (a −inf score has a NaN gradient
  # when the softmax is written naively).
  loss = lambda v, q, k: jnp.sum(attention.apply(v, q, k, mask)[0] ** 2)
  grads = jax.grad(loss, argnums=(0, 1, 2))(variables, query, keys)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  np.testing.assert_array_equal(grads[2][1], 0.0)  # the empty row's keys get no gradient


def test_masked_softmax_is_stable_for_large_scores():
  scores = np.array([[1e4, 1e4 - 1.0, -1e4, 3e4], [-1e4, -1e4 + 2.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
  weights = np.asarray(masked_softmax(scores, mask))
  e = np.exp(-1.0)
  np.testing.assert_allclose(weights[0], [1 / (1 + e), e / (1 + e), 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(weights[1], [1 / (1 + np.exp(2.0)), 1 / (1 + np.exp(-2.0)), 0, 0],
                             rtol=1e-6)
  np.testing.assert_allclose(masked_softmax(scores[:, :3], None),
                             nn.softmax(jnp.asarray(scores[:, :3], jnp.float32)), rtol=1e-6)


def test_bfloat16_compute_keeps_float32_weights_close_to_the_float32_ones():
  # dtype=bfloat16: the scores and the context compute in bfloat16, but the softmax and the
  # weights it returns stay float32 (each row sums to 1 to float32 precision, not bfloat16's
  # 2^-8), within bfloat16 rounding of the float32 module's.
  query, keys = draw((B, 4), 12), draw((B, S, 4), 13)
  context, weights = EncoderAttention('dot', dtype=jnp.bfloat16).apply({}, query, keys, MASK)
  assert weights.dtype == jnp.float32 and context.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
  expected_context, expected_weights, _ = reference(dot_score, query, keys, MASK)
  np.testing.assert_allclose(weights, expected_weights, atol=0.05)
  np.testing.assert_allclose(np.asarray(context, np.float32), expected_context, atol=0.05)


def test_dot_attention_with_mismatched_widths_is_one_clear_error():
  # (JAX appends a note on its filtered traceback, so no `$`.)
  with pytest.raises(ValueError, match=r'^Dot-product attention needs the decoder state \(3\) '
                                       r'and the encoder states \(4\) to have one width\.'):
    EncoderAttention('dot').init(jax.random.PRNGKey(0), draw((B, 3), 0), draw((B, S, 4), 1))


def test_an_unknown_score_is_refused():
  with pytest.raises(ValueError, match=r"Attention score 'general' is unknown; allowed: dot, "
                                       r'additive\.'):
    EncoderAttention('general')
