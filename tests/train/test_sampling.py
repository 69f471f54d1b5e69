"""Sampling: greedy limits, top-k/top-p against brute force, chi-square frequencies, cached decoding."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from train import sampling

# A fixed distribution with distinct probabilities, so every filter has one right answer.
PROBS_V = np.array([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])
NUM_DRAWS = 20_000


def _kept_reference(logits_V, *, top_k=None, top_p=None):
  """Brute force in float64: sort (ties by index), cut to k, keep the shortest prefix of mass >= p."""
  order = np.argsort(-logits_V, kind='stable')[:top_k or None]
  z = logits_V[order].astype(np.float64)
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  count = len(order) if top_p in (None, 1.0) else int(np.argmax(np.cumsum(probs) >= top_p)) + 1
  kept = np.zeros(logits_V.shape, bool)
  kept[order[:count]] = True
  return kept


def _random_logits(rng, rows, vocab_size, ties=True):
  """Flat to peaked rows; with `ties`, half rounded to one decimal so that ties are common."""
  logits = rng.normal(size=(rows, vocab_size)) * rng.uniform(0.1, 5.0, size=(rows, 1))
  if ties:
    # + 0.0 turns the -0.0 of rounding into 0.0, which lax.top_k would rank above it.
    logits[rows // 2:] = np.round(logits[rows // 2:], 1) + 0.0
  return logits.astype(np.float32)


def _counts(seed, **sampling_args):
  logits_NxV = jnp.broadcast_to(jnp.log(PROBS_V).astype(jnp.float32), (NUM_DRAWS, len(PROBS_V)))
  tokens_N = sampling.sample_token(jax.random.PRNGKey(seed), logits_NxV, **sampling_args)
  return np.bincount(np.asarray(tokens_N), minlength=len(PROBS_V))


def _chisquare_pvalue(counts, probs):
  return stats.chisquare(counts, probs / probs.sum() * counts.sum()).pvalue


# ---- greedy limits -------------------------------------------------------------------------

def test_temperature_zero_small_temperature_and_top_1_are_argmax():
  # No ties: at T = 1e-6 tied logits are rightly drawn at random.
  logits_BxV = _random_logits(np.random.default_rng(0), 64, 50, ties=False)
  argmax_B = np.argmax(logits_BxV, axis=-1)
  for seed in range(5):
    key = jax.random.PRNGKey(seed)
    for args in ({'temperature': 0}, {'temperature': 1e-6}, {'top_k': 1}, {'top_p': 1e-9}):
      np.testing.assert_array_equal(sampling.sample_token(key, logits_BxV, **args), argmax_B,
                                    err_msg=str(args))


def test_temperature_zero_keeps_only_the_first_argmax_without_nan():
  logits_BxV = np.array([[1.0, 3.0, 3.0, -2.0], [-np.inf, 0.0, -1.0, 0.5]], np.float32)
  filtered = np.asarray(sampling.filter_logits(logits_BxV, temperature=0))
  assert not np.isnan(filtered).any()
  np.testing.assert_array_equal(np.isfinite(filtered), [[0, 1, 0, 0], [0, 0, 0, 1]])
  # Greedy and top-1 break the tie at 3.0 the same way: the lower index.
  for args in ({'temperature': 0}, {'top_k': 1}):
    np.testing.assert_array_equal(
        sampling.sample_token(jax.random.PRNGKey(0), logits_BxV, **args), [1, 3])


def tempered(logits_BxV, temperature=1.0):
  """(z − max z) / T per row, in float64."""
  logits_BxV = np.asarray(logits_BxV, np.float64)
  return (logits_BxV - logits_BxV.max(-1, keepdims=True)) / temperature


def test_disabled_filters_only_divide_by_temperature():
  logits_BxV = _random_logits(np.random.default_rng(1), 8, 10)
  for args in ({}, {'top_k': 0}, {'top_k': 10}, {'top_k': 99}, {'top_p': 1.0}):
    np.testing.assert_allclose(sampling.filter_logits(logits_BxV, temperature=0.7, **args),
                               tempered(logits_BxV, 0.7), rtol=1e-5, atol=1e-5,
                               err_msg=str(args))


def test_a_tiny_temperature_keeps_the_argmax_and_an_infinite_one_is_refused():
  # z / T overflowed to +inf for both large logits at T = 1e-37, so the lower index won, not
  # the larger logit; a T that float32 flushes to 0 gave 0 / 0 = NaN; T = inf turned a masked
  # logit into −inf / inf = NaN.
  logits_BxV = np.array([[50.0, 60.0, -1.0], [40.0, -np.inf, 45.0]], np.float32)
  for temperature in (1e-37, 1e-40):
    filtered = np.asarray(sampling.filter_logits(logits_BxV, temperature=temperature))
    assert not np.isnan(filtered).any()
    np.testing.assert_array_equal(filtered.argmax(-1), [1, 2])
    for seed in range(5):
      np.testing.assert_array_equal(sampling.sample_token(
          jax.random.PRNGKey(seed), logits_BxV, temperature=temperature), [1, 2])
  with pytest.raises(ValueError, match='temperature must be a finite Python number >= 0'):
    sampling.filter_logits(logits_BxV, temperature=float('inf'))


def test_a_row_of_only_minus_infinity_stays_minus_infinity_without_nan():
  logits_BxV = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, 2.0]], np.float32)
  for args in ({'temperature': 0.5}, {'temperature': 0.5, 'top_k': 2, 'top_p': 0.9}):
    filtered = np.asarray(sampling.filter_logits(logits_BxV, **args))
    assert not np.isnan(filtered).any(), args
    np.testing.assert_array_equal(filtered[0], [-np.inf] * 3)


# ---- top-k and top-p against brute force ---------------------------------------------------

@pytest.mark.parametrize('top_k', [1, 2, 7, 24])
def test_top_k_keeps_exactly_k_largest_with_unchanged_values(top_k):
  logits_BxV = _random_logits(np.random.default_rng(2), 300, 25)
  filtered = np.asarray(sampling.filter_logits(logits_BxV, temperature=0.5, top_k=top_k))
  expected = np.stack([_kept_reference(row, top_k=top_k) for row in logits_BxV])
  np.testing.assert_array_equal(np.isfinite(filtered), expected)
  assert (expected.sum(-1) == top_k).all()
  np.testing.assert_allclose(filtered[expected], tempered(logits_BxV, 0.5)[expected], rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('top_p', [0.05, 0.3, 0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize('top_k', [None, 6])
def test_top_p_keeps_smallest_set_with_mass_at_least_p(top_p, top_k):
  """With top_k, the nucleus is taken in the renormalised top-k distribution."""
  logits_BxV = _random_logits(np.random.default_rng(3), 400, 20)
  filtered = np.asarray(sampling.filter_logits(logits_BxV, top_k=top_k, top_p=top_p))
  expected = np.stack([_kept_reference(row, top_k=top_k, top_p=top_p) for row in logits_BxV])
  np.testing.assert_array_equal(np.isfinite(filtered), expected)
  np.testing.assert_allclose(filtered[expected], tempered(logits_BxV)[expected], rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('top_p, kept', [(0.25, [0]), (0.5, [0, 2]), (0.5001, [0, 2, 3]),
                                         (0.75, [0, 2, 3]), (1.0, [0, 2, 3, 5])])
def test_top_p_that_equals_a_cumulative_sum_stops_at_that_token(top_p, kept):
  # Four tokens of probability exactly 1/4: the cumulative sums 1/4, 1/2, 3/4, 1 are exact in float32.
  logits_1xV = np.array([[0.0, -np.inf, 0.0, 0.0, -np.inf, 0.0]], np.float32)
  filtered = np.asarray(sampling.filter_logits(logits_1xV, top_p=top_p))
  np.testing.assert_array_equal(np.flatnonzero(np.isfinite(filtered[0])), kept)


def test_bfloat16_logits_are_filtered_in_float32():
  # (z − max z) / T in bfloat16 keeps 8 bits of mantissa: −1 / 0.3 would be −3.328125.
  logits_1xV = jnp.asarray([[3.0, 2.0, -1.0]], jnp.bfloat16)
  filtered = sampling.filter_logits(logits_1xV, temperature=0.3, top_k=2)
  assert filtered.dtype == jnp.float32
  expected = (np.float32(2.0) - np.float32(3.0)) / np.float32(0.3)
  np.testing.assert_array_equal(np.asarray(filtered)[0], [0.0, expected, -np.inf])


def test_top_p_equal_to_a_rounded_float32_cumulative_sum_keeps_exactly_that_prefix():
  # Masses that are not dyadic: the mass before token i + 1, taken as cumsum − p_(i+1), can
  # round below the cumulative sum of the first i and keep one token too many.
  rng = np.random.default_rng(7)
  for _ in range(3):
    logits_1xV = np.round(rng.normal(size=(1, 7)), 1).astype(np.float32) + 0.0
    probs_V = np.asarray(jax.nn.softmax(jnp.asarray(-np.sort(-logits_1xV[0]))))
    cumulative_V = np.cumsum(probs_V, dtype=np.float32)  # float32, summed left to right
    for count in range(1, 6):
      filtered = sampling.filter_logits(logits_1xV, top_p=float(cumulative_V[count - 1]))
      assert np.isfinite(filtered).sum() == count, (logits_1xV, count)


def test_top_p_with_renormalisation_differs_from_top_p_on_the_raw_distribution():
  # Raw cumulative mass 0.35, 0.60, 0.75 would keep three tokens at p = 0.65; over the
  # top 4 (mass 0.87) it is 0.40, 0.69, so two.
  filtered = sampling.filter_logits(np.log(PROBS_V)[None].astype(np.float32), top_k=4, top_p=0.65)
  np.testing.assert_array_equal(np.isfinite(filtered[0]), [1, 1, 0, 0, 0, 0])


# ---- frequencies ---------------------------------------------------------------------------

@pytest.mark.parametrize('args, expected_V', [
    ({}, PROBS_V),
    ({'temperature': 0.5}, PROBS_V ** 2),  # softmax(log p / 0.5) ∝ p²
    ({'top_k': 3}, np.where(np.arange(6) < 3, PROBS_V, 0)),
    ({'top_p': 0.8}, np.where(np.arange(6) < 4, PROBS_V, 0)),  # cumulative 0.35 0.60 0.75 0.87
    ({'top_k': 4, 'top_p': 0.65}, np.where(np.arange(6) < 2, PROBS_V, 0)),
])
def test_sample_frequencies_pass_chisquare(args, expected_V):
  counts = _counts(0, **args)
  assert counts.sum() == NUM_DRAWS
  assert (counts[expected_V == 0] == 0).all(), counts
  kept = expected_V > 0
  assert _chisquare_pvalue(counts[kept], expected_V[kept]) > 1e-3


def test_chisquare_rejects_a_wrong_distribution():
  """The frequency test has power: the mistakes it should catch give p-values < 1e-3."""
  tempered = _counts(0, temperature=0.5)
  assert _chisquare_pvalue(tempered, PROBS_V) < 1e-3  # temperature ignored
  assert _chisquare_pvalue(tempered, PROBS_V ** 0.5) < 1e-3  # logits multiplied by T
  # Two close probabilities (0.15 and 0.12) swapped.
  assert _chisquare_pvalue(_counts(0), PROBS_V[[0, 1, 3, 2, 4, 5]]) < 1e-3


# ---- generate ------------------------------------------------------------------------------

class TinyCausalLM(nn.Module):
  """Token + position embedding → BatchNorm → causal conv (width 3, left zero padding) → ReLU → Dense.

  With `decode=True` the cache holds the position and the last two conv inputs, as the
  lm1b protocol asks: `init` creates it, each `apply` reads one token.
  """
  vocab_size: int = 11
  width: int = 16
  kernel_size: int = 3
  max_length: int = 32

  @nn.compact
  def __call__(self, tokens_BxT, *, train=False, decode=False):
    batch_size, length = tokens_BxT.shape
    stepping = decode and self.has_variable('cache', 'index')
    index = window = None
    if decode:
      index = self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
      window = self.variable('cache', 'window', jnp.zeros,
                             (batch_size, self.kernel_size - 1, self.width))
    positions_T = jnp.arange(length) + (index.value if stepping else 0)
    x_BxTxD = (nn.Embed(self.vocab_size, self.width)(tokens_BxT)
               + nn.Embed(self.max_length, self.width, name='position')(positions_T))
    x_BxTxD = nn.BatchNorm(use_running_average=not train)(x_BxTxD)
    if stepping:
      padded_BxKxD = jnp.concatenate([window.value, x_BxTxD], axis=1)
      window.value = padded_BxKxD[:, 1:]
      index.value += 1
    else:
      padded_BxKxD = jnp.pad(x_BxTxD, ((0, 0), (self.kernel_size - 1, 0), (0, 0)))
    h_BxTxD = nn.relu(nn.Conv(self.width, (self.kernel_size,), padding='VALID')(padded_BxKxD))
    return nn.Dense(self.vocab_size)(h_BxTxD)


def _tiny_lm():
  model = TinyCausalLM()
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32), train=False)
  # Running statistics away from (0, 1): dropping 'batch_stats' would change every logit.
  stats_rng = np.random.default_rng(4)
  batch_stats = jax.tree.map(lambda s: s + stats_rng.uniform(0.2, 0.5, s.shape).astype(np.float32),
                             variables['batch_stats'])
  return model, {'params': variables['params'], 'batch_stats': batch_stats}


def _prompt(length):
  return np.random.default_rng(5).integers(0, 11, size=(3, length)).astype(np.int32)


def _reference_loop(model, variables, prompt_BxP, key, num_new_tokens, **sampling_args):
  """Recomputes the whole prefix with model.apply at every step."""
  tokens_BxT, logits = np.asarray(prompt_BxP), []
  for _ in range(num_new_tokens):
    logits_BxV = model.apply(variables, tokens_BxT, train=False)[:, -1]
    next_B = sampling.sample_token(jax.random.fold_in(key, tokens_BxT.shape[1]), logits_BxV,
                                   **sampling_args)
    tokens_BxT = np.concatenate([tokens_BxT, np.asarray(next_B)[:, None]], axis=1)
    logits.append(logits_BxV)
  return tokens_BxT, np.stack(logits, axis=1)


@pytest.mark.parametrize('prompt_length', [1, 4])
@pytest.mark.parametrize('args', [{'temperature': 0}, {'temperature': 0.8, 'top_k': 6, 'top_p': 0.9}])
def test_generate_matches_prefix_recomputation_with_and_without_cache(prompt_length, args):
  model, variables = _tiny_lm()
  prompt_BxP, key = _prompt(prompt_length), jax.random.PRNGKey(6)
  expected_tokens, expected_logits = _reference_loop(model, variables, prompt_BxP, key, 8, **args)
  for use_cache in (False, True):
    tokens, logits = sampling.generate(model, variables, prompt_BxP, key, num_new_tokens=8,
                                       use_cache=use_cache, return_logits=True, **args)
    assert tokens.dtype == jnp.int32 and tokens.shape == (3, prompt_length + 8)
    assert logits.shape == (3, 8, 11)
    np.testing.assert_array_equal(tokens[:, :prompt_length], prompt_BxP)
    np.testing.assert_array_equal(tokens, expected_tokens, err_msg=f'use_cache={use_cache}')
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)


class _CacheMarkedLM(nn.Module):
  """TinyCausalLM whose logits through the cache (decode=True) favour token 0 by 100, so the
  tokens show which path `generate` took."""

  @nn.compact
  def __call__(self, tokens_BxT, *, train=False, decode=False):
    logits_BxTxV = TinyCausalLM(name='lm')(tokens_BxT, train=train, decode=decode)
    return logits_BxTxV.at[..., 0].add(100.0 if decode else 0.0)


def test_generate_with_use_cache_reads_through_the_cache():
  model = _CacheMarkedLM()
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
  prompt_BxP = np.full((3, 2), 5, np.int32)
  cached = np.asarray(sampling.generate(model, variables, prompt_BxP, jax.random.PRNGKey(1),
                                        num_new_tokens=5, temperature=0, use_cache=True))
  np.testing.assert_array_equal(cached, np.concatenate([prompt_BxP, np.zeros((3, 5))], 1))
  uncached, _ = _reference_loop(model, variables, prompt_BxP, jax.random.PRNGKey(1), 5,
                                temperature=0)
  assert (uncached[:, 2:] != 0).any()  # the full pass does not favour token 0
  np.testing.assert_array_equal(sampling.generate(
      model, variables, prompt_BxP, jax.random.PRNGKey(1), num_new_tokens=5, temperature=0,
      use_cache=False), uncached)


class _Bfloat16LM(nn.Module):
  """TinyCausalLM with bfloat16 logits."""

  @nn.compact
  def __call__(self, tokens_BxT, *, train=False, decode=False):
    return TinyCausalLM(name='lm')(tokens_BxT, train=train, decode=decode).astype(jnp.bfloat16)


@pytest.mark.parametrize('use_cache', [False, True])
def test_generate_returns_float32_logits_of_a_bfloat16_model(use_cache):
  model = _Bfloat16LM()
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
  _, logits = sampling.generate(model, variables, _prompt(2), jax.random.PRNGKey(1),
                                num_new_tokens=2, use_cache=use_cache, return_logits=True)
  assert logits.dtype == jnp.float32


class _ContextLM(TinyCausalLM):
  """TinyCausalLM declaring a fixed context of its 32 positions."""

  @property
  def max_context(self) -> int:
    return self.max_length


@pytest.mark.parametrize('use_cache', [False, True])
def test_a_context_longer_than_the_sequence_reads_every_token(use_cache):
  _, variables = _tiny_lm()
  model = _ContextLM()
  prompt_BxP, key = _prompt(2), jax.random.PRNGKey(3)
  args = {'temperature': 0.8, 'top_k': 6}
  expected_tokens, expected_logits = _reference_loop(model, variables, prompt_BxP, key, 5, **args)
  tokens, logits = sampling.generate(model, variables, prompt_BxP, key, num_new_tokens=5,
                                     use_cache=use_cache, return_logits=True, **args)
  np.testing.assert_array_equal(tokens, expected_tokens)
  np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)


def test_generate_draws_vary_with_the_key_and_repeat_with_the_same_key():
  model, variables = _tiny_lm()
  run = lambda seed: np.asarray(sampling.generate(model, variables, _prompt(2),
                                                  jax.random.PRNGKey(seed), num_new_tokens=12,
                                                  temperature=2.0, use_cache=True))
  np.testing.assert_array_equal(run(7), run(7))
  assert (run(7) != run(8)).any()


class _SourceLM(nn.Module):
  """TinyCausalLM whose logits favour the token `source_B` of each row by 100: an input that
  every model call needs besides the tokens, as an encoder–decoder's source sentence."""

  @nn.compact
  def __call__(self, tokens_BxT, source_B, *, train=False, decode=False):
    logits_BxTxV = TinyCausalLM(name='lm')(tokens_BxT, train=train, decode=decode)
    return logits_BxTxV + 100.0 * jax.nn.one_hot(source_B, 11)[:, None]


