"""Scaled dot-product and multi-head attention (Vaswani et al. 2017, §3.2) against a float64
numpy reference written out here: Attention(Q, K, V) = softmax(Q Kᵀ / √H + bias, masked) V,
head by head; masks, fully masked rows, softmax properties, a one-hot lookup table and the
key/value cache of decoding."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from models.attention import core
from models.transformer.blocks import TransformerBlock
from tests.messages import one_sentence

B, N, H = 3, 2, 4


def draw(shape, seed, scale=1.0):
  return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def reference_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, allowed=None, bias=None):
  """float64: w[b, n, t] = softmax over the allowed keys s of q_t·k_s/√H + bias (all zeros when
  no key is allowed), out[b, t, n] = Σ_s w[b, n, t, s] v_s. Returns (out, w)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q_BxTxNxH, k_BxSxNxH, v_BxSxNxH))
  batch, steps, heads, width = q.shape
  keys = k.shape[1]
  logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(width)
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  allowed = (np.ones(logits.shape, bool) if allowed is None
             else np.broadcast_to(allowed, logits.shape))
  weights = np.zeros((batch, heads, steps, keys))
  for b in range(batch):
    for n in range(heads):
      for t in range(steps):
        row = allowed[b, n, t]
        if row.any():
          z = logits[b, n, t, row]
          e = np.exp(z - z.max())
          weights[b, n, t, row] = e / e.sum()
  return np.einsum('bnts,bsnh->btnh', weights, v), weights


def causal_allowed(steps, keys, offset=0):
  """[T, S] True where key j ≤ query i + offset, by a loop."""
  return np.array([[j <= i + offset for j in range(keys)] for i in range(steps)])


def padding_allowed(lengths_B, keys):
  """[B, 1, 1, S] True at the first lengths[b] keys of row b, by a loop."""
  return np.array([[j < length for j in range(keys)] for length in lengths_B])[:, None, None, :]


# Each case: (T, S, causal, the test's own mask [.., T, S] or None, bias or None).
def _random_mask(steps, keys):
  mask = np.random.default_rng(7).random((B, N, steps, keys)) < 0.6
  mask[1, 0, 2] = False  # a fully masked row
  return mask


CASES = {
    'no_mask': lambda: (5, 5, False, None, None),
    'causal': lambda: (5, 5, True, None, None),
    'causal_cross_shapes': lambda: (3, 6, True, None, None),
    'padding': lambda: (4, 6, False, padding_allowed([6, 2, 0], 6), None),
    'random_mask': lambda: (4, 5, False, _random_mask(4, 5), None),
    'bias': lambda: (4, 5, False, None, draw((B, N, 4, 5), 8, scale=2.0)),
    'broadcast_bias': lambda: (4, 5, False, None, draw((1, N, 4, 5), 9, scale=2.0)),
    'causal_bias': lambda: (5, 5, True, None, draw((B, N, 5, 5), 10, scale=2.0)),
    'causal_padding_cross_shapes': lambda: (6, 4, True, padding_allowed([4, 3, 0], 4), None),
}


def _case(name):
  steps, keys, causal, mask, bias = CASES[name]()
  q, k, v = draw((B, steps, N, H), 1), draw((B, keys, N, H), 2), draw((B, keys, N, H), 3)
  allowed = mask
  if causal:
    allowed = causal_allowed(steps, keys) if mask is None else mask & causal_allowed(steps, keys)
  return (q, k, v), dict(mask=mask, bias=bias, causal=causal), dict(allowed=allowed, bias=bias)


