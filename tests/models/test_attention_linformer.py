"""Linformer attention (Wang et al. 2020), out = softmax(Q (E K)ᵀ / √H) (F V): exact attention
when E = F is a permutation, a float64 formula with padding and short inputs, how far random
projections are from exact attention as k grows, the projections module and the errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import linformer
from tests.models.test_attention import draw, reference_attention


def reference_linformer(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, e_KxL, f_KxL, valid_BxS=None):
  """float64: K′ = E[:, :S] (K with padded rows zeroed), V′ = F[:, :S] (V likewise), per batch
  row and head; out = softmax(Q K′ᵀ / √H) V′."""
  q, k, v, e, f = (np.asarray(a, np.float64) for a in (q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, e_KxL,
                                                        f_KxL))
  batch, steps, heads, width = q.shape
  keys = k.shape[1]
  if valid_BxS is not None:
    k, v = k * valid_BxS[:, :, None, None], v * valid_BxS[:, :, None, None]
  out = np.zeros((batch, steps, heads, v.shape[-1]))
  for b in range(batch):
    for n in range(heads):
      projected_k, projected_v = e[:, :keys] @ k[b, :, n], f[:, :keys] @ v[b, :, n]
      logits = q[b, :, n] @ projected_k.T / np.sqrt(width)
      weights = np.exp(logits - logits.max(-1, keepdims=True))
      out[b, :, n] = weights / weights.sum(-1, keepdims=True) @ projected_v
  return out


def test_a_permutation_projection_gives_exact_attention():
  # softmax is invariant to reordering the keys (with their values), so E = F = a permutation
  # of the S positions is exact attention. L = 24 > S = 16: the columns past S are ignored.
  q, k, v = draw((2, 5, 3, 4), 1), draw((2, 16, 3, 4), 2), draw((2, 16, 3, 4), 3)
  permutation_SxS = np.eye(16, dtype=np.float32)[np.random.default_rng(4).permutation(16)]
  proj_KxL = np.concatenate([permutation_SxS, draw((16, 8), 5)], axis=1)
  out = jax.jit(linformer.linformer_attention)(q, k, v, proj_KxL, proj_KxL)
  expected, _ = reference_attention(q, k, v)
  # The largest difference measured is 1.2e-7.
  np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


def test_linformer_matches_the_formula_with_padding():
  q, k, v = draw((3, 12, 2, 4), 11), draw((3, 16, 2, 4), 12), draw((3, 16, 2, 4), 13)
  proj_e_KxL, proj_f_KxL = draw((6, 20), 14, scale=0.3), draw((6, 20), 15, scale=0.3)
  valid_BxS = np.arange(16)[None, :] < np.array([16, 5, 0])[:, None]
  expected = reference_linformer(q, k, v, proj_e_KxL, proj_f_KxL, valid_BxS)
  attend = jax.jit(lambda q, k, v: linformer.linformer_attention(
      q, k, v, proj_e_KxL, proj_f_KxL, key_valid_BxS=valid_BxS))
  out = attend(q, k, v)
  # The largest difference measured is 3.0e-7.
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6)
  np.testing.assert_array_equal(out[2], 0.0)  # no valid key: F V = 0
  out16 = attend(*(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)))
  assert out16.dtype == jnp.bfloat16
  # bfloat16 inputs, projections and outputs: measured 1.1e-2 on outputs up to 1.6.
  np.testing.assert_allclose(np.asarray(out16, np.float32), expected, rtol=0, atol=3e-2)


def test_values_of_another_width_keep_the_scale_of_the_query_width():
  # Values 6 wide, queries and keys 4: the logits are divided by √4.
  q, k, v = draw((2, 5, 2, 4), 1), draw((2, 8, 2, 4), 2), draw((2, 8, 2, 6), 3)
  proj_e_KxL, proj_f_KxL = draw((3, 10), 4), draw((3, 10), 5)
  out = jax.jit(linformer.linformer_attention)(q, k, v, proj_e_KxL, proj_f_KxL)
  assert out.shape == (2, 5, 2, 6)
  np.testing.assert_allclose(out, reference_linformer(q, k, v, proj_e_KxL, proj_f_KxL), rtol=1e-5,
                             atol=2e-6)


LENGTH, WIDTH, RANK, DRAWS = 64, 16, 4, 32
PROJECTED = (4, 8, 16, 32, 64)


def _low_rank_inputs():
  """One batch row per draw; keys and values of rank RANK (K = A B, A [n, r], B [r, H])."""
  rng = np.random.default_rng(21)
  q = rng.normal(size=(DRAWS, LENGTH, 1, WIDTH))
  k, v = (np.einsum('dsr,drh->dsh', rng.normal(size=(DRAWS, LENGTH, RANK)),
                    rng.normal(size=(DRAWS, RANK, WIDTH)) / np.sqrt(RANK))[:, :, None]
          for _ in range(2))
  return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


@jax.jit
def _relative_errors(q_DxTx1xH, k_DxSx1xH, v_DxSx1xH, exact_DxTx1xH, proj_DxKxL):
  """‖linformer − exact‖ / ‖exact‖ for each draw d, with E = F = proj[d]."""
  attend = lambda q, k, v, proj: linformer.linformer_attention(q[None], k[None], v[None], proj,
                                                               proj)[0]
  out = jax.vmap(attend)(q_DxTx1xH, k_DxSx1xH, v_DxSx1xH, proj_DxKxL)
  return (jnp.linalg.norm((out - exact_DxTx1xH).reshape(DRAWS, -1), axis=-1)
          / jnp.linalg.norm(exact_DxTx1xH.reshape(DRAWS, -1), axis=-1))


def test_the_error_against_exact_attention_falls_as_k_grows():
  # Wang et al.'s Theorem 1 bounds P Eᵀ E V − P V for a random E, not softmax(Q (E K)ᵀ) E V, so
  # for random projections this measures how far from exact attention the Linformer starts.
  q, k, v = _low_rank_inputs()
  exact, _ = reference_attention(q, k, v)
  exact = exact.astype(np.float32)
  rng = np.random.default_rng(22)
  # The module draws N(0, 1/L) whatever k is, so the first k rows of a k = L draw are a k draw.
  module = linformer.LinformerProjections(LENGTH, LENGTH, share_kv=True)
  proj_DxLxL = jax.jit(jax.vmap(lambda key: module.apply(module.init(key))[0]))(
      jax.random.split(jax.random.PRNGKey(23), DRAWS))
  gaussian, sampled = [], []
  for projected in PROJECTED:
    gaussian.append(np.mean(_relative_errors(q, k, v, exact, proj_DxLxL[:, :projected])))
    # E = F keeps k random positions: attention over a random subset of the keys.
    subsets_DxK = np.sort([rng.permutation(LENGTH)[:projected] for _ in range(DRAWS)], axis=-1)
    proj_DxKxL = np.eye(LENGTH, dtype=np.float32)[subsets_DxK]
    sampled.append(np.mean(_relative_errors(q, k, v, exact, proj_DxKxL)))
  # Mean over 32 draws, measured for k = 4 … 64 (within 0.32 of these for full-rank keys and
  # values: the rank hardly matters):
  #   E = F ~ N(0, 1/L) (the module's initialisation)   3.11  2.42  2.03  1.57  1.29
  #   E = F = k positions                                3.30  2.31  1.51  1.03  0
  # Random Gaussian projections stay far from exact attention even at k = n: E is trained.
  assert (np.diff(gaussian) < 0).all(), gaussian
  assert (np.diff(sampled) < 0).all(), sampled
  assert sampled[-1] < 1e-6
  assert gaussian[-1] > 0.5


def test_projections_module_shapes_sharing_and_scale():
  separate = nn.unbox(linformer.LinformerProjections(256, 64).init(jax.random.PRNGKey(0)))
  shared = nn.unbox(linformer.LinformerProjections(256, 64, share_kv=True).init(
      jax.random.PRNGKey(0)))
  assert jax.tree_util.tree_map(jnp.shape, separate['params']) == dict(proj_e=(64, 256),
                                                                       proj_f=(64, 256))
  assert list(shared['params']) == ['proj_e']
  proj_e, proj_f = linformer.LinformerProjections(256, 64, share_kv=True).apply(shared)
  assert proj_e is proj_f
  e, f = linformer.LinformerProjections(256, 64).apply(separate)
  assert not np.allclose(e, f)
  # Variance 1/L = 1/256 (std 0.0625; 1/√k would be 0.125): 16384 draws estimate the std to
  # within 1%; measured 0.0626.
  for proj in (e, f):
    assert abs(np.std(proj) * np.sqrt(256) - 1) < 0.05


def test_bad_arguments_raise_before_compiling():
  x = jnp.zeros((1, 10, 1, 4))
  proj_KxL = jnp.zeros((4, 8))
  with pytest.raises(ValueError, match="sequence length S=10 exceeds the Linformer's max_length "
                                       'L=8'):
    linformer.linformer_attention(x, x, x, proj_KxL, proj_KxL)
  with pytest.raises(ValueError, match='cannot be causal'):
    linformer.linformer_attention(x[:, :8], x[:, :8], x[:, :8], proj_KxL, proj_KxL, causal=True)
  with pytest.raises(ValueError, match=r'E \(4, 8\) and F \(3, 8\)'):
    linformer.linformer_attention(x[:, :8], x[:, :8], x[:, :8], proj_KxL, proj_KxL[:3])
