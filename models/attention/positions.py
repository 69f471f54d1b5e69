"""Position information for attention, which is otherwise blind to order.

  sinusoidal   PE[p, 2i] = sin(p / 10000^(2i/d)),  PE[p, 2i+1] = cos(p / 10000^(2i/d))
               (Vaswani et al. 2017, §3.5), added to the token embeddings;
  learned      a trained table E_pos[p] (Devlin et al. 2019; Radford et al. 2018), added;
  ALiBi        no embedding; head i adds −m_i·(p_q − p_k) to its scores (Press et al.
               2022, "Train Short, Test Long"), m_i the geometric slopes below;
  rotary       no embedding; q and k are rotated by angles p·θ_j, so q·k depends on
               p_q − p_k only (Su et al. 2021, "RoFormer").
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

SCHEMES = ('sinusoidal', 'learned', 'alibi', 'rotary', 'none')


def sinusoidal(positions_T: jax.Array, dim: int, base: float = 10_000.0) -> jax.Array:
  """PE [T, dim]: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim))."""
  if dim % 2:
    raise ValueError(f'Sinusoidal positions need an even width, got {dim}.')
  inv_freq = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
  angles_TxK = jnp.asarray(positions_T, jnp.float32)[:, None] * inv_freq[None, :]
  # Interleave so that column 2i is the sine and 2i+1 the cosine of frequency i.
  return jnp.stack([jnp.sin(angles_TxK), jnp.cos(angles_TxK)], axis=-1).reshape(
      angles_TxK.shape[0], dim)


class LearnedPositions(nn.Module):
  """A trained table E_pos [max_length, D], initialised N(0, 0.02²); returns E_pos[positions]."""
  max_length: int
  features: int

  @nn.compact
  def __call__(self, positions_T: jax.Array) -> jax.Array:
    table = self.param('embedding', nn.with_logical_partitioning(
        nn.initializers.normal(0.02), (None, 'embed')), (self.max_length, self.features))
    return jnp.take(table, positions_T, axis=0)


def alibi_slopes(num_heads: int) -> jax.Array:
  """The head slopes m_1 … m_N of Press et al. 2022, §3.

  For N a power of two: the geometric sequence m_i = 2^(−8i/N), i = 1 … N (so
  1/2, 1/4, …, 1/256 for 8 heads). Otherwise the slopes of the closest smaller
  power of two n, followed by every other slope of 2n (the paper's code).
  """
  def powers_of_two(n):
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]
  n = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = powers_of_two(n)
  if n < num_heads:
    slopes += powers_of_two(2 * n)[0::2][:num_heads - n]
  return jnp.asarray(slopes, jnp.float32)


def alibi_bias(num_heads: int, q_positions_T, k_positions_S, causal: bool = True) -> jax.Array:
  """The bias [N, T, S] = −m_i · (p_q − p_k) (causal; keys after the query are masked
  anyway), or −m_i · |p_q − p_k| for bidirectional attention."""
  distance_TxS = (jnp.asarray(q_positions_T)[:, None] - jnp.asarray(k_positions_S)[None, :])
  distance_TxS = distance_TxS.astype(jnp.float32)
  if not causal:
    distance_TxS = jnp.abs(distance_TxS)
  return -alibi_slopes(num_heads)[:, None, None] * distance_TxS[None]


def rotate(x_BxTxNxH: jax.Array, positions_T: jax.Array, base: float = 10_000.0) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, eq. 34): each pair (x_2j, x_2j+1) of
  a head vector at position p is rotated by the angle p·θ_j, θ_j = base^(−2j/H):

    (x_2j, x_2j+1) ↦ (x_2j cos pθ_j − x_2j+1 sin pθ_j,  x_2j sin pθ_j + x_2j+1 cos pθ_j).

  Rotations compose, R(p)ᵀR(p′) = R(p′ − p), so ⟨R(p)q, R(p′)k⟩ depends on p′ − p only.
  """
  head_dim = x_BxTxNxH.shape[-1]
  if head_dim % 2:
    raise ValueError(f'Rotary positions need an even head width, got {head_dim}.')
  theta_K = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
  angles_TxK = jnp.asarray(positions_T, jnp.float32)[:, None] * theta_K[None, :]
  cos_Tx1xK, sin_Tx1xK = jnp.cos(angles_TxK)[:, None], jnp.sin(angles_TxK)[:, None]
  x = x_BxTxNxH.astype(jnp.float32)
  even, odd = x[..., 0::2], x[..., 1::2]
  rotated = jnp.stack([even * cos_Tx1xK - odd * sin_Tx1xK, even * sin_Tx1xK + odd * cos_Tx1xK],
                      axis=-1)
  return rotated.reshape(x.shape).astype(x_BxTxNxH.dtype)