# float32 against float64: the largest differences measured are 3.3e-7 (outputs) and 1.2e-7
# (weights).
TOL = dict(rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize('name', sorted(CASES))
def test_dot_product_attention_and_weights_match_the_reference(name):
  (q, k, v), kwargs, reference_kwargs = _case(name)
  expected_out, expected_weights = reference_attention(q, k, v, **reference_kwargs)
  mask, causal = kwargs['mask'], kwargs['causal']
  out, weights = jax.jit(lambda q, k, v, bias: (
      core.dot_product_attention(q, k, v, mask=mask, bias=bias, causal=causal),
      core.attention_weights(q, k, mask=mask, bias=bias, causal=causal)))(q, k, v, kwargs['bias'])
  assert out.shape == q.shape[:3] + (v.shape[-1],)
  np.testing.assert_allclose(out, expected_out, **TOL)
  np.testing.assert_allclose(weights, expected_weights, **TOL)


def test_a_bias_keeps_float32_precision_under_bfloat16_compute():
  # Logits 0 + bias (−100, −99.75): weights σ(∓0.25) = (0.4378, 0.5622). A bias rounded to
  # bfloat16 (steps of 0.5 near 100, as ALiBi's −m·d at long range) would give (0.5, 0.5).
  q = jnp.zeros((1, 1, 1, 2), jnp.bfloat16)
  k = jnp.zeros((1, 2, 1, 2), jnp.bfloat16)
  v = jnp.array([[[[0.0, 0.0]], [[1.0, 1.0]]]], jnp.bfloat16)
  bias = jnp.array([[[[-100.0, -99.75]]]], jnp.float32)
  expected = 1 / (1 + np.exp(-0.25))
  for mask in (None, jnp.array([[[[True, True]]]])):
    out = core.dot_product_attention(q, k, v, bias=bias, mask=mask)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=4e-3)  # bf16 output
  np.testing.assert_allclose(core.attention_weights(q, k, bias=bias)[0, 0, 0],
                             [1 - expected, expected], atol=1e-6)


def test_attention_weights_of_bfloat16_inputs_score_in_float32():
  # Logits q·k/√H = 100 and 100.25: weights σ(∓0.25) = (0.4378, 0.5622). Logits rounded to
  # bfloat16 (steps of 0.5 near 100) would give (0.5, 0.5).
  q = jnp.array([16, 16, 0, 0], jnp.bfloat16).reshape(1, 1, 1, 4)
  k = jnp.array([[12.5, 0, 0, 0], [12.5, 0.03125, 0, 0]], jnp.bfloat16).reshape(1, 2, 1, 4)
  expected = 1 / (1 + np.exp(-0.25))
  np.testing.assert_allclose(core.attention_weights(q, k)[0, 0, 0], [1 - expected, expected],
                             atol=1e-6)


def test_masks_and_biases_of_fewer_than_four_axes_are_refused_even_when_they_would_broadcast():
  # With as many sequences as positions (B = T = S = 3), a [B, S] padding mask broadcasts as a
  # [T, S] one from the right: query t of every sequence would see sequence t's valid keys.
  # Such masks and biases are refused, in one sentence naming the shape; [B, 1, 1, S] is read.
  q = draw((3, 3, 2, 4), 1)
  valid_BxS = np.array([[True, False, False], [True, True, False], [True, True, True]])
  for kwargs, shape in ((dict(mask=valid_BxS), '(3, 3)'), (dict(mask=valid_BxS[None]), '(1, 3, 3)'),
                        (dict(bias=np.zeros((3, 3), np.float32)), '(3, 3)')):
    what = 'mask' if 'mask' in kwargs else 'bias'
    for fn in (core.dot_product_attention, lambda q, k, v, **kw: core.attention_weights(q, k, **kw)):
      message = one_sentence(lambda: fn(q, q, q, **kwargs), f'attention {what} of shape {shape}',
                             '[B, 1, 1, S]')
      assert f'a [T, S] {what} as {what}[None, None]' in message
  weights = core.attention_weights(q, q, mask=core.key_mask(valid_BxS))
  for b in range(3):
    np.testing.assert_array_equal(np.asarray(weights[b]) > 0,
                                  np.broadcast_to(valid_BxS[b], (2, 3, 3)))


