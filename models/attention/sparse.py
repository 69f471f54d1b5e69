"""Block-sparse attention, Child et al. 2019 ("Generating Long Sequences with Sparse Transformers").

Query i attends only to the keys j of a fixed set A_i:

  out_i = Σ_{j ∈ A_i} softmax_j(q_i·k_j / √H) v_j

The length is cut into blocks of l = `block` positions and each pattern is computed on blocks:
the keys a query block may see are gathered by static slices, scores are formed for those keys
only, and the exact set A_i is a boolean mask inside them. Child et al. give the two parts
A^(1), A^(2) of a pattern to different heads or layers; here every head attends to their union
(the paper's "merged" head).
"""

import jax
import jax.numpy as jnp

PATTERNS = ('local', 'strided', 'fixed')


def _blocks_at_offsets(x_BxCxLx, offsets):
  """[B, C, len(offsets)·L, …]: for block c, blocks c + o for each o in `offsets` side by side;
  blocks outside 0 … C−1 are zeros (False for a boolean x)."""
  before, after = max(0, -min(offsets)), max(0, max(offsets))
  padded = jnp.pad(x_BxCxLx, [(0, 0), (before, after)] + [(0, 0)] * (x_BxCxLx.ndim - 2))
  num_blocks = x_BxCxLx.shape[1]
  return jnp.concatenate([padded[:, before + o:before + o + num_blocks] for o in offsets], axis=2)


def _masked_softmax(logits, allowed):
  """softmax over the allowed entries of the last axis; rows with none allowed are zeros."""
  peak = jnp.max(jnp.where(allowed, logits, -jnp.inf), axis=-1, keepdims=True)
  peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
  # Masked before exp, not after: a large masked logit would give exp = inf, and the inf·0 of
  # its gradient NaN.
  unnormalised = jnp.exp(jnp.where(allowed, logits - peak, -jnp.inf))
  total = jnp.sum(unnormalised, axis=-1, keepdims=True)
  return unnormalised / jnp.where(total > 0, total, 1.0)