@pytest.mark.parametrize('use_cache', [False, True])
def test_generate_passes_the_inputs_to_every_model_call(use_cache):
  model = _SourceLM()
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32),
                         jnp.zeros((1,), jnp.int32))
  source_B = np.array([3, 7, 1], np.int32)
  tokens = sampling.generate(model, variables, _prompt(2), jax.random.PRNGKey(1),
                             num_new_tokens=3, temperature=0, use_cache=use_cache,
                             inputs=(source_B,))
  np.testing.assert_array_equal(np.asarray(tokens)[:, 2:], np.repeat(source_B[:, None], 3, 1))


def test_generate_text_decodes_num_samples_prompts_and_continuations_through_the_cache():
  # Letters a, b, … are the ids 0, 1, …; through the cache _CacheMarkedLM favours 0 ('a').
  tokenizer = types.SimpleNamespace(encode=lambda text: [ord(c) - ord('a') for c in text],
                                    decode=lambda ids: ''.join(chr(ord('a') + i) for i in ids))
  model = _CacheMarkedLM()
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
  texts = sampling.generate_text(model, variables, tokenizer, 'ff', jax.random.PRNGKey(1),
                                 num_samples=3, num_new_tokens=4, temperature=0, top_k=2)
  assert texts == ['ffaaaa'] * 3