def test_mask_helpers_match_loops():
  np.testing.assert_array_equal(core.causal_mask(3, 6), causal_allowed(3, 6))
  np.testing.assert_array_equal(core.causal_mask(2, 6, offset=3), causal_allowed(2, 6, offset=3))
  np.testing.assert_array_equal(core.key_mask(core.padding_mask(jnp.array([6, 2, 0]), 6)),
                                padding_allowed([6, 2, 0], 6))
  a, b = _random_mask(4, 5), np.random.default_rng(0).random((B, N, 4, 5)) < 0.5
  np.testing.assert_array_equal(core.combine_masks(None, a, None, b), a & b)
  assert core.combine_masks(None, None) is None


@pytest.mark.parametrize('name', ['padding', 'random_mask', 'causal_padding_cross_shapes'])
def test_fully_masked_rows_are_exact_zeros_with_finite_gradients(name):
  (q, k, v), kwargs, reference_kwargs = _case(name)
  empty_BxNxT = ~np.broadcast_to(reference_kwargs['allowed'], (B, N) + q.shape[1:2] + k.shape[1:2]
                                 ).any(-1)
  assert empty_BxNxT.any()
  mask, causal = kwargs['mask'], kwargs['causal']

  @jax.jit
  def outputs_and_gradients(q, k, v):
    attend = lambda q, k, v: core.dot_product_attention(q, k, v, mask=mask, causal=causal)
    weigh = lambda q, k: core.attention_weights(q, k, mask=mask, causal=causal)
    return (attend(q, k, v), weigh(q, k),
            jax.grad(lambda *qkv: attend(*qkv).sum(), argnums=(0, 1, 2))(q, k, v),
            jax.grad(lambda q, k: (weigh(q, k) ** 2).sum(), argnums=(0, 1))(q, k))

  out_BxTxNxH, weights, attend_grads, weigh_grads = jax.tree_util.tree_map(
      np.asarray, outputs_and_gradients(q, k, v))
  rows = out_BxTxNxH.transpose(0, 2, 1, 3)[empty_BxNxT]
  np.testing.assert_array_equal(rows, np.zeros_like(rows))
  assert np.isfinite(out_BxTxNxH).all()
  np.testing.assert_array_equal(weights[empty_BxNxT], 0.0)
  for argument, grad in zip('qkvqk', attend_grads + weigh_grads):
    assert np.isfinite(grad).all(), argument


# ---- softmax properties on the attention weights -------------------------------------------

LAMBDAS = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)


@jax.jit
def _weights_at_scales_and_shifted(q_BxTxNxH, k_BxSxNxH, shift_BxNxTx1):
  """attention_weights(λ q, k) for every λ in LAMBDAS, stacked on a leading axis, and the
  weights with `shift` added to every logit of a row."""
  return (jnp.stack([core.attention_weights(lam * q_BxTxNxH, k_BxSxNxH) for lam in LAMBDAS]),
          core.attention_weights(q_BxTxNxH, k_BxSxNxH, bias=shift_BxNxTx1))


# Few shapes (each compiles once), many draws.
@settings(max_examples=30, deadline=None, derandomize=True)
@given(keys=st.sampled_from([1, 5]), width=st.sampled_from([2, 4]), seed=st.integers(0, 2**31 - 1),
       scale=st.floats(0.1, 3.0))
