"""Scaled dot-product attention, masks and multi-head attention (Vaswani et al. 2017, §3.2).

  Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + bias, masked) V

Masks are boolean, True where a query may attend to a key, and have four axes that
broadcast to [B, N, T, S] (batch, heads, queries, keys). A query whose keys are all masked
gets the zero vector (not the uniform average a large negative fill would give,
and never NaN).

Arrays carry logical axis names ('batch', 'length', 'embed', 'heads', 'kv',
'mlp', 'vocab') on parameters and activations; `train/parallel.py` maps them to
a device mesh by rules from the config, and outside a mesh they do nothing.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# kinds and core import each other; each uses the other only inside calls.
from models.attention import kinds
from models.attention import positions as positions_lib

# Position schemes applied inside attention (the others add to the embeddings).
IN_ATTENTION = ('rotary', 'alibi')


def causal_mask(num_queries: int, num_keys: int | None = None, offset=0) -> jax.Array:
  """[T, S] with True where key j ≤ query i + offset (query i sits at position i + offset)."""
  num_keys = num_queries if num_keys is None else num_keys
  return jnp.arange(num_keys)[None, :] <= jnp.arange(num_queries)[:, None] + offset


def padding_mask(lengths_B: jax.Array, length: int) -> jax.Array:
  """[B, length] with True at the first lengths_B[b] positions of each row."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths_B)[:, None]


def key_mask(valid_BxS: jax.Array) -> jax.Array:
  """Valid keys [B, S] → an attention mask [B, 1, 1, S] (every head and query)."""
  return valid_BxS[:, None, None, :]