# ---- argument errors -----------------------------------------------------------------------

@pytest.mark.parametrize('args, name', [
    ({'temperature': -0.5}, 'temperature'), ({'temperature': float('nan')}, 'temperature'),
    ({'temperature': '1'}, 'temperature'), ({'temperature': True}, 'temperature'),
    ({'top_k': -1}, 'top_k'), ({'top_k': 2.5}, 'top_k'),
    ({'top_k': True}, 'top_k'), ({'top_p': 0.0}, 'top_p'), ({'top_p': 1.5}, 'top_p'),
])
def test_invalid_sampling_arguments_raise_one_sentence(args, name):
  model, variables = _tiny_lm()
  (value,) = args.values()
  calls = [lambda: sampling.filter_logits(np.zeros((1, 4)), **args),
           lambda: sampling.sample_token(jax.random.PRNGKey(0), np.zeros((1, 4)), **args),
           lambda: sampling.generate(model, variables, _prompt(2), jax.random.PRNGKey(0),
                                     num_new_tokens=2, **args)]
  for call in calls:
    with pytest.raises(ValueError) as error:
      call()
    message = str(error.value)
    assert message.startswith(name) and repr(value) in message
    assert message.endswith('.') and '\n' not in message


@pytest.mark.parametrize('num_new_tokens, prompt_length, match', [
    (0, 2, 'num_new_tokens must be an integer >= 1, got 0.'),
    (2.0, 2, 'num_new_tokens must be an integer >= 1, got 2.0.'),
    (2, 0, r'prompt must have shape \[batch, length >= 1\], got \(3, 0\).'),
    # P + N = 2**31 + 1 used to be an OverflowError traceback (positions are int32).
    (2**31 - 1, 2, r"A prompt of length 2 and num_new_tokens=2147483647 exceed the 2\*\*31 "
                   'positions int32 numbers.'),
    (2**40, 2, 'num_new_tokens=1099511627776 exceed'),
])
def test_invalid_generate_arguments_raise(num_new_tokens, prompt_length, match):
  model, variables = _tiny_lm()
  with pytest.raises(ValueError, match=match):
    sampling.generate(model, variables, _prompt(prompt_length), jax.random.PRNGKey(0),
                      num_new_tokens=num_new_tokens)