def test_softmax_properties_of_the_attention_weights(keys, width, seed, scale):
  batch, steps, heads = 2, 3, 2
  rng = np.random.default_rng(seed)
  q = (rng.normal(size=(batch, steps, heads, width)) * scale).astype(np.float32)
  k = (rng.normal(size=(batch, keys, heads, width)) * scale).astype(np.float32)
  shift_BxNxTx1 = rng.uniform(-10, 10, size=(batch, heads, steps, 1)).astype(np.float32)
  weights_LxBxNxTxS, shifted = _weights_at_scales_and_shifted(q, k, shift_BxNxTx1)
  weights_LxBxNxTxS = np.asarray(weights_LxBxNxTxS, np.float64)
  weights = weights_LxBxNxTxS[0]
  # Values in (0, 1], rows summing to 1.
  assert (weights > 0).all() and (weights <= 1).all()
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
  # Invariance to a constant added to every logit of a row.
  np.testing.assert_allclose(shifted, weights, atol=2e-6)  # measured: 5.1e-7
  # softmax(λz) → one-hot(argmax z) as λ grows, for rows whose maximum is unique by a margin.
  logits_BxNxTxS = np.einsum('btnh,bsnh->bnts', q.astype(np.float64), k) / np.sqrt(width)
  top2 = np.sort(logits_BxNxTxS, axis=-1)[..., -2:] if keys > 1 else None
  one_hot = np.eye(keys)[np.argmax(logits_BxNxTxS, axis=-1)]
  distance_LxBxNxT = np.abs(weights_LxBxNxTxS - one_hot).sum(-1)
  unique = (np.ones(logits_BxNxTxS.shape[:-1], bool) if keys == 1
            else top2[..., 1] - top2[..., 0] > 0.05)
  distance_LxR = distance_LxBxNxT[:, unique]
  assert (np.diff(distance_LxR, axis=0) <= 1e-7).all()
  assert (distance_LxR[-1] < 1e-6).all()


# ---- a golden lookup --------------------------------------------------------------------------

def test_one_hot_queries_look_values_up_in_a_table():
  scale = 10.0  # logits c²/√H = 50 on the matching key and 0 elsewhere: e^-50 leaks
  keys_SxH = scale * np.eye(4, dtype=np.float32)
  values_SxH = np.array([[1, 2, 3, 4],
                         [-5, 6, -7, 8],
                         [0.5, 0.25, 0.125, 0],
                         [9, -9, 9, -9]], np.float32)
  queries_TxH = scale * np.array([[0, 0, 1, 0],      # e_3
                                  [1, 0, 0, 0],      # e_1
                                  [0, 0, 0, 1],      # e_4
                                  [0, 1, 0, 0],      # e_2
                                  [1, 1, 0, 0]],     # e_1 + e_2: the two rows' mean
                                 np.float32)
  expected_TxH = np.array([[0.5, 0.25, 0.125, 0],
                           [1, 2, 3, 4],
                           [9, -9, 9, -9],
                           [-5, 6, -7, 8],
                           [-2, 4, -2, 6]])
  out = core.dot_product_attention(queries_TxH[None, :, None], keys_SxH[None, :, None],
                                   values_SxH[None, :, None])
  np.testing.assert_allclose(out[0, :, 0], expected_TxH, atol=1e-6, rtol=0)


# ---- multi-head attention --------------------------------------------------------------------

def random_params(module, seed, *args, **kwargs):
  """N(0, 0.5²) draws in the shapes of the module's parameters (biases included, which init
  zeros), from the shapes alone (`eval_shape` compiles nothing)."""
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.PRNGKey(0), *args, **kwargs)))
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda a: (rng.normal(size=a.shape) * 0.5).astype(np.float32),
                                shapes['params'])


