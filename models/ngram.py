r"""n-gram language models over token ids, fitted by counting.

An order-n model predicts token w from the n − 1 tokens h before it. Counts
come from one training stream: c(h w) is how often the m-gram h w occurs, and a
context's total is S(h) = Σ_w c(h w) (occurrences of h that are followed by a
token, so each distribution over w is normalised).

Add-k (Lidstone) smoothing, the "additive smoothing" of Chen & Goodman 1998,
An Empirical Study of Smoothing Techniques for Language Modeling:

    P(w | h) = (c(h w) + k) / (S(h) + k V),

which is 1/V for a context never seen (for k = 0, its limit as k → 0).

Interpolated Kneser–Ney (Kneser & Ney 1995, in the interpolated form of Chen &
Goodman 1998, with one discount D per level rather than their modified three):

    P(w | h) = max(c(h w) − D, 0) / S(h) + D N₁₊(h •) / S(h) · P(w | h'),

where h' drops the oldest token of h and N₁₊(h •) counts the distinct w with
c(h w) > 0. The top level uses raw counts; every lower level uses continuation
counts c'(h w) = N₁₊(• h w), the number of distinct tokens seen before h w, in
place of c, and S and N₁₊ are recomputed from them. The recursion ends at the
uniform distribution 1/V; a context with S(h) = 0 passes P(w | h') through
unchanged. With 0 ≤ D ≤ 1 every distribution sums to 1. D is either given or
estimated per level from the counts it discounts, D = n₁ / (n₁ + 2 n₂) (Ney,
Essen & Kneser 1994), n_r being the number of m-grams with count r.

A history of L < n − 1 tokens (at the start of a window) is scored by the
order-(L + 1) model: its top level uses raw counts of that order, as an
order-(L + 1) model fitted on the same stream would.

An m-gram t_1 … t_m is stored as the integer Σ_i t_i V^{m−i}, so lookups are
binary searches over sorted NumPy arrays and a batch is scored level by level
without a Python loop over tokens; V^n must therefore stay below 2^62.
"""

from typing import NamedTuple

import numpy as np

SMOOTHINGS = ('kneser_ney', 'add_k')
# Used in place of the estimate when a level has no count-1 m-grams (n₁ = 0
# would give D = 0 and zero probability to every unseen continuation).
FALLBACK_DISCOUNT = 0.75


class _Level(NamedTuple):
  """Counts of one level: m-grams and their contexts, each sorted by code."""
  gram_codes: np.ndarray
  gram_counts: np.ndarray
  context_codes: np.ndarray
  context_totals: np.ndarray  # S(h)
  context_types: np.ndarray  # N₁₊(h •)
  discount: float


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
  """values[keys == q] for each query, 0 where a query is not a key."""
  if len(keys) == 0:
    return np.zeros(queries.shape)
  positions = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
  return np.where(keys[positions] == queries, values[positions], 0).astype(np.float64)


def estimate_discount(counts: np.ndarray) -> float:
  """D = n₁ / (n₁ + 2 n₂) of Ney, Essen & Kneser 1994."""
  n1, n2 = np.sum(counts == 1), np.sum(counts == 2)
  return float(n1 / (n1 + 2 * n2)) if n1 > 0 else FALLBACK_DISCOUNT


def _level(gram_codes, gram_counts, vocab_size, discount) -> _Level:
  contexts = gram_codes // vocab_size  # sorted, since the grams are
  context_codes, starts, types = np.unique(contexts, return_index=True, return_counts=True)
  totals = np.add.reduceat(gram_counts, starts) if len(starts) else np.zeros(0)
  if discount is None:
    discount = estimate_discount(gram_counts)
  return _Level(gram_codes, gram_counts.astype(np.float64), context_codes,
                totals.astype(np.float64), types.astype(np.float64), float(discount))


def max_order(vocab_size: int) -> int:
  """The highest order whose m-gram codes (base-V numbers of n digits) stay below 2⁶²."""
  if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:  # V ≤ 1 would never stop
    raise ValueError(f'The vocabulary size must be an integer of at least 2, not {vocab_size!r}.')
  order = 0
  while float(vocab_size) ** (order + 1) < 2.0 ** 62:
    order += 1
  return order


