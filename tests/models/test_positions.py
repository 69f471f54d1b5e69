"""Position schemes against golden numbers, explicit loops and their defining properties:
sinusoidal (Vaswani et al. 2017, §3.5), ALiBi slopes and biases (Press et al. 2022), rotary
(Su et al. 2021) and the learned table."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import positions


# ---- sinusoidal ---------------------------------------------------------------------------

def test_sinusoidal_golden_width_4():
  # PE[p] = [sin(p), cos(p), sin(p / 100), cos(p / 100)] for d = 4 (10000^(2/4) = 100).
  pe_3x4 = np.asarray(positions.sinusoidal(jnp.arange(3), 4))
  np.testing.assert_allclose(pe_3x4[0], [0.0, 1.0, 0.0, 1.0], atol=1e-7)
  # sin 2, cos 2, sin 0.02, cos 0.02.
  np.testing.assert_allclose(pe_3x4[2], [0.9092974268256817, -0.4161468365471424,
                                         0.019998666693333080, 0.9998000066665778], atol=1e-6)


def test_sinusoidal_matches_the_formula_loop():
  dim, steps = 16, 40
  expected = np.zeros((steps, dim))
  for p in range(steps):
    for i in range(dim // 2):
      expected[p, 2 * i] = math.sin(p / 10000 ** (2 * i / dim))
      expected[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / dim))
  # float32 angles up to 39 rad: the largest difference measured is 5.0e-7.
  np.testing.assert_allclose(positions.sinusoidal(jnp.arange(steps), dim), expected, atol=5e-6)
  # Positions need not start at 0 (a decoding step at position 7).
  np.testing.assert_allclose(positions.sinusoidal(jnp.array([7, 8]), dim), expected[7:9], atol=5e-6)


def test_sinusoidal_far_positions_keep_float32_angles():
  # 4097 is neither a bfloat16 nor a float16 number (both round it to 4096): positions cast to
  # either before the angles are taken turn the first frequency by a whole radian.
  far, dim = [4097, 5003], 4
  expected = [[f(p / 10000 ** (2 * i / dim)) for i in range(dim // 2) for f in (math.sin, math.cos)]
              for p in far]
  np.testing.assert_allclose(positions.sinusoidal(jnp.array(far), dim), expected, atol=1e-3)


def test_sinusoidal_odd_width_raises():
  with pytest.raises(ValueError, match='even width, got 5'):
    positions.sinusoidal(jnp.arange(3), 5)


# ---- ALiBi ----------------------------------------------------------------------------------

# Press et al.'s reference recipe (github.com/ofirpress/attention_with_linear_biases): a power
# of two n gives 2^(−8i/n), i = 1 … n; otherwise the slopes of the closest smaller power of two
# n, then every other slope of 2n, written out here by hand.
ALIBI_SLOPES = {
    1: [1 / 256],
    3: [1 / 16, 1 / 256,                              # n = 2: 2^-4, 2^-8
        1 / 4],                                       # 2n = 4: 2^-2 (2^-6 unused)
    6: [1 / 4, 1 / 16, 1 / 64, 1 / 256,               # n = 4: 2^-2, 2^-4, 2^-6, 2^-8
        1 / 2, 1 / 8],                                # 2n = 8: 2^-1, 2^-3
    8: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256],
    12: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256,
         0.7071067811865476, 0.3535533905932738,      # 2n = 16: 2^-0.5, 2^-1.5,
         0.1767766952966369, 0.08838834764831845],    #          2^-2.5, 2^-3.5
}


@pytest.mark.parametrize('num_heads', sorted(ALIBI_SLOPES))
def test_alibi_slopes_match_the_reference_recipe(num_heads):
  np.testing.assert_allclose(positions.alibi_slopes(num_heads), ALIBI_SLOPES[num_heads], rtol=1e-6)


@pytest.mark.parametrize('causal', [True, False])
def test_alibi_bias_is_minus_slope_times_distance(causal):
  num_heads = 6
  # Queries at positions 5, 6, 7 (a decoding chunk) over keys 0 … 7.
  q_positions, k_positions = [5, 6, 7], list(range(8))
  bias_NxTxS = np.asarray(positions.alibi_bias(num_heads, jnp.array(q_positions),
                                               jnp.array(k_positions), causal=causal))
  assert bias_NxTxS.shape == (num_heads, 3, 8)
  for h in range(num_heads):
    for t, i in enumerate(q_positions):
      for s, j in enumerate(k_positions):
        distance = (i - j) if causal else abs(i - j)
        np.testing.assert_allclose(bias_NxTxS[h, t, s], -ALIBI_SLOPES[6][h] * distance, rtol=1e-6,
                                   atol=0, err_msg=f'head {h}, query {i}, key {j}')


def test_alibi_bias_is_causal_by_default():
  # The default is the causal form −m·(p_q − p_k), signed: a later key gets +m per position.
  bias_NxTxS = np.asarray(positions.alibi_bias(1, jnp.array([2]), jnp.array([0, 4])))
  np.testing.assert_allclose(bias_NxTxS, [[[-2 / 256, 2 / 256]]], rtol=1e-6)


def test_alibi_bias_is_exact_at_long_distances():
  # Distances over 256 are not all bfloat16 numbers (1001 rounds to 1000): the bias of a long
  # context must still be −m·(p_q − p_k) to float32 precision.
  bias_NxTxS = np.asarray(positions.alibi_bias(2, jnp.array([1001, 4097]), jnp.array([0])))
  np.testing.assert_allclose(bias_NxTxS[:, :, 0], [[-1001 / 16, -4097 / 16],
                                                   [-1001 / 256, -4097 / 256]], rtol=1e-6)


# ---- rotary ---------------------------------------------------------------------------------

def _rotate_at(x_H, position, base=10_000.0):
  """R(position) x for one head vector."""
  return np.asarray(positions.rotate(jnp.asarray(x_H, jnp.float32)[None, None, None],
                                     jnp.array([position]), base))[0, 0, 0].astype(np.float64)


def test_rotary_golden_rotation():
  # H = 4: pair 0 turns by p·1 rad, pair 1 by p·10000^(−1/2) = p/100 rad.
  x_H = np.array([1.0, 0.0, 0.0, 2.0])
  np.testing.assert_allclose(_rotate_at(x_H, 3),
                             [math.cos(3), math.sin(3), -2 * math.sin(0.03), 2 * math.cos(0.03)],
                             atol=1e-6)


def test_rotary_position_zero_is_the_identity_and_rotation_preserves_norms():
  rng = np.random.default_rng(0)
  x_BxTxNxH = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
  np.testing.assert_array_equal(positions.rotate(x_BxTxNxH, jnp.zeros(5, jnp.int32)), x_BxTxNxH)
  rotated = np.asarray(positions.rotate(x_BxTxNxH, jnp.array([0, 1, 7, 50, 1000])))
  assert not np.allclose(rotated[:, 1:], x_BxTxNxH[:, 1:], atol=1e-3)
  np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x_BxTxNxH, axis=-1),
                             rtol=1e-5)


def test_rotary_scores_depend_on_the_offset_only():
  rng = np.random.default_rng(1)
  q_H, k_H = rng.normal(size=8), rng.normal(size=8)

  def score(p, p_prime):
    return _rotate_at(q_H, p) @ _rotate_at(k_H, p_prime)

  scores = {}
  for offset in (-3, 0, 1, 5):
    same_offset = [score(p, p + offset) for p in (0, 3, 10, 41)]
    # float32 rotations: the largest spread measured is 1.2e-7.
    np.testing.assert_allclose(same_offset, same_offset[0], atol=1e-6, err_msg=f'offset {offset}')
    scores[offset] = same_offset[0]
  np.testing.assert_allclose(scores[0], q_H @ k_H, rtol=1e-5)
  values = sorted(scores.values())
  assert min(np.diff(values)) > 1e-2, scores  # different offsets, different scores


def test_rotary_odd_head_width_raises():
  with pytest.raises(ValueError, match='even head width, got 3'):
    positions.rotate(jnp.zeros((1, 2, 1, 3)), jnp.arange(2))


# ---- learned --------------------------------------------------------------------------------

def test_learned_positions_return_rows_of_the_table():
  module = positions.LearnedPositions(max_length=10, features=4)
  variables = module.init(jax.random.PRNGKey(0), jnp.arange(3))
  table = np.asarray(nn.unbox(variables['params'])['embedding'])
  assert table.shape == (10, 4)
  np.testing.assert_allclose(table.std(), 0.02, rtol=0.5)
  rows = [9, 0, 4, 4]
  np.testing.assert_array_equal(module.apply(variables, jnp.array(rows)), table[rows])


def test_learned_table_is_initialised_at_std_0_02():
  # GPT-2 and BERT draw E_pos ~ N(0, 0.02²); flax's `normal()` without an argument draws at
  # 0.01, which the 40 entries above cannot tell from 0.02. 8,192 entries: the standard
  # error of the estimated standard deviation is ≈ 0.8 %.
  module = positions.LearnedPositions(max_length=256, features=32)
  variables = jax.jit(module.init)(jax.random.PRNGKey(0), jnp.arange(3))
  table = np.asarray(nn.unbox(variables['params'])['embedding'])
  np.testing.assert_allclose(table.mean(), 0.0, atol=1e-3)
  np.testing.assert_allclose(table.std(), 0.02, rtol=0.05)


def test_rotation_keeps_the_compute_dtype():
  # The rotation runs in float32 and returns the input's dtype: a bfloat16 q or k handed back
  # as float32 would silently move the attention that follows to float32.
  x_BxTxNxH = np.random.default_rng(2).normal(size=(1, 3, 2, 4)).astype(np.float32)
  rotated = positions.rotate(jnp.asarray(x_BxTxNxH, jnp.bfloat16), jnp.arange(3))
  assert rotated.dtype == jnp.bfloat16
  # bfloat16 keeps 8 significant bits: entries up to 2.4, the largest difference from the
  # float32 rotation measured is 4.0e-3.
  np.testing.assert_allclose(np.asarray(rotated, np.float32),
                             positions.rotate(x_BxTxNxH, jnp.arange(3)), rtol=0, atol=2e-2)


def test_bfloat16_rotation_takes_its_angles_in_float32():
  # A bfloat16 q at a far position: angles taken in bfloat16 (the positions, or θ_j = 0.01 held
  # as 0.0100098) are off by a radian or more, far beyond the bfloat16 rounding of the output.
  x_H = np.array([1.0, 0.0, 0.0, 2.0])
  far = [4097, 40961]
  rotated = positions.rotate(jnp.asarray(np.tile(x_H, (1, 2, 1, 1)), jnp.bfloat16), jnp.array(far))
  for t, p in enumerate(far):
    # H = 4: pair 0 turns by p rad, pair 1 by p/100 rad (as in the golden rotation above).
    np.testing.assert_allclose(np.asarray(rotated[0, t, 0], np.float32),
                               [math.cos(p), math.sin(p), -2 * math.sin(p / 100),
                                2 * math.cos(p / 100)], atol=2e-2, err_msg=f'position {p}')


def test_learned_table_names_its_width_embed():
  # The row added to x [B, T, D] ('batch', 'length', 'embed') shards its width as x does; the
  # positions axis is not sharded. eval_shape: the names only, no table drawn.
  variables = jax.eval_shape(positions.LearnedPositions(max_length=8, features=4).init,
                             jax.random.PRNGKey(0), jnp.arange(3))
  assert variables['params']['embedding'].names == (None, 'embed')