def _rotate_reference(x_BxTxNxH, positions_T, base=10_000.0):
  """(x_2j, x_2j+1) ↦ (x_2j cos pθ_j − x_2j+1 sin pθ_j, x_2j sin pθ_j + x_2j+1 cos pθ_j),
  θ_j = base^(−2j/H), by a loop."""
  out = np.array(x_BxTxNxH, np.float64)
  width = out.shape[-1]
  for t, p in enumerate(positions_T):
    for j in range(width // 2):
      angle = p * base ** (-2 * j / width)
      even, odd = out[:, t, :, 2 * j].copy(), out[:, t, :, 2 * j + 1].copy()
      out[:, t, :, 2 * j] = even * np.cos(angle) - odd * np.sin(angle)
      out[:, t, :, 2 * j + 1] = even * np.sin(angle) + odd * np.cos(angle)
  return out


def reference_mha(params, x_q_BxTxD, x_kv_BxSxD, *, allowed=None, positions='none', causal=False):
  """Head n: softmax(q_n k_nᵀ/√H (+ ALiBi) masked) v_n, with q_n = x_q W^Q[:, n] + b^Q[n] etc.;
  heads concatenated and projected: [head_1; …; head_N] W^O + b^O, W^O as [N·H, D′]."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  x_q, x_kv = np.asarray(x_q_BxTxD, np.float64), np.asarray(x_kv_BxSxD, np.float64)
  heads, width = p['query']['kernel'].shape[1:]
  batch, steps = x_q.shape[:2]
  keys = x_kv.shape[1]
  project = lambda x, name, n: x @ p[name]['kernel'][:, n, :] + p[name]['bias'][n]
  q = np.stack([project(x_q, 'query', n) for n in range(heads)], axis=2)
  k = np.stack([project(x_kv, 'key', n) for n in range(heads)], axis=2)
  v = np.stack([project(x_kv, 'value', n) for n in range(heads)], axis=2)
  bias = None
  if positions == 'rotary':
    q, k = _rotate_reference(q, range(steps)), _rotate_reference(k, range(keys))
  if positions == 'alibi':
    slopes = np.asarray(core.positions_lib.alibi_slopes(heads), np.float64)
    distance = np.array([[i - j if causal else abs(i - j) for j in range(keys)]
                         for i in range(steps)])
    bias = -slopes[:, None, None] * distance[None]
  if causal:
    causal_TxS = causal_allowed(steps, keys)
    allowed = causal_TxS if allowed is None else allowed & causal_TxS
  concat_heads = np.zeros((batch, steps, heads * width))
  for n in range(heads):
    head, _ = reference_attention(q[:, :, n:n + 1], k[:, :, n:n + 1], v[:, :, n:n + 1],
                                  allowed=None if allowed is None else np.broadcast_to(
                                      allowed, (batch, heads, steps, keys))[:, n:n + 1],
                                  bias=None if bias is None else bias[n:n + 1])
    concat_heads[:, :, n * width:(n + 1) * width] = head[:, :, 0]
  w_out = p['out']['kernel'].reshape(heads * width, -1)
  return concat_heads @ w_out + p['out']['bias']


MHA_CASES = {
    # name: (module options, T, S or None for self-attention, causal, key lengths or None)
    'self': (dict(num_heads=3), 5, None, False, None),
    'self_causal': (dict(num_heads=3), 5, None, True, None),
    'self_padding': (dict(num_heads=3), 5, None, False, [5, 3]),
    'self_causal_padding': (dict(num_heads=3, out_features=7), 5, None, True, [4, 2]),
    'cross': (dict(num_heads=3, head_dim=5, out_features=10), 4, 6, False, None),
    'cross_padding': (dict(num_heads=2), 4, 6, False, [6, 1]),
    'self_rotary_causal': (dict(num_heads=2, positions='rotary'), 6, None, True, None),
    'self_alibi_causal': (dict(num_heads=3, positions='alibi'), 6, None, True, None),
    'self_alibi_bidirectional': (dict(num_heads=3, positions='alibi'), 6, None, False, [6, 4]),
}


@pytest.mark.parametrize('name', sorted(MHA_CASES))
def test_multi_head_attention_is_independent_heads_concatenated_and_projected(name):
  options, steps, keys, causal, lengths = MHA_CASES[name]
  module = core.MultiHeadAttention(**options)
  width = 12
  x_q = draw((2, steps, width), 11)
  x_kv = None if keys is None else draw((2, keys, width), 12)
  mask = (None if lengths is None
          else core.key_mask(core.padding_mask(jnp.array(lengths), keys or steps)))
  params = random_params(module, 13, x_q, x_kv, mask=mask, causal=causal)
  out = jax.jit(lambda params, x_q, x_kv, mask: module.apply(
      {'params': params}, x_q, x_kv, mask=mask, causal=causal))(params, x_q, x_kv, mask)
  allowed = None if lengths is None else padding_allowed(lengths, keys or steps)
  expected = reference_mha(params, x_q, x_q if x_kv is None else x_kv, allowed=allowed,
                           positions=options.get('positions', 'none'), causal=causal)
  assert out.shape == (2, steps, options.get('out_features', width))
  # Parameters ~N(0, 0.5²) give outputs up to 10: the largest difference measured is 1.7e-6.
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-5)


def test_multi_head_attention_rejects_bad_options():
  x = jnp.zeros((1, 3, 10))
  cases = [(core.MultiHeadAttention(3), dict(), 'width 10 is not divisible by num_heads=3'),
           (core.MultiHeadAttention(2, positions='sinusoidal'), dict(), "positions='sinusoidal'"),
           (core.MultiHeadAttention(2, positions='rotary'), dict(x_kv_BxSxD=x),
            'self-attention only'),
           (core.MultiHeadAttention(2), dict(decode=True), 'decode=True needs causal')]
  for module, kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      module.init(jax.random.PRNGKey(0), x, **kwargs)


@pytest.mark.parametrize('option, value', [('num_heads', 0), ('num_heads', -2), ('head_dim', 0),
                                           ('head_dim', -2), ('head_dim', True)])
def test_a_head_count_or_width_that_is_not_a_positive_integer_is_one_sentence(option, value):
  # num_heads 0 divided the width by zero and -2 made a kernel of negative shape; head_dim 0
  # fell back to the default width silently.
  x = jnp.zeros((1, 3, 8))
  layers = [core.MultiHeadAttention(**{'num_heads': 2, option: value})]
  if option == 'num_heads':  # The block's own attention checks it alike.
    layers.append(TransformerBlock(value, mlp_dim=8))
  for layer in layers:
    one_sentence(lambda: layer.init(jax.random.PRNGKey(0), x),
                 f'MultiHeadAttention {option} must be a positive integer, got {value!r}.')


# ---- the key/value cache ---------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=(0,))
def _full_and_decoded(module, params, x_BxTxD):
  """Causal self-attention over x in one pass, and through the cache: (a) one input per call,
  (b) the first three inputs in one call, then one per call. Returns the three outputs and
  the cache index after (a)."""
  full = module.apply({'params': params}, x_BxTxD, causal=True)
  initial_cache = module.init(jax.random.PRNGKey(0), x_BxTxD, causal=True, decode=True)['cache']

  def step(cache, x_BxD):
    out_Bx1xD, mutated = module.apply({'params': params, 'cache': cache}, x_BxD[:, None],
                                      causal=True, decode=True, mutable=['cache'])
    return mutated['cache'], out_Bx1xD[:, 0]

  def one_per_call(cache, x_BxSxD):
    cache, out_SxBxD = jax.lax.scan(step, cache, x_BxSxD.transpose(1, 0, 2))
    return out_SxBxD.transpose(1, 0, 2), cache

  one_by_one, cache = one_per_call(initial_cache, x_BxTxD)
  chunk_out, mutated = module.apply({'params': params, 'cache': initial_cache}, x_BxTxD[:, :3],
                                    causal=True, decode=True, mutable=['cache'])
  rest, _ = one_per_call(mutated['cache'], x_BxTxD[:, 3:])
  return full, [one_by_one, jnp.concatenate([chunk_out, rest], axis=1)], cache['cache_index']


@pytest.mark.parametrize('positions, attention', [('none', 'exact'), ('rotary', 'exact'),
                                                  ('alibi', 'exact'), ('none', 'chunked')])
def test_multi_head_attention_cache_matches_the_full_causal_pass(positions, attention):
  # Chunked attention decodes too: over the cache it is exact attention with a causal mask,
  # which the chunked kind itself would refuse (it takes valid keys [B, 1, 1, S] only).
  module = core.MultiHeadAttention(2, positions=positions, attention=attention)
  x = draw((2, 6, 8), 21)
  params = random_params(module, 22, x, causal=True)
  full, decoded, cache_index = _full_and_decoded(module, params, x)
  for first_chunk, out in zip((1, 3), decoded):
    # Bit-identical on this CPU; another backend may order the sums differently.
    np.testing.assert_allclose(out, full, rtol=1e-5, atol=1e-5,
                               err_msg=f'first chunk {first_chunk}')
  assert int(cache_index) == 6


def test_decoding_keeps_the_callers_key_mask_over_the_cache():
  """Left padding given as a key mask [B, 1, 1, L] while decoding (the prompt in one call, then
  one input per call) stays masked alongside the cache's causal mask: the float64 reference."""
  module = core.MultiHeadAttention(2)
  x = draw((2, 5, 8), 27)
  params = random_params(module, 28, x, causal=True)
  valid_BxS = np.array([[True] * 5, [False, False, True, True, True]])

  @jax.jit
  def decode(params, x_BxTxD):
    cache = module.init(jax.random.PRNGKey(0), x_BxTxD, causal=True, decode=True)['cache']
    outs = []
    for start, stop in ((0, 3), (3, 4), (4, 5)):
      out, mutated = module.apply({'params': params, 'cache': cache}, x_BxTxD[:, start:stop],
                                  mask=core.key_mask(valid_BxS), causal=True, decode=True,
                                  mutable=['cache'])
      cache = mutated['cache']
      outs.append(out)
    return jnp.concatenate(outs, axis=1)

  expected = reference_mha(params, x, x, allowed=valid_BxS[:, None, None, :], causal=True)
  np.testing.assert_allclose(decode(params, x), expected, rtol=1e-5, atol=2e-5)


def test_bfloat16_compute_keeps_float32_parameters_and_bfloat16_activations():
  """dtype=bfloat16: the parameters stay float32; q, k, v, the attention and the output are
  bfloat16 (a float32 kernel or bias used unconverted promotes them to float32); the output is
  the float64 reference to bfloat16 precision."""
  module = core.MultiHeadAttention(2, dtype=jnp.bfloat16)
  x = draw((2, 5, 8), 31)
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.PRNGKey(0), x, causal=True)))
  assert {a.dtype for a in jax.tree_util.tree_leaves(shapes)} == {np.dtype(np.float32)}
  params = random_params(module, 32, x, causal=True)
  out, state = jax.jit(lambda params, x: module.apply(
      {'params': params}, x, causal=True, capture_intermediates=True))(params, x)
  for name in ('query', 'key', 'value', 'attend', 'out'):
    assert state['intermediates'][name]['__call__'][0].dtype == jnp.bfloat16, name
  assert out.dtype == jnp.bfloat16
  expected = reference_mha(params, x, x, causal=True)
  # 8 significant bits: the largest difference measured is 0.041 (outputs up to 5).
  np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=0,
                             atol=0.02 * np.abs(expected).max())


