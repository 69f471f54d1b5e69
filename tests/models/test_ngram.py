"""n-gram models against hand-computed counts, a loop-and-dict reference and normalisation.

The hand example is the 10-token corpus "abacabadab" over the vocabulary
a b c d e (e never occurs), so V = 5:

  bigrams      ab ×3, ba ×2, ac, ca, ad, da         S(a) = 5, S(b) = 2, S(c) = S(d) = 1
  N₁₊(• w)     a: 3 (after b, c, d), b: 1, c: 1, d: 1, e: 0;  N₁₊(• •) = 6
  trigrams     aba ×2, bac, aca, cab, bad, ada, dab  S(ab) = 2 (the final "ab" has no successor)
"""

import collections
from fractions import Fraction
import random
import signal

import numpy as np
import pytest

from models import ngram
from tests.messages import assert_one_sentence

VOCAB = 'abcde'
CORPUS = 'abacabadab'


def ids(text: str) -> np.ndarray:
  return np.array([VOCAB.index(c) for c in text])


def history(text: str, width: int) -> np.ndarray:
  """One history row: the ids of `text` padded on the left with -1 to `width`."""
  row = np.full((1, width), -1)
  if text:
    row[0, width - len(text):] = ids(text)
  return row


def model(order, **options):
  return ngram.NGramModel(ids(CORPUS), vocab_size=len(VOCAB), order=order, **options)


# Hand-computed values.


def test_add_k_against_hand_counts():
  bigram = model(2, smoothing='add_k', add_k=0.5)
  p = bigram.probabilities(np.concatenate([history('a', 1), history('e', 1)]))
  # (c(h w) + k) / (S(h) + k V) with S(a) = 5: (3 + ½) / (5 + 5/2) for b, ½ / 7.5 for e.
  np.testing.assert_allclose(p[0], [0.5 / 7.5, 3.5 / 7.5, 1.5 / 7.5, 1.5 / 7.5, 0.5 / 7.5])
  np.testing.assert_allclose(p[1], np.full(5, 1 / 5))  # "e" never seen as a context
  trigram = model(3, smoothing='add_k', add_k=1.0)
  # S(ab) = 2: "ab" is followed by a twice; its last occurrence ends the corpus.
  np.testing.assert_allclose(trigram.probabilities(history('ab', 2))[0], [3 / 7, 1 / 7, 1 / 7, 1 / 7, 1 / 7])


def test_kneser_ney_bigram_against_hand_computation():
  d = Fraction(3, 4)
  # Lower level, continuation counts: max(N₁₊(• w) − D, 0) / 6 + D · 4/6 · 1/5.
  spread = d * 4 / 6 / 5
  unigram = {w: max(Fraction(n) - d, Fraction(0)) / 6 + spread
             for w, n in zip(VOCAB, [3, 1, 1, 1, 0])}
  assert unigram == {'a': Fraction(57, 120), 'b': Fraction(17, 120), 'c': Fraction(17, 120),
                     'd': Fraction(17, 120), 'e': Fraction(12, 120)}
  # Top level after "a": max(c(a w) − D, 0) / 5 + D · 3/5 · P(w); after "b": (2 − D)/2 + D/2 · P(w).
  after_a = {w: max(Fraction(c) - d, Fraction(0)) / 5 + d * 3 / 5 * unigram[w]
             for w, c in zip(VOCAB, [0, 3, 1, 1, 0])}
  after_b = {w: max(Fraction(c) - d, Fraction(0)) / 2 + d * 1 / 2 * unigram[w]
             for w, c in zip(VOCAB, [2, 0, 0, 0, 0])}
  assert after_a['b'] == Fraction(411, 800) and after_b['a'] == Fraction(257, 320)
  bigram = model(2, smoothing='kneser_ney', discount=0.75)
  p = bigram.probabilities(np.concatenate([history(h, 1) for h in 'abe']))
  np.testing.assert_allclose(p[0], [float(after_a[w]) for w in VOCAB])
  np.testing.assert_allclose(p[1], [float(after_b[w]) for w in VOCAB])
  np.testing.assert_allclose(p[2], [float(unigram[w]) for w in VOCAB])  # unseen context
  # Without context the bigram model is the unigram model of raw counts a 5, b 3, c 1, d 1.
  raw = [max(Fraction(c) - d, Fraction(0)) / 10 + d * 4 / 10 / 5 for c in [5, 3, 1, 1, 0]]
  np.testing.assert_allclose(bigram.probabilities(history('', 1))[0], [float(r) for r in raw])


