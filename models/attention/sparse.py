"""Block-sparse attention, Child et al. 2019 ("Generating Long Sequences with Sparse Transformers").

Query i attends only to the keys j of a fixed set A_i:

  out_i = Σ_{j ∈ A_i} softmax_j(q_i·k_j / √H) v_j

The length is cut into blocks of l = `block` positions and each pattern is computed on blocks:
the keys a query block may see are gathered by static slices, scores are formed for those keys
only, and the exact set A_i is a boolean mask inside them. Child et al. give the two parts
A^(1), A^(2) of a pattern to different heads or layers; here every head attends to their union
(the paper's "merged" head).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

PATTERNS = ('local', 'strided', 'fixed')


def _is_float(x):
  return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _map_recomputing(f, xs, shared):
  """jax.lax.map(lambda x: f(x, shared), xs), whose backward pass is another loop over the
  elements: f's VJP for each, recomputing f's forward there, the cotangents of `shared` summed
  along the way. The forward loop keeps nothing for the backward pass but its inputs, so each
  step of either loop works on one element's arrays, whatever the length of xs.

  Leaves of xs and shared that are not floating point (masks, indices) get no cotangent.
  """
  return jax.lax.map(lambda x: f(x, shared), xs)


def _map_recomputing_fwd(f, xs, shared):
  return _map_recomputing(f, xs, shared), (xs, shared)


def _map_recomputing_bwd(f, inputs, ct_ys):
  xs, shared = inputs
  floats = lambda tree: [a for a in jax.tree.leaves(tree) if _is_float(a)]

  def with_floats(tree, new_floats, keep_others=True):
    """`tree` with its floating-point leaves replaced by `new_floats` in order, and the others
    kept (or None: no cotangent)."""
    leaves, treedef = jax.tree.flatten(tree)
    new_floats = iter(new_floats)
    return treedef.unflatten([next(new_floats) if _is_float(a) else a if keep_others else None
                              for a in leaves])

  def element(ct_shared, args):
    x, ct_y = args
    _, pullback = jax.vjp(lambda fx, fs: f(with_floats(x, fx), with_floats(shared, fs)),
                          floats(x), floats(shared))
    ct_x, ct_s = pullback(ct_y)
    return [a + b for a, b in zip(ct_shared, ct_s)], ct_x

  ct_shared, ct_xs = jax.lax.scan(element, [jnp.zeros_like(a) for a in floats(shared)],
                                  (xs, ct_ys))
  return (with_floats(xs, ct_xs, keep_others=False),
          with_floats(shared, ct_shared, keep_others=False))


_map_recomputing.defvjp(_map_recomputing_fwd, _map_recomputing_bwd)


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
                     query_blocks: int = 4):
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
  another in a loop, so the working set stays the same at every length; it changes no value.
  The backward pass is a second loop over the groups that recomputes each group's scores
  (`_map_recomputing`) instead of keeping them all. With blocks of 128 keys, 4 query blocks of
  the non-causal 'local' pattern have [4, 128, 384] scores, 0.75 MB in float32, which stays
  inside a 1 MB per-core cache; groups of 8 ran 1.1–1.2× slower per position past 4,096
  positions (README, Benchmarks).

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
  block_C = np.arange(num_blocks)
  later = (lambda key, query: key < query) if causal else (lambda key, query: key != query)
  scale = width ** -0.5
  as_v = lambda w: w.astype(v_BxSxNxH.dtype)

  # The query's own block and its neighbours: all of 'local', A^(1) of 'strided' and 'fixed'.
  # Key position minus query position depends only on the places in the blocks, so the pattern
  # inside the neighbours is one [L, K] mask; neighbours past either end are invalid keys.
  offsets = (0,) if pattern == 'fixed' else (-1, 0) if causal else (-1, 0, 1)
  place_L = np.arange(block)
  offset_LxK = ((block * np.asarray(offsets)[:, None] + place_L[None, :]).reshape(1, -1)
                - place_L[:, None])
  in_pattern_LxK = np.ones((block, len(offsets) * block), bool)
  if causal:
    in_pattern_LxK &= offset_LxK <= 0
  if pattern == 'strided':
    in_pattern_LxK &= np.abs(offset_LxK) < block
  # The keys beyond the neighbours, which every query block of 'strided' and 'fixed' may see.
  shared = ()
  if pattern == 'strided':
    shared = (k_BxCxLxNxH, v_BxCxLxNxH, valid_BxCxL)
  if pattern == 'fixed':
    # The last `summary` positions of every block; those of the query's own block are in A^(1).
    def summaries(x_BxCxLx):
      x_BxCxMx = x_BxCxLx[:, :, block - summary:]
      return x_BxCxMx.reshape((batch, num_blocks * summary) + x_BxCxMx.shape[3:])
    shared = tuple(map(summaries, (k_BxCxLxNxH, v_BxCxLxNxH, valid_BxCxL)))
    block_M = np.repeat(block_C, summary)

  def attend_block(args, shared):
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
      k_BxCxLxNxH, v_BxCxLxNxH, valid_BxCxL = shared
      # Query c·l + r and key d·l + r: j ≡ i (mod l). d = c is j = i, already in A^(1).
      parts.append((
          jnp.einsum('blnh,bdlnh->bnld', q_BxLxNxH, k_BxCxLxNxH,
                     preferred_element_type=jnp.float32),
          later(block_C, c)[None, None, None, :] & valid_BxCxL.transpose(0, 2, 1)[:, None],
          lambda w: jnp.einsum('bnld,bdlnh->blnh', as_v(w), v_BxCxLxNxH,
                               preferred_element_type=jnp.float32)))
    if pattern == 'fixed':
      k_BxMxNxH, v_BxMxNxH, valid_BxM = shared
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

  # `query_blocks` = G query blocks at a time (vectorised), the groups in a loop. A group's
  # keys are its own G blocks plus a halo of one block on either side, and each block's
  # neighbours are put together from them inside the loop body, so they are never laid out
  # for the whole length (3× the keys and values).
  group = min(query_blocks, num_blocks)
  num_groups = -(-num_blocks // group)

  def to_groups(x_BxCx):
    """[num_groups, G, B, L, …], the blocks past the end padded (with zeros, or False)."""
    x_BxCx = jnp.pad(x_BxCx, [(0, 0), (0, num_groups * group - num_blocks)]
                     + [(0, 0)] * (x_BxCx.ndim - 2))
    x_CxBx = jnp.moveaxis(x_BxCx, 1, 0)
    return x_CxBx.reshape((num_groups, group) + x_CxBx.shape[1:])

  def with_halos(x_PxGxBx):
    """[num_groups, G + 2, B, L, …]: each group's blocks, the block before and the one after."""
    no_block = jnp.zeros_like(x_PxGxBx[:1, 0])
    before = jnp.concatenate([no_block, x_PxGxBx[:-1, -1]])
    after = jnp.concatenate([x_PxGxBx[1:, 0], no_block])
    return jnp.concatenate([before[:, None], x_PxGxBx, after[:, None]], axis=1)

  def attend_group(args, shared):
    c_G, q_GxBxLxNxH, k_WxBxLxNxH, v_WxBxLxNxH, valid_WxBxL = args
    # Block i of the group is block 1 + i of the window; its neighbour at offset o, 1 + i + o.
    neighbours = lambda x_WxBxL: jnp.concatenate(
        [x_WxBxL[1 + o:1 + o + group] for o in offsets], axis=2)
    return jax.vmap(attend_block, in_axes=(0, None))(
        (c_G, q_GxBxLxNxH, neighbours(k_WxBxLxNxH), neighbours(v_WxBxLxNxH),
         neighbours(valid_WxBxL)), shared)

  block_PxG = np.arange(num_groups * group).reshape(num_groups, group)
  out_PxGxBxLxNxH = _map_recomputing(attend_group, (
      block_PxG, to_groups(q_BxCxLxNxH),
      *(with_halos(to_groups(x)) for x in (k_BxCxLxNxH, v_BxCxLxNxH, valid_BxCxL))), shared)
  out_CxBxLxNxH = out_PxGxBxLxNxH.reshape((num_groups * group,) + out_PxGxBxLxNxH.shape[2:])
  out_BxCxLxNxH = jnp.moveaxis(out_CxBxLxNxH, 0, 1)[:, :num_blocks]
  out_BxTxNxH = out_BxCxLxNxH.reshape((batch, padded_steps, heads, v_BxSxNxH.shape[-1]))
  return out_BxTxNxH[:, :steps].astype(q_BxTxNxH.dtype)