def test_multi_head_attention_cache_refuses_to_run_past_its_end():
  """The cache holds 4 positions: a call of 5 steps raises; inside jit, a call that starts
  at 3 with 2 steps (positions 3 and 4) returns NaN rather than silently clamping the write;
  the call that exactly fills the cache stays finite."""
  module = core.MultiHeadAttention(2)
  x = draw((1, 4, 8), 23)
  variables = module.init(jax.random.PRNGKey(0), x, causal=True, decode=True)
  params, cache = variables['params'], variables['cache']
  with pytest.raises(ValueError, match='5 decoding steps in one call exceed the cache length 4'):
    module.apply({'params': params, 'cache': cache}, draw((1, 5, 8), 24), causal=True,
                 decode=True, mutable=['cache'])

  @jax.jit
  def decode(cache, x_BxSxD):
    return module.apply({'params': params, 'cache': cache}, x_BxSxD, causal=True, decode=True,
                        mutable=['cache'])

  out, mutated = decode(cache, x[:, :3])
  assert np.isfinite(out).all()
  past_end, _ = decode(mutated['cache'], x[:, :2])
  assert np.isnan(past_end).all()
  filled, _ = decode(mutated['cache'], x[:, 3:])
  assert np.isfinite(filled).all()


def test_one_decoding_call_of_exactly_the_cache_length_fills_it():
  """A prompt as long as the cache, written in one call (steps = L), is accepted and equals the
  full causal pass: only steps > L exceed the cache (a `>=` there refused a whole-cache
  prefill)."""
  module = core.MultiHeadAttention(2)
  x = draw((2, 4, 8), 25)
  params = random_params(module, 26, x, causal=True)
  cache = module.init(jax.random.PRNGKey(0), x, causal=True, decode=True)['cache']
  out, mutated = module.apply({'params': params, 'cache': cache}, x, causal=True, decode=True,
                              mutable=['cache'])
  full = module.apply({'params': params}, x, causal=True)
  np.testing.assert_allclose(out, full, rtol=1e-5, atol=1e-5)
  assert int(mutated['cache']['cache_index']) == 4


