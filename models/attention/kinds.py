"""Attention kinds behind one call, selected by config (`model.attention`, `model.attention_options`).

  kind        what it computes                                     cost in length n   causal
  exact       softmax(q kᵀ/√H) v (`core.dot_product_attention`)     n² time, n² memory  yes
  chunked     the same, by an online softmax over key blocks        n² time, n memory   yes
  linear      φ(q)ᵀ Σ φ(k) vᵀ / φ(q)ᵀ Σ φ(k), φ = elu + 1             n                  yes
  performer   the same with positive random features of exp(qᵀk/√H) n·M                yes
  linformer   softmax(q (E k)ᵀ/√H) (F v), E, F ∈ ℝ^{k×L} learned     n·k                no
  local       softmax over the query's block and its neighbours     n·l                yes
  strided     local window ∪ every l-th position (earlier, causal)  n·(l + n/l)        yes
  fixed       own block ∪ the last c positions of every block       n·(l + c·n/l)      yes

Each kind takes the same projected q, k, v [B, T, N, H] inside `MultiHeadAttention`, so a
model changes kind by config alone. `check` rejects a combination that cannot work (an
unknown kind or option, a causal Linformer, ALiBi's bias on a kind without one, rotary
positions on a kind that does not score by qᵀk) with one sentence, before anything is
compiled.
"""

import zlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.attention import chunked as chunked_lib
from models.attention import core
from models.attention import linear as linear_lib
from models.attention import linformer as linformer_lib
from models.attention import performer as performer_lib
from models.attention import sparse as sparse_lib

# Each kind's options and their defaults.
DEFAULTS: dict[str, dict[str, Any]] = {
    'exact': {},
    'chunked': {'query_block': 512, 'key_block': 512},
    'linear': {'block': 64},
    'performer': {'num_features': 256, 'orthogonal': True, 'block': 64},
    'linformer': {'projected_length': 256, 'share_kv': False},
    'local': {'block': 128, 'query_blocks': 4},
    'strided': {'block': 128, 'query_blocks': 4},
    'fixed': {'block': 128, 'summary': 8, 'query_blocks': 4},
}
KINDS = tuple(DEFAULTS)
# Kinds that can decode with the key/value cache: attention over the cached keys is
# exact attention, which is what these compute.
CACHED = ('exact', 'chunked')
# Kinds that draw random numbers while training (from the stream of this name).
RNG_STREAM = 'features'


def options_of(kind: str, options=()) -> dict[str, Any]:
  """The kind's defaults updated by `options` (a mapping or (name, value) pairs)."""
  return {**DEFAULTS[kind], **dict(options or ())}


# Kinds whose scores cannot keep rotary positions' relative form: Linformer mixes the keys
# over positions. (Linear attention rotates its features instead of q and k: `Attend`.)
KEEP_NO_ROTARY_OFFSET = ('linformer',)


def check(owner: str, kind: str, options=(), *, causal: bool = False,
          positions: str = 'none') -> None:
  """One sentence for a kind, options, causality or position scheme that cannot work."""
  if kind not in DEFAULTS:
    raise ValueError(f'{owner} attention={kind!r}; allowed: {", ".join(KINDS)}.')
  allowed = ', '.join(DEFAULTS[kind]) or 'none'
  try:
    given = dict(options or ())
  except (TypeError, ValueError):
    raise ValueError(f'{owner} attention_options={options!r} is not a mapping of option names '
                     f'to values; attention={kind!r} takes: {allowed}.') from None
  unknown = sorted(set(given) - set(DEFAULTS[kind]))
  if unknown:
    raise ValueError(f'{owner} attention_options has {unknown[0]!r}, which attention={kind!r} '
                     f'does not take; allowed: {allowed}.')
  for name, value in options_of(kind, options).items():
    if name in ('orthogonal', 'share_kv'):
      if not isinstance(value, bool):
        raise ValueError(f'{owner} attention_options.{name} must be True or False, got {value!r}.')
    elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f'{owner} attention_options.{name} must be a positive integer, '
                       f'got {value!r}.')
  if kind == 'linformer' and causal:
    raise ValueError(f'{owner} is causal and Linformer attention cannot be (each projected key '
                     f'mixes every position, future ones included); choose another attention.')
  if positions == 'rotary' and kind in KEEP_NO_ROTARY_OFFSET:
    # Each projected key Σ_j E_lj R_j k_j mixes positions, so its score with R_i q_i depends
    # on i and every j, not on offsets alone.
    raise ValueError(f"{owner} positions='rotary' makes scores depend on the offset between "
                     f"positions only through the dot product qᵀk, which attention={kind!r} "
                     "does not score by; use sinusoidal or learned positions with it.")
  if positions == 'alibi' and kind != 'exact':
    other = ('sinusoidal or learned' if kind in KEEP_NO_ROTARY_OFFSET else 'rotary')
    raise ValueError(f"{owner} positions='alibi' adds a bias to the attention scores, which "
                     f"only attention='exact' takes; use {other} positions with {kind!r}.")