def test_the_longest_sequence_of_int32_positions_is_accepted(monkeypatch):
  # P + N = 2**31: positions 0 … 2**31 − 1 are all int32 (one more is refused above). The
  # compiled loop is replaced, since that sequence would take 24 GiB.
  monkeypatch.setattr(sampling, '_generate', lambda *args, **kwargs: ('tokens', None))
  assert sampling.generate(TinyCausalLM(), {}, _prompt(2), jax.random.PRNGKey(0),
                           num_new_tokens=2**31 - 2) == 'tokens'


@pytest.mark.parametrize('bad, where', [(11, '(row 1, position 2)'), (-1, '(row 1, position 2)')])
def test_a_prompt_id_outside_the_vocabulary_is_one_sentence(bad, where):
  # An id of V gave NaN logits, so every new token came out 0; -1 read another token's row.
  model, variables = _tiny_lm()
  prompt = _prompt(4)
  prompt[1, 2] = bad
  with pytest.raises(ValueError, match=rf'Prompt token {bad} \(row 1, position 2\) is not an id '
                                       r"in \[0, 11\) of the model's vocabulary\."):
    sampling.generate(model, variables, prompt, jax.random.PRNGKey(0), num_new_tokens=2)
  # Ids inside the vocabulary at both ends are taken.
  prompt[1, 2], prompt[0, 0] = 10, 0
  assert sampling.generate(model, variables, prompt, jax.random.PRNGKey(0),
                           num_new_tokens=2).shape == (3, 6)