def combine_masks(*masks) -> jax.Array | None:
  """The logical AND of the masks that are not None (None if all are)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = jnp.logical_and(out, m)
  return out


def check_mask(mask, shape_BxNxTxS: tuple[int, int, int, int]):
  """`mask` as a bool array of 4 axes that broadcasts to [B, N, T, S]; else one sentence
  naming its shape or dtype (its shape and dtype are static, so this raises when traced)."""
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise ValueError(f'An attention mask must be bool (True where a query may attend), got '
                     f'{mask.dtype}.')
  _check_four_axes(mask, 'mask', shape_BxNxTxS)
  return mask


def _check_four_axes(array, what: str, shape_BxNxTxS: tuple[int, int, int, int]) -> None:
  """Four axes, each 1 or the full size. Fewer axes are refused rather than broadcast from
  the right: a [B, S] padding mask would then be read as [T, S] whenever B equals T."""
  if array.ndim != 4 or any(m not in (1, n) for m, n in zip(array.shape, shape_BxNxTxS)):
    raise ValueError(f'An attention {what} of shape {array.shape} does not broadcast to '
                     f'[B, N, T, S] = {tuple(shape_BxNxTxS)}; give its 4 axes, each 1 or the full '
                     f'size (valid keys [B, S] as [B, 1, 1, S] by `key_mask`, a [T, S] {what} as '
                     f'{what}[None, None]).')


def dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, *, mask=None, bias=None,
                          causal: bool = False, implementation: str | None = None):
  """softmax(q kᵀ / √H + bias) v per head, through `jax.nn.dot_product_attention`.

  `implementation` None lets JAX choose (XLA's attention, as of JAX 0.10); 'cudnn'
  asks for cuDNN's fused flash-attention kernel on a GPU.
  `mask` (bool) and `bias` (additive, float) broadcast to [B, N, T, S]; `causal`
  adds the causal mask with query i at position i. Rows whose keys are all
  masked return zeros.
  """
  if causal and mask is None and bias is None:
    # The one form a fused kernel recognises as causal without materialising a mask.
    return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, is_causal=True,
                                        implementation=implementation)
  num_queries, num_keys = q_BxTxNxH.shape[1], k_BxSxNxH.shape[1]
  if mask is not None:
    mask = check_mask(mask, (q_BxTxNxH.shape[0], q_BxTxNxH.shape[2], num_queries, num_keys))
  if causal:
    mask = combine_masks(mask, causal_mask(num_queries, num_keys)[None, None])
  if bias is not None:
    bias = jnp.asarray(bias)
    _check_four_axes(bias, 'bias', (q_BxTxNxH.shape[0], q_BxTxNxH.shape[2], num_queries, num_keys))
    bias = jnp.broadcast_to(bias, (q_BxTxNxH.shape[0], q_BxTxNxH.shape[2], num_queries, num_keys))
    # XLA adds the bias to float32 logits, so it stays float32 (a bfloat16 ALiBi bias of
    # −m·d ≈ 100 would round to steps of 0.5); cuDNN wants it in the compute dtype.
    bias = bias.astype(q_BxTxNxH.dtype if implementation == 'cudnn' else jnp.float32)
  if mask is not None:
    mask = jnp.broadcast_to(mask, (q_BxTxNxH.shape[0], q_BxTxNxH.shape[2], num_queries, num_keys))
  out_BxTxNxH = jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, bias=bias, mask=mask,
                                             implementation=implementation)
  if mask is None:
    return out_BxTxNxH
  # A fully masked row: every logit got the same large negative value, so the
  # kernel returned the mean of the values; nothing was attended, so return 0.
  any_BxNxT = jnp.any(mask, axis=-1)
  return jnp.where(any_BxNxT.transpose(0, 2, 1)[..., None], out_BxTxNxH, 0)


def attention_weights(q_BxTxNxH, k_BxSxNxH, *, mask=None, bias=None, causal: bool = False):
  """The weights softmax(q kᵀ / √H + bias) [B, N, T, S] themselves, for inspection and figures
  (the attention layers never form them: `dot_product_attention` does not return them)."""
  logits_BxNxTxS = jnp.einsum('btnh,bsnh->bnts', q_BxTxNxH, k_BxSxNxH,
                              preferred_element_type=jnp.float32) / jnp.sqrt(q_BxTxNxH.shape[-1])
  if bias is not None:
    bias = jnp.asarray(bias)
    _check_four_axes(bias, 'bias', logits_BxNxTxS.shape)
    logits_BxNxTxS = logits_BxNxTxS + bias
  if mask is not None:
    mask = check_mask(mask, logits_BxNxTxS.shape)
  if causal:
    mask = combine_masks(mask, causal_mask(q_BxTxNxH.shape[1], k_BxSxNxH.shape[1])[None, None])
  if mask is None:
    return jax.nn.softmax(logits_BxNxTxS, axis=-1)
  weights = jax.nn.softmax(jnp.where(mask, logits_BxNxTxS, -jnp.inf), axis=-1)
  return jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0.0)


def tokens_first(x_BxTxD: jax.Array) -> jax.Array:
  """[..., D] → [M, D], every leading axis merged into one token axis M (a free reshape).

  Projections apply to the merged array: the kernel's gradient Σ_m x_m ⊗ dy_m then
  contracts a single leading axis, which XLA:CPU computes as one matrix product reading
  its first operand transposed. Contracted over the two axes [B, T], XLA:CPU first copied
  the output's gradient into a transposed layout, and the GPT train step of README
  Benchmarks (4 layers, batch 16 × 128 tokens) ran 1.16–1.37× slower. On other backends
  the reshape costs nothing.
  """
  return x_BxTxD.reshape(-1, x_BxTxD.shape[-1])


class HeadProjection(nn.Module):
  """x W + b per head: [B, T, D] → [B, T, N, H] with a kernel [D, N, H] and a bias [N, H]."""
  num_heads: int
  head_dim: int
  use_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxD):
    # Fan-in D, as if the kernel were the [D, N·H] matrix it is.
    init = nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
    kernel_DxNxH = self.param('kernel', nn.with_logical_partitioning(init, ('embed', 'heads', 'kv')),
                              (x_BxTxD.shape[-1], self.num_heads, self.head_dim), jnp.float32)
    # One token axis (B·T): the kernel's gradient then contracts one leading axis, which
    # XLA:CPU does without first copying the output's gradient (see `tokens_first`).
    x_MxD = tokens_first(x_BxTxD)
    y_MxNxH = jnp.einsum('md,dnh->mnh', x_MxD.astype(self.dtype), kernel_DxNxH.astype(self.dtype))
    y_BxTxNxH = y_MxNxH.reshape(*x_BxTxD.shape[:-1], *y_MxNxH.shape[1:])
    if self.use_bias:
      bias_NxH = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, ('heads', 'kv')),
                            (self.num_heads, self.head_dim), jnp.float32)
      y_BxTxNxH = y_BxTxNxH + bias_NxH.astype(self.dtype)
    return y_BxTxNxH


class HeadMerge(nn.Module):
  """Σ_n o_n W_n + b: the heads [B, T, N, H] → [B, T, D′] with a kernel [N, H, D′] (W^O)."""
  features: int
  use_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, o_BxTxNxH):
    init = nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)
    kernel_NxHxD = self.param('kernel', nn.with_logical_partitioning(init, ('heads', 'kv', 'embed')),
                              (*o_BxTxNxH.shape[-2:], self.features), jnp.float32)
    o_MxNxH = o_BxTxNxH.reshape(-1, *o_BxTxNxH.shape[-2:])
    y_MxD = jnp.einsum('mnh,nhd->md', o_MxNxH.astype(self.dtype), kernel_NxHxD.astype(self.dtype))
    y_BxTxD = y_MxD.reshape(*o_BxTxNxH.shape[:-2], self.features)
    if self.use_bias:
      bias_D = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
                          (self.features,), jnp.float32)
      y_BxTxD = y_BxTxD + bias_D.astype(self.dtype)
    return y_BxTxD


class MultiHeadAttention(nn.Module):
  """Multi-head attention (Vaswani et al. 2017, §3.2.2):

    head_i = Attention(x_q W_i^Q, x_kv W_i^K, x_kv W_i^V),   i = 1 … N
    MultiHead(x_q, x_kv) = [head_1; …; head_N] W^O

  Self-attention when `x_kv` is None, cross-attention otherwise. The N heads'
  projections are one [D, N, H] kernel each for Q, K and V, and W^O is [N, H, D′].

  Positions applied inside attention (`positions`): 'rotary' rotates q and k by
  their positions (Su et al. 2021) and 'alibi' adds −m_i·distance to head i's
  scores (Press et al. 2022); see models/attention/positions.py. Self-attention
  only; their positions are 0 … T−1 (plus the cache index when decoding).

  Decoding (`decode=True`, causal self-attention only) follows the flax lm1b
  cache protocol: the call inside `init` sizes a key/value cache [B, L, N, H]
  from the input length L; each later call takes the next S ≥ 1 inputs, writes
  their keys and values at the cache index and attends over every cached
  position up to its own. The cost per token is O(L) instead of recomputing
  the prefix. A call that would write past the cache's end returns NaN (the
  index is a traced value, so it cannot raise inside jit).

  Attributes:
    num_heads: N.
    head_dim: H (default: the input width / N).
    out_features: D′ (default: the input width).
    positions: 'none', 'rotary' or 'alibi'.
    rotary_base: the base b of the rotary frequencies b^(−2i/H).
    attention: the kind of attention over the projected q, k, v (models/attention/kinds.py:
      'exact', 'chunked', 'linear', 'performer', 'linformer', 'local', 'strided', 'fixed').
    attention_options: that kind's options, (name, value) pairs or a mapping.
    max_length: the longest input (the length Linformer's projections are made for).
    use_bias: biases on the projections.
    dtype: compute dtype; parameters stay float32.
  """
  num_heads: int
  head_dim: int | None = None
  out_features: int | None = None
  positions: str = 'none'
  rotary_base: float = 10_000.0
  attention: str = 'exact'
  attention_options: Any = ()
  max_length: int | None = None
  use_bias: bool = True
  dtype: Any = jnp.float32

  def _project(self, x, name, head_dim):
    return HeadProjection(self.num_heads, head_dim, self.use_bias, self.dtype, name=name)(x)

  @nn.compact
  def __call__(self, x_q_BxTxD, x_kv_BxSxD=None, *, mask=None, causal: bool = False,
               decode: bool = False, train: bool = False):
    # head_dim None is the default: the input width / N.
    for option in ('num_heads',) + (('head_dim',) if self.head_dim is not None else ()):
      value = getattr(self, option)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'MultiHeadAttention {option} must be a positive integer, got {value!r}.')
    width = x_q_BxTxD.shape[-1]
    if width % self.num_heads and self.head_dim is None:
      raise ValueError(f'MultiHeadAttention: width {width} is not divisible by num_heads='
                       f'{self.num_heads}; set head_dim.')
    if self.positions not in ('none',) + IN_ATTENTION:
      raise ValueError(f'MultiHeadAttention positions={self.positions!r}; allowed: none, '
                       f'{", ".join(IN_ATTENTION)}.')
    cross = x_kv_BxSxD is not None
    if cross and self.positions != 'none':
      raise ValueError(f'positions={self.positions!r} applies to self-attention only.')
    if decode and (cross or not causal):
      raise ValueError('decode=True needs causal self-attention.')
    kinds.check('MultiHeadAttention', self.attention, self.attention_options, causal=causal,
                positions=self.positions)
    if decode and self.attention not in kinds.CACHED:
      raise ValueError(f'attention={self.attention!r} has no key/value cache (only '
                       f'{", ".join(kinds.CACHED)} do); generate without the cache.')
    head_dim = self.head_dim or width // self.num_heads
    x_kv_BxSxD = x_q_BxTxD if x_kv_BxSxD is None else x_kv_BxSxD
    constrain = lambda a: nn.with_logical_constraint(a, ('batch', 'length', 'heads', 'kv'))
    q_BxTxNxH = constrain(self._project(x_q_BxTxD, 'query', head_dim))
    k_BxSxNxH = constrain(self._project(x_kv_BxSxD, 'key', head_dim))
    v_BxSxNxH = constrain(self._project(x_kv_BxSxD, 'value', head_dim))

    batch, steps = x_q_BxTxD.shape[:2]
    offset = 0  # the position of the first query
    if decode:
      is_initialized = self.has_variable('cache', 'cached_key')
      cached_k = self.variable('cache', 'cached_key', jnp.zeros, k_BxSxNxH.shape, k_BxSxNxH.dtype)
      cached_v = self.variable('cache', 'cached_value', jnp.zeros, v_BxSxNxH.shape, v_BxSxNxH.dtype)
      index = self.variable('cache', 'cache_index', lambda: jnp.zeros((), jnp.int32))
      if is_initialized:
        offset = index.value
    q_positions, k_positions = offset + jnp.arange(steps), offset + jnp.arange(steps)
    rotary = None
    if self.positions == 'rotary' and self.attention == 'linear':
      # Linear attention rotates its features in the numerator only (RoFormer, eq. 19):
      # rotating q and k before its feature map would not keep scores relative.
      rotary = (q_positions, k_positions, self.rotary_base)
    elif self.positions == 'rotary':
      q_BxTxNxH = positions_lib.rotate(q_BxTxNxH, q_positions, self.rotary_base)
      k_BxSxNxH = positions_lib.rotate(k_BxSxNxH, k_positions, self.rotary_base)
    overflow = False
    if decode and is_initialized:
      cache_length = cached_k.value.shape[1]
      if steps > cache_length:
        raise ValueError(f'MultiHeadAttention: {steps} decoding steps in one call exceed the '
                         f'cache length {cache_length} set at init; init with a longer input.')
      # The index is traced, so running past the cache cannot raise here; and
      # dynamic_update_slice would clamp the write silently. Poison the output instead.
      overflow = offset + steps > cache_length
      # Write this call's keys and values at the cache index; attend over the whole cache.
      start = (0, offset, 0, 0)
      cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BxSxNxH, start)
      cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BxSxNxH, start)
      index.value = offset + steps
      k_BxSxNxH, v_BxSxNxH = cached_k.value, cached_v.value
      k_positions = jnp.arange(k_BxSxNxH.shape[1])
      mask = combine_masks(mask, causal_mask(steps, k_BxSxNxH.shape[1], offset)[None, None])
      causal = False
    bias = None
    if self.positions == 'alibi':
      bias = positions_lib.alibi_bias(self.num_heads, q_positions, k_positions, causal=causal or decode)
      bias = bias[None]
    # Over the cache, every cached kind is exact attention (one query against L keys).
    kind = 'exact' if decode else self.attention
    out_BxTxNxH = kinds.Attend(kind, self.attention_options, self.max_length, name='attend')(
        q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask=mask, bias=bias, causal=causal, train=train,
        rotary=rotary)
    out_BxTxNxH = jnp.where(overflow, jnp.nan, out_BxTxNxH).astype(out_BxTxNxH.dtype)
    out = HeadMerge(self.out_features or width, self.use_bias, self.dtype, name='out')(out_BxTxNxH)
    return nn.with_logical_constraint(out, ('batch', 'length', 'embed'))