def stream_names(kind: str) -> tuple[str, ...]:
  """The random streams a model with attention `kind` reads while training."""
  return (RNG_STREAM,) if kind == 'performer' else ()


def _key_valid(kind: str, mask, batch: int, keys: int):
  """A mask [B, 1, 1, S] (valid keys, as `core.key_mask` makes) as key_valid [B, S]."""
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  if mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[2] != 1 or mask.shape[0] not in (1, batch) \
      or mask.shape[3] not in (1, keys) or mask.dtype != jnp.bool_:
    raise ValueError(f'attention={kind!r} takes a mask of valid keys [B, 1, 1, S] only, bool '
                     f'and broadcasting to ({batch}, 1, 1, {keys}); got {mask.dtype} of shape '
                     f'{mask.shape}.')
  return jnp.broadcast_to(mask[:, 0, 0, :], (batch, keys))


class Attend(nn.Module):
  """Attention of kind `kind` over projected q, k, v [B, T, N, H] (see the module doc).

  Its parameters (Linformer's E and F) and random features (Performer's, drawn afresh
  at every training step from the 'features' stream, and a fixed draw per layer at
  evaluation) live here, so `MultiHeadAttention` stays the same for every kind.
  """
  kind: str = 'exact'
  options: Any = ()
  max_length: int | None = None

  @nn.compact
  def __call__(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, mask=None, bias=None,
               causal: bool = False, train: bool = False, rotary=None):
    """`rotary` (query positions [T], key positions [S], base): rotary positions applied by
    the kind itself, which only 'linear' does (`linear.linear_attention`); the other kinds
    take q and k already rotated."""
    kind, options = self.kind, options_of(self.kind, self.options)
    if rotary is not None and kind != 'linear':
      raise ValueError(f'attention={kind!r} takes q and k already rotated, not rotary '
                       'positions to apply.')
    if kind != 'exact' and bias is not None:
      raise ValueError(f'attention={kind!r} takes no additive bias (ALiBi needs exact attention).')
    batch, keys = k_BxSxNxH.shape[:2]
    queries = q_BxTxNxH.shape[1]
    # No queries, or no keys to attend (as a fully masked row, which returns zeros): zeros,
    # without the kind, which would divide by zero or reduce over no keys. The sparse kinds
    # still refuse T ≠ S themselves: they are self-attention only.
    if 0 in (queries, keys) and (queries == keys or kind not in sparse_lib.PATTERNS):
      return jnp.zeros((*q_BxTxNxH.shape[:-1], v_BxSxNxH.shape[-1]), q_BxTxNxH.dtype)
    if kind == 'exact':
      return core.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask=mask, bias=bias,
                                        causal=causal)
    key_valid_BxS = _key_valid(kind, mask, batch, keys)
    args = (q_BxTxNxH, k_BxSxNxH, v_BxSxNxH)
    if kind == 'chunked':
      return chunked_lib.chunked_attention(*args, causal=causal, key_valid_BxS=key_valid_BxS,
                                           **options)
    if kind == 'linear':
      return linear_lib.linear_attention(*args, causal=causal, key_valid_BxS=key_valid_BxS,
                                         rotary=rotary, **options)
    if kind == 'performer':
      if train:
        key = self.make_rng(RNG_STREAM)
      else:  # A fixed draw per layer, so evaluations are repeatable.
        key = jax.random.PRNGKey(zlib.crc32('/'.join(self.scope.path).encode()) & 0x7FFFFFFF)
      features_MxH = performer_lib.draw_features(key, options['num_features'],
                                                 q_BxTxNxH.shape[-1], options['orthogonal'])
      return performer_lib.performer_attention(*args, features_MxH, causal=causal,
                                               key_valid_BxS=key_valid_BxS, block=options['block'])
    if kind == 'linformer':
      proj_e_KxL, proj_f_KxL = linformer_lib.LinformerProjections(
          self.max_length or keys, options['projected_length'], options['share_kv'],
          name='projections')()
      return linformer_lib.linformer_attention(*args, proj_e_KxL, proj_f_KxL, causal=causal,
                                               key_valid_BxS=key_valid_BxS)
    return sparse_lib.sparse_attention(*args, pattern=kind, causal=causal,
                                       key_valid_BxS=key_valid_BxS, **options)
