"""Exact attention in blocks, with memory linear in length, forward and backward
(Rabe & Staats 2021, "Self-attention does not need O(n²) memory"; Dao et al. 2022, FlashAttention).

  out_t = Σ_s softmax_s(q_t·k_s / √H over the allowed keys) v_s

is computed without the [T, S] score matrix. Queries are cut into I blocks of C, keys into
J blocks of K; each query block runs the online softmax over the key blocks, keeping a
running maximum m, denominator l and numerator acc:

  s = q kᵀ/√H (masked: −∞),   m′ = max(m, rowmax s),
  acc ← acc·e^{m−m′} + e^{s−m′} v,   l ← l·e^{m−m′} + rowsum e^{s−m′},   out = acc / l.

The backward pass is FlashAttention's: from (q, k, v, out) and the log-sum-exp
L = m + log l it recomputes each block's probabilities P = e^{s−L} and forms

  dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D),   dQ = dS K / √H,   dK = dSᵀ Q / √H,

with D = rowsum(dO ∘ O), so that only O(T·H) residuals are stored.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax


def chunked_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, causal: bool = False,
                      key_valid_BxS: jax.Array | None = None, query_block: int = 512,
                      key_block: int = 512):
  """softmax(q kᵀ / √H, masked) v per head, exactly, by the online softmax over key blocks
  (Rabe & Staats 2021; Dao et al. 2022); see the module docstring for the recurrences.

  `causal` lets query i attend to keys j ≤ i (as `core.causal_mask`); `key_valid_BxS`
  (bool, True = real token) masks padded keys. A query with no allowed key returns zeros,
  and its gradients are zero.

  A length L is cut into ceil(L / block) blocks of equal size ceil(L / number of blocks),
  never more than `block` (L = 600, block 512: two blocks of 300), and the few positions
  this adds at the end are padding: padded keys are masked out, padded queries dropped.
  Memory is O((T + S)·N·H + C·K·N) per batch row, forward and backward. Scores, the
  softmax statistics and all sums are float32; P and dS enter their products in the
  inputs' dtype, as in FlashAttention; the output has q's dtype. In causal mode key blocks
  entirely after a query block are skipped.
  """
  _check_arguments(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, key_valid_BxS, query_block, key_block)
  batch, steps = q_BxTxNxH.shape[:2]
  keys = k_BxSxNxH.shape[1]
  query_size, padded_steps = _block_size(steps, query_block)
  key_size, padded_keys = _block_size(keys, key_block)
  valid_BxS = (jnp.ones((batch, keys), bool) if key_valid_BxS is None
               else jnp.asarray(key_valid_BxS))

  def pad(x, length):
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))

  out_BxTxNxH = _attention(pad(q_BxTxNxH, padded_steps), pad(k_BxSxNxH, padded_keys),
                           pad(v_BxSxNxH, padded_keys), pad(valid_BxS, padded_keys),
                           bool(causal), query_size, key_size)
  return out_BxTxNxH[:, :steps]


def _check_arguments(q, k, v, key_valid, query_block, key_block):
  for name, x in (('q', q), ('k', k), ('v', v)):
    if jnp.ndim(x) != 4:
      raise ValueError(f'chunked_attention: {name} has shape {jnp.shape(x)}; it must be '
                       f'[batch, length, heads, width].')
  if not (q.shape[0] == k.shape[0] == v.shape[0] and q.shape[2] == k.shape[2] == v.shape[2]
          and q.shape[3] == k.shape[3] and k.shape[1] == v.shape[1]):
    raise ValueError(f'chunked_attention: q {q.shape}, k {k.shape} and v {v.shape} must agree in '
                     f'batch and heads, q and k in width, k and v in length.')
  if key_valid is not None and (jnp.shape(key_valid) != (k.shape[0], k.shape[1])
                                or jnp.result_type(key_valid) != jnp.bool_):
    raise ValueError(f'chunked_attention: key_valid_BxS has shape {jnp.shape(key_valid)} and dtype '
                     f'{jnp.result_type(key_valid)}; it must be bool of shape {k.shape[:2]}.')
  for name, block in (('query_block', query_block), ('key_block', key_block)):
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
      raise ValueError(f'chunked_attention: {name}={block!r}; it must be a positive integer.')


def _block_size(length: int, block: int) -> tuple[int, int]:
  """(block size, padded length): ceil(length / block) equal blocks, padding under one per block."""
  num_blocks = -(-length // block)
  size = -(-length // num_blocks)
  return size, num_blocks * size


def _blocks(x_BxLx_, size):
  """[B, L, …] → [L / size, B, size, …], the block index leading so loops can index it."""
  batch, length = x_BxLx_.shape[:2]
  x = x_BxLx_.reshape((batch, length // size, size) + x_BxLx_.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _unblock(x_IxBxCx_):
  x = jnp.moveaxis(x_IxBxCx_, 0, 1)
  return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])


def _masked_scores(q_BxCxNxH, k_BxKxNxH, valid_BxK, i, j, causal, query_size, key_size):
  """Scores q kᵀ/√H [B, N, C, K] of query block i against key block j, −∞ where not allowed."""
  scale = 1 / math.sqrt(q_BxCxNxH.shape[-1])
  s_BxNxCxK = jnp.einsum('bcnh,bknh->bnck', q_BxCxNxH, k_BxKxNxH,
                         preferred_element_type=jnp.float32) * scale
  allowed_BxNxCxK = valid_BxK[:, None, None, :]
  if causal:
    query_positions_C = i * query_size + jnp.arange(query_size)
    key_positions_K = j * key_size + jnp.arange(key_size)
    allowed_BxNxCxK = allowed_BxNxCxK & (key_positions_K[None, :] <= query_positions_C[:, None])
  return jnp.where(allowed_BxNxCxK, s_BxNxCxK, -jnp.inf)


def _forward(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, causal, query_size, key_size):
  """(out [B, T, N, H] in q's dtype, log-sum-exp L [I, B, N, C] in float32; +∞ on empty rows)."""
  q_IxBxCxNxH = _blocks(q_BxTxNxH, query_size)
  k_JxBxKxNxH, v_JxBxKxNxH = _blocks(k_BxSxNxH, key_size), _blocks(v_BxSxNxH, key_size)
  valid_JxBxK = _blocks(valid_BxS, key_size)
  num_key_blocks = k_JxBxKxNxH.shape[0]
  batch, _, heads, width = v_BxSxNxH.shape

  def one_query_block(args):
    i, q_BxCxNxH = args

    def step(j, carry):
      m_BxNxC, l_BxNxC, acc_BxCxNxH = carry
      s_BxNxCxK = _masked_scores(q_BxCxNxH, k_JxBxKxNxH[j], valid_JxBxK[j], i, j, causal,
                                 query_size, key_size)
      m_new_BxNxC = jnp.maximum(m_BxNxC, s_BxNxCxK.max(-1))
      # While a row has seen no allowed key its maximum is −∞, and e^{−∞ − (−∞)} would be NaN;
      # shifting by 0 instead gives e^{−∞} = 0 for both the scores and the old terms.
      shift_BxNxC = jnp.where(m_new_BxNxC == -jnp.inf, 0.0, m_new_BxNxC)
      p_BxNxCxK = jnp.exp(s_BxNxCxK - shift_BxNxC[..., None])
      rescale_BxNxC = jnp.exp(m_BxNxC - shift_BxNxC)
      l_BxNxC = l_BxNxC * rescale_BxNxC + p_BxNxCxK.sum(-1)
      acc_BxCxNxH = (acc_BxCxNxH * rescale_BxNxC.transpose(0, 2, 1)[..., None]
                     + jnp.einsum('bnck,bknh->bcnh', p_BxNxCxK.astype(v_BxSxNxH.dtype),
                                  v_JxBxKxNxH[j], preferred_element_type=jnp.float32))
      return m_new_BxNxC, l_BxNxC, acc_BxCxNxH

    # Causal: key block j holds keys from j·K on, so only blocks up to the last query's
    # position (i + 1)·C − 1 can be attended.
    end = (jnp.minimum(num_key_blocks, ((i + 1) * query_size - 1) // key_size + 1) if causal
           else num_key_blocks)
    init = (jnp.full((batch, heads, query_size), -jnp.inf, jnp.float32),
            jnp.zeros((batch, heads, query_size), jnp.float32),
            jnp.zeros((batch, query_size, heads, width), jnp.float32))
    m_BxNxC, l_BxNxC, acc_BxCxNxH = lax.fori_loop(0, end, step, init)
    # A row that saw no allowed key has l = 0: its output is 0, and its L is +∞ so that the
    # backward pass's e^{s−L} is 0 too.
    seen_BxNxC = l_BxNxC > 0
    safe_l_BxNxC = jnp.where(seen_BxNxC, l_BxNxC, 1.0)
    inverse_l_BxCxN = jnp.where(seen_BxNxC, 1 / safe_l_BxNxC, 0.0).transpose(0, 2, 1)
    out_BxCxNxH = (acc_BxCxNxH * inverse_l_BxCxN[..., None]).astype(q_BxTxNxH.dtype)
    lse_BxNxC = jnp.where(seen_BxNxC, m_BxNxC + jnp.log(safe_l_BxNxC), jnp.inf)
    return out_BxCxNxH, lse_BxNxC

  out_IxBxCxNxH, lse_IxBxNxC = lax.map(one_query_block,
                                       (jnp.arange(q_IxBxCxNxH.shape[0]), q_IxBxCxNxH))
  return _unblock(out_IxBxCxNxH), lse_IxBxNxC


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, causal, query_size, key_size):
  return _forward(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, causal, query_size, key_size)[0]


def _attention_forward(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, causal, query_size, key_size):
  out_BxTxNxH, lse_IxBxNxC = _forward(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, causal,
                                      query_size, key_size)
  return out_BxTxNxH, (q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, out_BxTxNxH, lse_IxBxNxC)


def _attention_backward(causal, query_size, key_size, residuals, dout_BxTxNxH):
  q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, valid_BxS, out_BxTxNxH, lse_IxBxNxC = residuals
  scale = 1 / math.sqrt(q_BxTxNxH.shape[-1])
  q_IxBxCxNxH, dout_IxBxCxNxH = _blocks(q_BxTxNxH, query_size), _blocks(dout_BxTxNxH, query_size)
  # D = rowsum(dO ∘ O) equals rowsum(dP ∘ P), the softmax Jacobian's subtracted term.
  delta_IxBxNxC = jnp.einsum('ibcnh,ibcnh->ibnc', dout_IxBxCxNxH.astype(jnp.float32),
                             _blocks(out_BxTxNxH, query_size).astype(jnp.float32))
  num_query_blocks = q_IxBxCxNxH.shape[0]

  def one_key_block(dq_IxBxCxNxH, args):
    j, k_BxKxNxH, v_BxKxNxH, valid_BxK = args

    def step(i, carry):
      dq_IxBxCxNxH, dk_BxKxNxH, dv_BxKxNxH = carry
      q_BxCxNxH, dout_BxCxNxH = q_IxBxCxNxH[i], dout_IxBxCxNxH[i]
      s_BxNxCxK = _masked_scores(q_BxCxNxH, k_BxKxNxH, valid_BxK, i, j, causal, query_size,
                                 key_size)
      # Masked scores are −∞ and an empty row's L is +∞, so P is 0 there, never NaN.
      p_BxNxCxK = jnp.exp(s_BxNxCxK - lse_IxBxNxC[i][..., None])
      dv_BxKxNxH += jnp.einsum('bnck,bcnh->bknh', p_BxNxCxK.astype(dout_BxCxNxH.dtype),
                               dout_BxCxNxH, preferred_element_type=jnp.float32)
      dp_BxNxCxK = jnp.einsum('bcnh,bknh->bnck', dout_BxCxNxH, v_BxKxNxH,
                              preferred_element_type=jnp.float32)
      ds_BxNxCxK = p_BxNxCxK * (dp_BxNxCxK - delta_IxBxNxC[i][..., None])
      dk_BxKxNxH += jnp.einsum('bnck,bcnh->bknh', ds_BxNxCxK.astype(q_BxCxNxH.dtype), q_BxCxNxH,
                               preferred_element_type=jnp.float32)
      dq_IxBxCxNxH = dq_IxBxCxNxH.at[i].add(
          jnp.einsum('bnck,bknh->bcnh', ds_BxNxCxK.astype(k_BxKxNxH.dtype), k_BxKxNxH,
                     preferred_element_type=jnp.float32))
      return dq_IxBxCxNxH, dk_BxKxNxH, dv_BxKxNxH

    # Causal: query block i ends at position (i + 1)·C − 1, so it sees key block j
    # (starting at j·K) only from i = ⌊j·K / C⌋ on.
    start = (j * key_size) // query_size if causal else 0
    init = (dq_IxBxCxNxH, jnp.zeros(k_BxKxNxH.shape, jnp.float32),
            jnp.zeros(v_BxKxNxH.shape, jnp.float32))
    dq_IxBxCxNxH, dk_BxKxNxH, dv_BxKxNxH = lax.fori_loop(start, num_query_blocks, step, init)
    return dq_IxBxCxNxH, (dk_BxKxNxH * scale, dv_BxKxNxH)

  k_JxBxKxNxH, v_JxBxKxNxH = _blocks(k_BxSxNxH, key_size), _blocks(v_BxSxNxH, key_size)
  dq_IxBxCxNxH, (dk_JxBxKxNxH, dv_JxBxKxNxH) = lax.scan(
      one_key_block, jnp.zeros(q_IxBxCxNxH.shape, jnp.float32),
      (jnp.arange(k_JxBxKxNxH.shape[0]), k_JxBxKxNxH, v_JxBxKxNxH, _blocks(valid_BxS, key_size)))
  return ((_unblock(dq_IxBxCxNxH) * scale).astype(q_BxTxNxH.dtype),
          _unblock(dk_JxBxKxNxH).astype(k_BxSxNxH.dtype),
          _unblock(dv_JxBxKxNxH).astype(v_BxSxNxH.dtype),
          None)


_attention.defvjp(_attention_forward, _attention_backward)