def test_a_prompt_of_floats_is_one_sentence():
  # 1.5 used to be read as token 1.
  model, variables = _tiny_lm()
  with pytest.raises(ValueError, match='prompt must hold integer token ids, got float32.'):
    sampling.generate(model, variables, _prompt(3).astype(np.float32) + 0.5,
                      jax.random.PRNGKey(0), num_new_tokens=2)


class _ListAttributeLM(TinyCausalLM):
  widths: list | None = None


def test_unhashable_model_raises_before_jit():
  _, variables = _tiny_lm()
  with pytest.raises(ValueError, match='model must be hashable'):
    sampling.generate(_ListAttributeLM(widths=[4]), variables, _prompt(2), jax.random.PRNGKey(0),
                      num_new_tokens=2)


def test_fixed_context_model_slides_a_window_once_the_sequence_outgrows_it():
  """A model with max_context W reads the last W tokens at each step (not its clamped
  positions past W), with or without the cache asked for; the reference feeds those
  windows one by one."""
  from models.transformer.gpt import GPT  # pylint: disable=g-import-not-at-top
  model = GPT(vocab_size=11, num_layers=1, features=16, num_heads=2, max_length=8)
  prompt_BxP = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, 11)
  variables = model.init(jax.random.PRNGKey(0), prompt_BxP)
  for use_cache in (False, True):
    tokens_BxL, logits_BxNxV = sampling.generate(
        model, variables, prompt_BxP, jax.random.PRNGKey(2), num_new_tokens=6,
        return_logits=True, use_cache=use_cache)
    tokens = np.asarray(tokens_BxL)
    expected = [model.apply(variables, jnp.asarray(tokens[:, t - 8:t]))[:, -1]
                for t in range(8, 14)]
    np.testing.assert_allclose(np.asarray(logits_BxNxV), np.stack(expected, 1), atol=1e-5)