def sparse_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, pattern: str, block: int,
                     causal: bool = False, key_valid_BxS=None, summary: int = 1,
                     query_blocks: int = 8):
  """Sparse self-attention with one of Child et al.'s patterns (2019, §4.2–4.3):

    out_i = Σ_{j ∈ A_i} softmax_j(q_i·k_j / √H) v_j,   A_i = (A_i^(1) ∪ A_i^(2)) ∩ valid keys

  with l = `block`, blocks ⌊i/l⌋, and causal=True adding j ≤ i to every set:

    'local'    the query's block and the one before (causal), or before and after:
               A_i = {j : ⌊j/l⌋ − ⌊i/l⌋ ∈ {−1, 0}}  (causal, with j ≤ i),
                     {j : ⌊j/l⌋ − ⌊i/l⌋ ∈ {−1, 0, 1}}  (non-causal).
    'strided'  A^(1) = {j : |i − j| < l} (the last l positions when causal),
               A^(2) = {j : (i − j) mod l = 0}: the stride is the block size.
    'fixed'    A^(1) = {j : ⌊j/l⌋ = ⌊i/l⌋},
               A^(2) = {j : j mod l ∈ {l − c, …, l − 1}}, c = `summary` ("summary" positions
               that carry each block's information to later blocks).

  Cost per head, for T positions: 'local' T·(2 or 3)·l·H, linear in T; 'strided'
  T·(3l + T/l)·H and 'fixed' T·(l + c·T/l)·H, which are O(T^1.5) for l ≈ √T. A^(2) of
  'strided' is computed on the [T/l, l] view of the keys, where column r holds the positions
  ≡ r (mod l); A^(2) of 'fixed' on the (T/l)·c summary keys.

  The query blocks are processed `query_blocks` at a time (vectorised), the groups one after
  another (`jax.lax.map`), so the working set stays the same at every length and the time per
  position does not grow once it exceeds the caches; it changes no value.

  Self-attention only (T queries over the same T positions). T need not be a multiple of l:
  the sequence is padded to one with invalid keys, which leaves every A_i unchanged.
  `key_valid_BxS` (True = real token) masks padded keys; a query with no allowed key returns
  zeros.
  """
  if pattern not in PATTERNS:
    raise ValueError(f'sparse_attention pattern={pattern!r}; allowed: {", ".join(PATTERNS)}.')
  if not isinstance(block, int) or block < 1:
    raise ValueError(f'sparse_attention block={block!r}; allowed: a positive integer.')
  if pattern == 'fixed' and not (isinstance(summary, int) and 1 <= summary <= block):
    raise ValueError(f"sparse_attention summary={summary!r} for pattern 'fixed'; allowed: an "
                     f'integer from 1 to block={block}.')
  if not isinstance(query_blocks, int) or query_blocks < 1:
    raise ValueError(f'sparse_attention query_blocks={query_blocks!r}; allowed: a positive '
                     'integer.')
  batch, steps, heads, width = q_BxTxNxH.shape
  if k_BxSxNxH.shape[1] != steps or v_BxSxNxH.shape[1] != steps:
    raise ValueError(f'sparse_attention is self-attention: {steps} queries need {steps} keys '
                     f'and values, got {k_BxSxNxH.shape[1]} and {v_BxSxNxH.shape[1]}.')
  num_blocks = -(-steps // block)
  padded_steps = num_blocks * block
  valid_BxT = (jnp.ones((batch, steps), bool) if key_valid_BxS is None
               else jnp.asarray(key_valid_BxS, bool))

  def to_blocks(x_BxTx):
    x_BxTx = jnp.pad(x_BxTx, [(0, 0), (0, padded_steps - steps)] + [(0, 0)] * (x_BxTx.ndim - 2))
    return x_BxTx.reshape((batch, num_blocks, block) + x_BxTx.shape[2:])

  q_BxCxLxNxH, k_BxCxLxNxH, v_BxCxLxNxH = map(to_blocks, (q_BxTxNxH, k_BxSxNxH, v_BxSxNxH))
  valid_BxCxL = to_blocks(valid_BxT)
  block_C = jnp.arange(num_blocks)
  later = (lambda key, query: key < query) if causal else (lambda key, query: key != query)
  scale = width ** -0.5
  as_v = lambda w: w.astype(v_BxSxNxH.dtype)

  # The query's own block and its neighbours: all of 'local', A^(1) of 'strided' and 'fixed'.
  # Key position minus query position depends only on the places in the blocks, so the pattern
  # inside the neighbours is one [L, K] mask; neighbours past either end are invalid keys.
  offsets = (0,) if pattern == 'fixed' else (-1, 0) if causal else (-1, 0, 1)
  k_BxCxKxNxH = _blocks_at_offsets(k_BxCxLxNxH, offsets)
  v_BxCxKxNxH = _blocks_at_offsets(v_BxCxLxNxH, offsets)
  valid_BxCxK = _blocks_at_offsets(valid_BxCxL, offsets)
  place_L = jnp.arange(block)
  offset_LxK = ((block * jnp.asarray(offsets)[:, None] + place_L[None, :]).reshape(1, -1)
                - place_L[:, None])
  in_pattern_LxK = jnp.ones((block, len(offsets) * block), bool)
  if causal:
    in_pattern_LxK &= offset_LxK <= 0
  if pattern == 'strided':
    in_pattern_LxK &= jnp.abs(offset_LxK) < block
  if pattern == 'fixed':
    # The last `summary` positions of every block; those of the query's own block are in A^(1).
    def summaries(x_BxCxLx):
      x_BxCxMx = x_BxCxLx[:, :, block - summary:]
      return x_BxCxMx.reshape((batch, num_blocks * summary) + x_BxCxMx.shape[3:])
    k_BxMxNxH, v_BxMxNxH, valid_BxM = map(summaries, (k_BxCxLxNxH, v_BxCxLxNxH, valid_BxCxL))
    block_M = jnp.repeat(block_C, summary)

  def attend_block(args):
    """Output [B, L, N, H] of query block c, from its neighbours and (strided, fixed) the rest."""
    c, q_BxLxNxH, k_BxKxNxH, v_BxKxNxH, valid_BxK = args
    # Each part of A_i: (logits [B, N, L, K], allowed [B, 1, L, K], its weights ↦ its share
    # of the output [B, L, N, H]).
    parts = [(jnp.einsum('blnh,bknh->bnlk', q_BxLxNxH, k_BxKxNxH,
                         preferred_element_type=jnp.float32),
              in_pattern_LxK[None, None] & valid_BxK[:, None, None, :],
              lambda w: jnp.einsum('bnlk,bknh->blnh', as_v(w), v_BxKxNxH,
                                   preferred_element_type=jnp.float32))]
    if pattern == 'strided':
      # Query c·l + r and key d·l + r: j ≡ i (mod l). d = c is j = i, already in A^(1).
      parts.append((
          jnp.einsum('blnh,bdlnh->bnld', q_BxLxNxH, k_BxCxLxNxH,
                     preferred_element_type=jnp.float32),
          later(block_C, c)[None, None, None, :] & valid_BxCxL.transpose(0, 2, 1)[:, None],
          lambda w: jnp.einsum('bnld,bdlnh->blnh', as_v(w), v_BxCxLxNxH,
                               preferred_element_type=jnp.float32)))
    if pattern == 'fixed':
      parts.append((
          jnp.einsum('blnh,bmnh->bnlm', q_BxLxNxH, k_BxMxNxH, preferred_element_type=jnp.float32),
          (later(block_M, c)[None, :] & valid_BxM)[:, None, None, :],
          lambda w: jnp.einsum('bnlm,bmnh->blnh', as_v(w), v_BxMxNxH,
                               preferred_element_type=jnp.float32)))
    # One softmax over the parts together: they are disjoint, so A_i is their union.
    logits = jnp.concatenate([logits for logits, _, _ in parts], axis=-1) * scale
    allowed = jnp.concatenate([jnp.broadcast_to(allowed, logits_part.shape)
                               for logits_part, allowed, _ in parts], axis=-1)
    weights = _masked_softmax(logits, allowed)
    out_BxLxNxH, start = 0.0, 0
    for logits_part, _, weigh in parts:
      size = logits_part.shape[-1]
      out_BxLxNxH = out_BxLxNxH + weigh(weights[..., start:start + size])
      start += size
    return out_BxLxNxH

  # `query_blocks` query blocks at a time (vectorised), the groups in a loop: the working set
  # of one group does not grow with the length, so neither does the time per position.
  leading = lambda x: jnp.moveaxis(x, 1, 0)
  out_CxBxLxNxH = jax.lax.map(
      attend_block, (block_C, leading(q_BxCxLxNxH), leading(k_BxCxKxNxH), leading(v_BxCxKxNxH),
                     leading(valid_BxCxK)), batch_size=min(query_blocks, num_blocks))
  out_BxCxLxNxH = leading(out_CxBxLxNxH)
  out_BxTxNxH = out_BxCxLxNxH.reshape((batch, padded_steps, heads, v_BxSxNxH.shape[-1]))
  return out_BxTxNxH[:, :steps].astype(q_BxTxNxH.dtype)