class NGramModel:
  """An order-n model of a token stream with add-k or interpolated Kneser–Ney smoothing.

  Attributes:
    order, vocab_size, smoothing, add_k: as given.
    discounts: D of the raw-count level of order m at index m − 1.
    continuation_discounts: D of the continuation-count level of order m at
      index m − 1, for m < n.
  """

  def __init__(self, tokens: np.ndarray, *, vocab_size: int, order: int,
               smoothing: str = 'kneser_ney', add_k: float = 1.0,
               discount: float | None = 0.75):
    """Counts the m-grams of `tokens` for m = 1 … order.

    Args:
      tokens: int array of ids in [0, vocab_size), the training stream.
      vocab_size: V, the number of ids a prediction ranges over.
      order: n ≥ 1.
      smoothing: 'kneser_ney' or 'add_k'.
      add_k: finite k ≥ 0 of add-k smoothing.
      discount: D in [0, 1] of Kneser–Ney at every level, or None to estimate
        it per level as n₁ / (n₁ + 2 n₂).
    """
    tokens = np.asarray(tokens)
    if np.issubdtype(tokens.dtype, np.inexact):  # cast to int64, 1.7 would be id 1
      values = np.concatenate([tokens[tokens != np.round(tokens)], tokens], axis=None)
      example = f' such as {values[0]!s}' if values.size else ''  # a fraction first
      raise ValueError(f'The training tokens must be integer ids, got {tokens.dtype} '
                       f'tokens{example}.')
    tokens = tokens.astype(np.int64, copy=False)
    if smoothing not in SMOOTHINGS:
      raise ValueError(f'Unknown smoothing {smoothing!r}; the smoothings are: {", ".join(SMOOTHINGS)}.')
    if not isinstance(order, (int, np.integer)) or order < 1:
      raise ValueError(f'The n-gram order must be an integer of at least 1, not {order!r}.')
    if order > max_order(vocab_size):
      raise ValueError(f'A vocabulary of {vocab_size} ids to the power of the order {order} does '
                       f'not fit the 62-bit m-gram codes; use an order of at most '
                       f'{max_order(vocab_size)}.')
    if tokens.ndim != 1 or len(tokens) == 0 or tokens.min() < 0 or tokens.max() >= vocab_size:
      raise ValueError(f'The training tokens must be a non-empty 1-D array of ids in '
                       f'[0, {vocab_size}).')
    if not 0 <= add_k < np.inf:  # NaN too
      raise ValueError(f'add_k must be a finite number of at least 0, not {add_k}.')
    if discount is not None and not 0 <= discount <= 1:
      raise ValueError(f'The Kneser–Ney discount must lie in [0, 1] to keep each distribution '
                       f'normalised, not {discount}.')
    self.order, self.vocab_size = int(order), int(vocab_size)
    self.smoothing, self.add_k = smoothing, float(add_k)
    gram_counts = [self._count(tokens, m) for m in range(1, self.order + 1)]
    self._raw = [_level(codes, counts, self.vocab_size, discount) for codes, counts in gram_counts]
    # Continuation counts of level m come from the distinct (m + 1)-grams.
    self._continuation = []
    for m in range(1, self.order):
      suffixes = gram_counts[m][0] % self.vocab_size ** m
      codes, counts = np.unique(suffixes, return_counts=True)
      self._continuation.append(_level(codes, counts, self.vocab_size, discount))
    self.discounts = [level.discount for level in self._raw]
    self.continuation_discounts = [level.discount for level in self._continuation]

  def _count(self, tokens: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct codes of the m-grams of `tokens` and their counts."""
    if len(tokens) < m:
      return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = np.zeros(len(tokens) - m + 1, np.int64)
    for i in range(m):
      codes = codes * self.vocab_size + tokens[i:len(tokens) - m + 1 + i]
    return np.unique(codes, return_counts=True)

  def _smoothed(self, level: _Level, context_codes, targets, lower) -> np.ndarray:
    """One level of the recursion; `lower` is P(w | h') (unused by add-k)."""
    gram_count = _lookup(level.gram_codes, level.gram_counts, context_codes * self.vocab_size + targets)
    total = _lookup(level.context_codes, level.context_totals, context_codes)
    seen = total > 0
    safe_total = np.where(seen, total, 1.0)
    if self.smoothing == 'add_k':
      k = self.add_k
      return np.where(seen, (gram_count + k) / (safe_total + k * self.vocab_size), 1.0 / self.vocab_size)
    types = _lookup(level.context_codes, level.context_types, context_codes)
    discount = level.discount
    interpolated = (np.maximum(gram_count - discount, 0) + discount * types * lower) / safe_total
    return np.where(seen, interpolated, lower)

  def log_prob(self, history_BxH: np.ndarray, targets_B: np.ndarray) -> np.ndarray:
    """log P(target | history) per row, in nats.

    `history_BxH` holds each target's preceding ids, most recent last; its
    last min(H, n − 1) columns are used, and entries of −1 mark positions
    before the start of the text (they must come before every real token), as
    do the columns a history of H < n − 1 lacks. Targets must be ids in [0, V).
    """
    history_BxH = np.asarray(history_BxH, np.int64)
    targets_B = np.asarray(targets_B, np.int64)
    # Ids outside [0, V) would be coded as other m-grams' digits and given a probability.
    outside = (targets_B < 0) | (targets_B >= self.vocab_size)
    if outside.any():
      raise ValueError(f'A target id {targets_B[outside][0]} is outside [0, {self.vocab_size}).')
    outside = (history_BxH < -1) | (history_BxH >= self.vocab_size)
    if outside.any():
      raise ValueError(f'A history entry {history_BxH[outside][0]} is neither an id in '
                       f'[0, {self.vocab_size}) nor -1 (before the text).')
    batch, width = len(targets_B), self.order - 1
    # Left-padded with −1 to n − 1 columns, so every level below can index its token.
    kept = min(history_BxH.shape[1], width)
    history_BxK = np.concatenate([np.full((batch, width - kept), -1, np.int64),
                                  history_BxH[:, history_BxH.shape[1] - kept:]], axis=1)
    # The available context is the run of real tokens at the end of the history.
    real_BxK = history_BxK >= 0
    reversed_real = real_BxK[:, ::-1]
    available_B = (np.where(reversed_real.all(axis=1), width, reversed_real.argmin(axis=1))
                   if width else np.zeros(batch, np.int64))
    top_level_B = np.minimum(available_B, self.order - 1) + 1
    history_BxK = np.where(real_BxK, history_BxK, 0)

    probability_B = np.zeros(batch)
    lower_B = np.full(batch, 1.0 / self.vocab_size)
    context_B = np.zeros(batch, np.int64)
    for m in range(1, self.order + 1):
      if m > 1:  # add the token m − 1 places back as the most significant digit
        context_B = context_B + history_BxK[:, width - (m - 1)] * self.vocab_size ** (m - 2)
      at_top = top_level_B == m
      probability_B[at_top] = self._smoothed(self._raw[m - 1], context_B[at_top], targets_B[at_top],
                                             lower_B[at_top])
      if m < self.order and self.smoothing == 'kneser_ney':
        lower_B = self._smoothed(self._continuation[m - 1], context_B, targets_B, lower_B)
    with np.errstate(divide='ignore'):  # add-0 gives unseen m-grams probability 0
      return np.log(probability_B)

  def probabilities(self, history_BxH: np.ndarray) -> np.ndarray:
    """P(w | history) for every id w: [B, V]."""
    history_BxH = np.asarray(history_BxH, np.int64)
    batch, vocab = len(history_BxH), self.vocab_size
    targets = np.tile(np.arange(vocab), batch)
    log_p = self.log_prob(np.repeat(history_BxH, vocab, axis=0), targets)
    return np.exp(log_p).reshape(batch, vocab)

  def window_log_probs(self, tokens_BxL1: np.ndarray) -> np.ndarray:
    """log P(tokens[:, j + 1] | tokens[:, :j + 1]) for each window and j < L: [B, L].

    Each target sees only the tokens of its own window, as a model of window
    length L does.
    """
    tokens_BxL1 = np.asarray(tokens_BxL1, np.int64)
    batch, length = tokens_BxL1.shape[0], tokens_BxL1.shape[1] - 1
    width = self.order - 1
    padded = np.concatenate([np.full((batch, width), -1), tokens_BxL1[:, :-1]], axis=1)
    # History of target j: the `width` inputs ending at input j.
    history_BxLxK = np.lib.stride_tricks.sliding_window_view(padded, width, axis=1)[:, 1:length + 1]
    log_p = self.log_prob(history_BxLxK.reshape(batch * length, width),
                          tokens_BxL1[:, 1:].reshape(-1))
    return log_p.reshape(batch, length)

  def sample(self, prompt: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    """`length` ids drawn one at a time from P(w | the last n − 1 ids so far)."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
      raise ValueError(f'length={length!r} is not a number of ids to draw; give an integer >= 0.')
    ids = [int(i) for i in prompt]
    width = self.order - 1
    for _ in range(length):
      history = np.full((1, width), -1)
      recent = ids[max(0, len(ids) - width):] if width else []
      if recent:
        history[0, width - len(recent):] = recent
      probabilities = self.probabilities(history)[0]
      ids.append(int(rng.choice(self.vocab_size, p=probabilities / probabilities.sum())))
    return np.array(ids[len(prompt):], np.int64)