def test_unigram_add_zero_is_relative_frequency():
  tokens = np.random.default_rng(0).integers(0, 7, 500)
  unigram = ngram.NGramModel(tokens, vocab_size=9, order=1, smoothing='add_k', add_k=0.0)
  expected = np.bincount(tokens, minlength=9) / len(tokens)
  np.testing.assert_allclose(unigram.probabilities(np.zeros((1, 0), np.int64))[0], expected)


def test_discount_estimate_is_count_of_counts():
  # Raw bigram counts 3, 2, 1, 1, 1, 1: n₁ = 4, n₂ = 1, D = 4 / 6; the unigram
  # continuation counts 3, 1, 1, 1: n₁ = 3, n₂ = 0, D = 1.
  bigram = model(2, discount=None)
  assert bigram.discounts[1] == pytest.approx(4 / 6)
  assert bigram.continuation_discounts[0] == pytest.approx(1.0)


# A loop-and-dict reference of the same definitions.


def _reference(tokens, vocab_size, order, discount, history_ids, target):
  grams = {m: collections.Counter(tuple(tokens[i:i + m]) for i in range(len(tokens) - m + 1))
           for m in range(1, order + 1)}
  continuation = {m: collections.Counter(g[1:] for g in grams[m + 1]) for m in range(1, order)}

  def estimate(counts):
    n1 = sum(1 for c in counts.values() if c == 1)
    n2 = sum(1 for c in counts.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 else ngram.FALLBACK_DISCOUNT

  def level(counts, context, lower):
    followers = {g[-1]: c for g, c in counts.items() if g[:-1] == context}
    total = sum(followers.values())
    if total == 0:
      return lower
    d = estimate(counts) if discount is None else discount
    return (max(followers.get(target, 0) - d, 0) + d * len(followers) * lower) / total

  context = tuple(history_ids)[len(history_ids) - min(len(history_ids), order - 1):]
  p = 1 / vocab_size
  for m in range(1, len(context) + 1):
    p = level(continuation[m], context[len(context) - m + 1:], p)
  return level(grams[len(context) + 1], context, p)


@pytest.mark.parametrize('order, discount', [(3, 0.75), (3, None), (4, None)])
def test_kneser_ney_matches_loop_reference(order, discount):
  rng = np.random.default_rng(order)
  tokens = rng.integers(0, 4, 60)  # id 4 and 5 never occur
  lm = ngram.NGramModel(tokens, vocab_size=6, order=order, discount=discount)
  histories = [tokens[i - order + 1:i] for i in range(order, 30)]  # seen
  histories += [rng.integers(0, 6, order - 1) for _ in range(10)]  # mostly unseen
  histories += [tokens[5:5 + k] for k in range(order - 1)]  # shorter than n − 1
  for h in histories:
    row = np.full((1, order - 1), -1)
    if len(h):
      row[0, order - 1 - len(h):] = h
    expected = [_reference(list(tokens), 6, order, discount, list(h), w) for w in range(6)]
    np.testing.assert_allclose(lm.probabilities(row)[0], expected, rtol=1e-12)


# Properties.


@pytest.mark.parametrize('order', [1, 2, 3, 4])
@pytest.mark.parametrize('options', [
    dict(smoothing='kneser_ney', discount=0.75), dict(smoothing='kneser_ney', discount=None),
    dict(smoothing='add_k', add_k=1.0), dict(smoothing='add_k', add_k=0.01),
    dict(smoothing='add_k', add_k=0.0)])
def test_every_distribution_sums_to_one(order, options):
  rng = np.random.default_rng(order)
  tokens = rng.integers(0, 6, 300) // rng.integers(1, 3, 300)  # skewed; ids 6, 7 unseen
  lm = ngram.NGramModel(tokens, vocab_size=8, order=order, **options)
  width = order - 1
  seen = [tokens[i - width:i] for i in range(width, len(tokens))]
  unseen = [rng.integers(0, 8, width) for _ in range(50)]
  shorter = [tokens[i:i + k] for i in range(10) for k in range(width)]
  rows = np.full((len(seen) + len(unseen) + len(shorter), width), -1)
  for row, h in zip(rows, seen + unseen + shorter):
    if len(h):
      row[width - len(h):] = h
  totals = lm.probabilities(rows).sum(axis=1)
  np.testing.assert_allclose(totals, 1.0, rtol=1e-12)


def test_window_scores_use_only_the_window_before_each_target():
  tokens = np.random.default_rng(3).integers(0, 5, 200)
  lm = ngram.NGramModel(tokens, vocab_size=5, order=4)
  windows = np.stack([tokens[10:19], tokens[50:59]])
  scores = lm.window_log_probs(windows)
  for b in range(2):
    for j in range(8):
      h = windows[b, max(0, j - 2):j + 1]
      row = np.full((1, 3), -1)
      row[0, 3 - len(h):] = h
      assert scores[b, j] == pytest.approx(lm.log_prob(row, windows[b, j + 1:j + 2])[0], rel=1e-12)


def test_sampling_follows_a_deterministic_corpus():
  # With add-0 every "a" is followed by "b", "b" by "c", "c" by "a".
  lm = ngram.NGramModel(ids('abc' * 20), vocab_size=5, order=2, smoothing='add_k', add_k=0.0)
  drawn = lm.sample(ids('ca'), 7, np.random.default_rng(0))
  assert ''.join(VOCAB[i] for i in drawn) == 'bcabcab'


@pytest.mark.parametrize('corpus, continuations', [
    # Order 3 after the single id "a": the history is (before the text, a), so the bigram
    # level continues with "b", then the trigram levels with "c", "a", ... Read as (a, before
    # the text), the first id would be a unigram draw, right with probability 1/3 only.
    ('abc', [('a', 'bcabca'), ('b', 'cabcab'), ('c', 'abcabc')]),
    # In "aabb" repeated, the id after "a" is "a" or "b", but the one after two ids is fixed:
    # "aa" → "b", "ab" → "b", "bb" → "a", "ba" → "a". Read from the last prompt id alone, the
    # first draw after "ba" or "aa" would not be certain.
    ('aabb', [('ba', 'abbaab'), ('aa', 'bbaabb'), ('cab', 'baabba')])])
def test_sampling_at_order_3_reads_the_latest_two_ids_of_the_prompt(corpus, continuations):
  lm = ngram.NGramModel(ids(corpus * 20), vocab_size=5, order=3, smoothing='add_k', add_k=0.0)
  for prompt, expected in continuations:
    for seed in range(5):
      drawn = lm.sample(ids(prompt), 6, np.random.default_rng(seed))
      assert ''.join(VOCAB[i] for i in drawn) == expected, (prompt, seed)


@pytest.mark.parametrize('length', [-1, 2.0, True])
def test_sampling_refuses_a_length_that_is_not_a_count(length):
  # -1 used to return no ids without a word, 2.0 to fail inside range().
  lm = ngram.NGramModel(ids('abc' * 20), vocab_size=5, order=2, smoothing='add_k', add_k=0.0)
  with pytest.raises(ValueError, match=rf'^length={length!r} is not a number of ids to draw; '
                                       r'give an integer >= 0\.$'):
    lm.sample(ids('ca'), length, np.random.default_rng(0))
  assert len(lm.sample(ids('ca'), np.int64(0), np.random.default_rng(0))) == 0


def test_sampled_continuations_follow_the_model_s_probabilities():
  # Each id is drawn from P(w | history), not taken as its argmax. With add-0, "a" is followed
  # by "b" with probability 2/3 and by "c" with 1/3, and "b" and "c" always by "a".
  lm = ngram.NGramModel(ids('abacab' * 20), vocab_size=5, order=2, smoothing='add_k', add_k=0.0)
  drawn = lm.sample(ids('a'), 3000, np.random.default_rng(0))
  chain = np.concatenate([ids('a'), drawn])
  after_a = chain[1:][chain[:-1] == VOCAB.index('a')]
  after_other = chain[1:][chain[:-1] != VOCAB.index('a')]
  assert set(after_a.tolist()) == {VOCAB.index('b'), VOCAB.index('c')}
  assert np.all(after_other == VOCAB.index('a'))
  # 1500 draws after "a": the standard error of the share of "b" is about 0.012.
  assert np.mean(after_a == VOCAB.index('b')) == pytest.approx(2 / 3, abs=0.05)


def _english(rng: random.Random, sentences: int) -> str:
  subjects = ['the king', 'a young man', 'my lord', 'the queen', 'our good friend', 'this old house']
  verbs = ['loves', 'speaks to', 'remembers', 'follows', 'forgets', 'watches over']
  objects = ['the river', 'his brother', 'her mother', 'the city', 'every soldier', 'the night']
  tails = ['.', ' tonight.', ' with care.', ' in silence.', ', and weeps.']
  return ' '.join(f'{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(tails)}'
                  .capitalize() for _ in range(sentences))


def test_kneser_ney_beats_add_one_on_held_out_text():
  train_text, held_out = _english(random.Random(0), 200), _english(random.Random(1), 40)
  alphabet = sorted(set(train_text + held_out))
  encode = lambda s: np.array([alphabet.index(c) for c in s])
  perplexity = {}
  for options in (dict(smoothing='kneser_ney'), dict(smoothing='add_k', add_k=1.0)):
    lm = ngram.NGramModel(encode(train_text), vocab_size=len(alphabet), order=3, **options)
    log_p = lm.window_log_probs(encode(held_out)[None])
    perplexity[options['smoothing']] = float(np.exp(-log_p.mean()))
  assert perplexity['kneser_ney'] < 0.9 * perplexity['add_k'], perplexity


def test_a_stream_as_long_as_the_order_gives_its_one_m_gram():
  # "ab" holds one bigram: with add-0, "a" is always followed by "b".
  lm = ngram.NGramModel(ids('ab'), vocab_size=5, order=2, smoothing='add_k', add_k=0.0)
  np.testing.assert_allclose(lm.probabilities(history('a', 1))[0], [0, 1, 0, 0, 0])


def test_the_ends_of_the_allowed_discounts_and_orders():
  # D = 1 keeps every distribution normalised; the order max_order(V) fits the codes.
  lm = model(3, discount=1.0)
  rows = np.concatenate([history(h, 2) for h in ('ab', 'e', '')])
  np.testing.assert_allclose(lm.probabilities(rows).sum(axis=1), 1.0, rtol=1e-12)
  # After "b" (bigram counts: a ×2): (2 − 1) / 2 + 1 · 1/2 · P(a), with the continuation
  # unigram P(a) = (3 − 1) / 6 + 1 · 4/6 · 1/5.
  np.testing.assert_allclose(model(2, discount=1.0).probabilities(history('b', 1))[0, 0],
                             0.5 + 0.5 * (2 / 6 + 4 / 6 / 5))
  top = ngram.max_order(65)
  deep = ngram.NGramModel(np.arange(20) % 65, vocab_size=65, order=top)
  assert deep.order == top == 10


@pytest.mark.parametrize('tokens', [[0, 1, 5, 2], [0, -1, 2]])
def test_training_tokens_outside_the_vocabulary_are_refused_in_one_sentence(tokens):
  with pytest.raises(ValueError) as error:
    ngram.NGramModel(np.array(tokens), vocab_size=5, order=2)
  assert_one_sentence(str(error.value), 'training tokens', '[0, 5)')


@pytest.mark.parametrize('options, parts', [
    (dict(order=0), ['order', '0']),
    (dict(order=2, smoothing='witten_bell'), ["'witten_bell'", 'kneser_ney', 'add_k']),
    (dict(order=2, discount=1.5), ['discount', '1.5']),
    (dict(order=2, add_k=-1.0), ['add_k', '-1.0']),
    (dict(order=2, add_k=float('nan')), ['add_k', 'nan']),
    (dict(order=2, add_k=float('inf')), ['add_k', 'finite', 'inf']),
    (dict(order=11, vocab_size=65), ['65', '11', 'at most 10']),
])
def test_bad_options_are_refused_in_one_sentence(options, parts):
  options = {'vocab_size': 5, **options}
  with pytest.raises(ValueError) as error:
    ngram.NGramModel(ids(CORPUS), **options)
  assert_one_sentence(str(error.value), *parts)


def test_float_tokens_are_refused_not_truncated():
  # [0.5, 1.7, 2.9, 1.2] were cast to ids [0, 1, 2, 1] and fitted.
  with pytest.raises(ValueError) as error:
    ngram.NGramModel(np.array([0.5, 1.7, 2.9, 1.2]), vocab_size=5, order=2)
  assert_one_sentence(str(error.value), 'integer ids', 'float64 tokens such as 0.5')
  with pytest.raises(ValueError) as error:
    ngram.NGramModel(np.array([0.0, 1.0, 1.5]), vocab_size=5, order=2)
  assert_one_sentence(str(error.value), 'integer ids', 'float64 tokens such as 1.5')
  # Integer tokens of any width, or a list of ints, fit the same model.
  reference = model(2)
  for tokens in (ids(CORPUS).astype(np.int8), list(ids(CORPUS))):
    fitted = ngram.NGramModel(tokens, vocab_size=len(VOCAB), order=2)
    np.testing.assert_array_equal(fitted.probabilities(history('a', 1)),
                                  reference.probabilities(history('a', 1)))


@pytest.mark.parametrize('smoothing', ['kneser_ney', 'add_k'])
def test_a_short_history_is_left_padded_with_before_the_text(smoothing):
  # An order-4 model reads 3 columns; histories of 0, 1 and 2 ids are the same histories
  # written out with -1 (before the text) in front.
  lm = ngram.NGramModel(np.random.default_rng(5).integers(0, 5, 200), vocab_size=5, order=4,
                        smoothing=smoothing)
  targets = np.arange(5)
  for short in ([], [3], [1, 3]):
    rows = np.tile(np.array(short, np.int64).reshape(1, -1), (5, 1))
    padded = np.tile(np.array([-1] * (3 - len(short)) + short).reshape(1, -1), (5, 1))
    np.testing.assert_array_equal(lm.log_prob(rows, targets), lm.log_prob(padded, targets))


@pytest.mark.parametrize('order, smoothing', [(2, 'add_k'), (3, 'kneser_ney')])
def test_a_history_longer_than_n_minus_1_uses_its_most_recent_ids(order, smoothing):
  # Only the last n − 1 columns are the context, not the first n − 1: after "…ab" and after
  # "…cb" the hand corpus continues differently.
  lm = model(order, smoothing=smoothing)
  targets = np.arange(5)
  for text in ('cdab', 'dacb'):
    long = np.tile(ids(text), (5, 1))
    recent = np.tile(ids(text[-(order - 1):]), (5, 1))
    np.testing.assert_array_equal(lm.log_prob(long, targets), lm.log_prob(recent, targets))
  assert not np.allclose(lm.log_prob(np.tile(ids('cdab'), (5, 1)), targets),
                         lm.log_prob(np.tile(ids('cd'[:order - 1]), (5, 1)), targets))


@pytest.mark.parametrize('history_row, target, parts', [
    ([0, 1], 5, ['target', '5', '[0, 5)']),
    ([0, 1], -1, ['target', '-1', '[0, 5)']),
    ([0, 5], 2, ['history', '5', '[0, 5)', '-1']),
    ([-2, 1], 2, ['history', '-2', '[0, 5)', '-1']),
])
def test_ids_outside_the_vocabulary_are_refused_in_one_sentence(history_row, target, parts):
  # Coded in base V, they would otherwise read as other m-grams and get a probability.
  lm = model(3)
  with pytest.raises(ValueError) as error:
    lm.log_prob(np.array([history_row]), np.array([target]))
  assert_one_sentence(str(error.value), *parts)


@pytest.mark.parametrize('vocab_size', [0, 1])
def test_a_vocabulary_of_fewer_than_two_ids_is_refused_promptly(vocab_size):
  # V^(n + 1) never reaches 2⁶² for V ≤ 1, so the order limit must not be searched for; the
  # alarm turns a search that never ends into a failure.
  def hang(signum, frame):
    raise TimeoutError(f'vocab_size={vocab_size} was not refused within 5 s.')
  previous = signal.signal(signal.SIGALRM, hang)
  signal.alarm(5)
  try:
    with pytest.raises(ValueError) as error:
      ngram.NGramModel(np.zeros(4, np.int64), vocab_size=vocab_size, order=2)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
  assert_one_sentence(str(error.value), 'vocabulary size', 'at least 2', str(vocab_size))


@pytest.mark.parametrize('vocab_size', [2, 3, 29, 65, 256, 50_257])
def test_max_order_is_the_last_whose_codes_stay_below_2_to_the_62(vocab_size):
  order = ngram.max_order(vocab_size)
  assert vocab_size ** order < 2 ** 62 <= vocab_size ** (order + 1)  # exact integers