def test_use_bias_false_leaves_every_projection_without_a_bias():
  module = core.MultiHeadAttention(2, use_bias=False)
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.PRNGKey(0),
                                                       jnp.zeros((1, 3, 8))))['params'])
  assert jax.tree_util.tree_map(np.shape, shapes) == {
      'query': {'kernel': (8, 2, 4)}, 'key': {'kernel': (8, 2, 4)},
      'value': {'kernel': (8, 2, 4)}, 'out': {'kernel': (2, 4, 8)}}


def test_projection_kernels_are_lecun_normal_over_their_whole_fan_in():
  """Var(W) = 1/fan_in with the fan-in of the matrix the kernel stands for: D for the [D, N, H]
  query/key/value kernels (not N·D, what lecun_normal's default axes, in = −2 and out = −1,
  would take for a [D, N, H] kernel), and N·H for W^O [N, H, D′]."""
  width, heads, head_dim = 64, 8, 16
  module = core.MultiHeadAttention(heads, head_dim=head_dim, out_features=64)
  params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 2, width)))['params']
  params = nn.meta.unbox(params)
  # lecun_normal draws a truncated normal whose standard deviation is exactly 1/√fan_in.
  for name, fan_in in [('query', width), ('key', width), ('value', width),
                       ('out', heads * head_dim)]:
    kernel = np.asarray(params[name]['kernel'])
    assert kernel.size == 8192
    # Standard error of the estimate ≈ 1/√(2·8192) ≈ 0.8 %.
    np.testing.assert_allclose(kernel.std(), 1 / np.sqrt(fan_in), rtol=0.05, err_msg=name)


@pytest.mark.parametrize('mask, message', [
    # A padding mask [B, S] as it comes from `padding_mask`, without `key_mask`'s new axes.
    (np.ones((2, 5), bool), r'An attention mask of shape \(2, 5\) does not broadcast to '
                            r'\[B, N, T, S\] = \(2, 2, 5, 5\); give its 4 axes, each 1 or the '
                            r'full size \(valid keys \[B, S\] as \[B, 1, 1, S\] by `key_mask`'),
    (np.ones((2, 1, 1, 4), bool), r'An attention mask of shape \(2, 1, 1, 4\) does not broadcast '
                                  r'to \[B, N, T, S\] = \(2, 2, 5, 5\)'),
    (np.ones((2, 1, 1, 5), np.float32), 'An attention mask must be bool .* got float32.'),
])
def test_a_mask_of_the_wrong_shape_or_dtype_is_one_sentence(mask, message):
  layer = core.MultiHeadAttention(num_heads=2)
  x = jnp.ones((2, 5, 8))
  params = layer.init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match=message):
    layer.apply(params, x, mask=mask)
  q = jnp.ones((2, 5, 2, 4))
  with pytest.raises(ValueError, match=message):
    core.attention_weights(q, q, mask=mask)

