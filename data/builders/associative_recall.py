"""Associative recall: key–value pairs, then a query key whose value is the answer.

A synthetic long-context task (associative retrieval, Ba et al. 2016; the
single-query case of Arora et al. 2024, "Zoology"), generated here, the same on
every machine and every run. An example of length T (the model's context;
T + 1 tokens) holds K = (T − 2) / 2 pairs, a query marker, a query key and its
value:

  k_{a_0} v_{b_0} k_{a_1} v_{b_1} … k_{a_{K−1}} v_{b_{K−1}} ? k_{a_q} v_{b_q}

written 'k1771 v7 k30 v51 … ? k30 v51' by `Tokenizer`. The vocabulary is
2,048 keys k0 … k2047 (ids 0 … 2047), 64 values v0 … v63 (ids 2048 … 2111) and
the marker '?' (id 2112): 2,113 tokens. The K keys of an example are distinct,
the values drawn with repetition, and the query is pair q, uniform over
0 … K − 1. A language model reading tokens[:-1] scores one target only, the last
token: 'weights' is 1 at target T − 1 (the prediction made at the query key)
and 0 elsewhere, so the language_model task's `accuracy` is the recall accuracy
(chance 1/64).

Length: T = 2K + 2 for K = 1 … 2,048, any even T from 4 to 4,098, chosen by
the builder's `length` (`data.load('associative_recall', split, length=64)`;
default 2,048, K = 1,023); each length is its own configuration, prepared in
`jaxlab_associative_recall/length_<T>/`.

Distance: the value to recall sits d = 2(K − q) positions before the query key,
d ∈ {2, 4, …, 2K}, each with probability 1/K. At T = 2,048: mean 1,024, and
P(d ≤ 128) = 64/1,023 ≈ 6.3%, P(d ≤ 256) ≈ 12.5%, P(d > 1,024) ≈ 50%: an
attention layer that sees only the last w positions has the answer in view in
⌊w/2⌋/K of the examples (stacked layers widen that reach). At T = 64 (K = 31),
d ≤ 62.

Draws: draw i of split s reads 4·2,048 + K + 8 bytes of SHAKE-256 of
'SEED:s:i' (SEED = 0, FIPS 202; `hashlib.shake_256`), so it depends on no
library's random generator (NumPy's, for one, may change its streams between
versions) and any draw can be made alone. Bytes 4j … 4j + 3, big-endian, are
key j's sort number; the example's keys are the K keys with the smallest sort
numbers, in increasing order of them (equal numbers, which are rare, in key
order). The next K bytes, modulo 64, are the values. The last 8 bytes,
big-endian, modulo K, are q (bias below K / 2⁶⁴).

Splits: train 20,000 / validation 500 / test 1,000 records at every length.
Validation is drawn first, then test, then train, each from its own stream of
draws; a draw whose tokens equal those of a validation or test record already
kept is skipped, so the held-out records are distinct and never in train. At
T = 4 there are only 2,048 · 64 = 131,072 different examples, so draws repeat
(and train repeats some of its own); from T = 6 on, practically never.

Records: 'tokens' int16 (T + 1,); 'weights' uint8 (T,), one-hot at T − 1;
'distance' int32, d above.
"""

import hashlib

import numpy as np
import tensorflow_datasets as tfds

SEED = 0
SPLIT_SIZES = {'train': 20_000, 'validation': 500, 'test': 1_000}
# Held-out splits are drawn first so that train can avoid their records.
DRAW_ORDER = ('validation', 'test', 'train')

NUM_KEYS = 2048
KEY_BITS = 11  # NUM_KEYS = 2**KEY_BITS
NUM_VALUES = 64
FIRST_VALUE = NUM_KEYS
MARKER = NUM_KEYS + NUM_VALUES
VOCAB_SIZE = MARKER + 1
DEFAULT_LENGTH = 2048
# T = 2K + 2 with 1 <= K <= NUM_KEYS.
LENGTHS = tuple(range(4, 2 * NUM_KEYS + 3, 2))


def check_length(length) -> int:
  """`length` (T) if an example can have it, else ValueError in one sentence."""
  if (not isinstance(length, int) or isinstance(length, bool) or length % 2 or
      not LENGTHS[0] <= length <= LENGTHS[-1]):
    raise ValueError(f'The associative-recall length must be an even integer from {LENGTHS[0]} '
                     f'to {LENGTHS[-1]} (T = 2K + 2 tokens of context for K = 1 to {NUM_KEYS} '
                     f'key-value pairs), not {length!r}.')
  return length


def num_pairs(length: int) -> int:
  """K, the key–value pairs of an example of length T = 2K + 2."""
  return (check_length(length) - 2) // 2


class Tokenizer:
  """Token ids ↔ the readable form 'k12 v7 … ? k12 v7' (one word per token)."""

  def __init__(self):
    self.vocab = ([f'k{i}' for i in range(NUM_KEYS)] + [f'v{i}' for i in range(NUM_VALUES)] +
                  ['?'])
    self._ids = {word: index for index, word in enumerate(self.vocab)}

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def encode(self, text: str) -> list[int]:
    words = text.split()
    if not words:
      raise ValueError(f'{text!r} holds no associative-recall token (k0 to k{NUM_KEYS - 1}, '
                       f'v0 to v{NUM_VALUES - 1} or ?).')
    unknown = [word for word in words if word not in self._ids]
    if unknown:
      raise ValueError(f'{unknown[0]!r} is not an associative-recall token; the tokens are k0 to '
                       f'k{NUM_KEYS - 1}, v0 to v{NUM_VALUES - 1} and ?.')
    return [self._ids[word] for word in words]

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    outside = [i for i in ids if not 0 <= i < self.vocab_size]
    if outside:
      raise ValueError(f'Token id {outside[0]} is not in [0, {self.vocab_size}).')
    return ' '.join(self.vocab[i] for i in ids)


class AssociativeRecall(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Record `i` of a split is row `i` of `generate(length)[split]`."""

  name = 'jaxlab_associative_recall'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = tuple(SPLIT_SIZES)
  # Keyword arguments `data.load` passes on (see data/datasets.py).
  OPTIONS = ('length',)
  # One configuration per length, so no length is a "custom" one TFDS warns about.
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=f'length_{t}') for t in LENGTHS]

  def __init__(self, *, length: int = DEFAULT_LENGTH, **kwargs):
    self.length = check_length(length)
    super().__init__(config=f'length_{length}', **kwargs)

  @property
  def tokenizer(self) -> Tokenizer:
    return Tokenizer()

  def _info(self) -> tfds.core.DatasetInfo:
    length = self.length
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            # Stored as raw bytes: TFDS would otherwise write each token as an int64.
            'tokens': tfds.features.Tensor(shape=(length + 1,), dtype=np.int16, encoding='bytes'),
            'weights': tfds.features.Tensor(shape=(length,), dtype=np.uint8, encoding='bytes'),
            'distance': tfds.features.Tensor(shape=(), dtype=np.int32),
        }),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    tokens = generate(self.length)
    return {split: self._generate_examples(tokens[split]) for split in self.SPLITS}

  def _generate_examples(self, tokens_NxL1):
    weights_T = np.zeros(self.length, np.uint8)
    weights_T[-1] = 1
    for i, tokens in enumerate(tokens_NxL1):
      yield i, {'tokens': tokens, 'weights': weights_T, 'distance': np.int32(distance(tokens))}


def draw(split: str, index: int, length: int) -> np.ndarray:
  """The T + 1 tokens (int16) of draw `index` of `split`'s stream (see the module docstring)."""
  pairs = num_pairs(length)
  stream = hashlib.shake_256(f'{SEED}:{split}:{index}'.encode('ascii')).digest(
      4 * NUM_KEYS + pairs + 8)
  # Sort number and key index in one integer: distinct, so the K smallest are unambiguous.
  numbers = (np.frombuffer(stream, '>u4', NUM_KEYS).astype(np.uint64) << np.uint64(KEY_BITS) |
             np.arange(NUM_KEYS, dtype=np.uint64))
  smallest = np.sort(np.partition(numbers, pairs - 1)[:pairs])
  keys = (smallest & np.uint64(NUM_KEYS - 1)).astype(np.int16)
  values = np.frombuffer(stream, np.uint8, pairs, 4 * NUM_KEYS).astype(np.int16) % NUM_VALUES
  query = int.from_bytes(stream[-8:], 'big') % pairs
  tokens = np.empty(2 * pairs + 3, np.int16)
  tokens[0:2 * pairs:2] = keys
  tokens[1:2 * pairs:2] = FIRST_VALUE + values
  tokens[-3:] = MARKER, keys[query], FIRST_VALUE + values[query]
  return tokens


def distance(tokens: np.ndarray) -> int:
  """How many positions before the query key (tokens[-2]) its value sits in the pairs."""
  pairs = (len(tokens) - 3) // 2
  q = int(np.flatnonzero(tokens[0:2 * pairs:2] == tokens[-2])[0])
  return 2 * (pairs - q)


def generate(length: int = DEFAULT_LENGTH) -> dict[str, np.ndarray]:
  """split -> the tokens of its records, int16 [N, T + 1] (see the module docstring)."""
  check_length(length)
  held_out, records = set(), {}
  for split in DRAW_ORDER:
    rows, index = [], 0
    while len(rows) < SPLIT_SIZES[split]:
      tokens = draw(split, index, length)
      index += 1
      if tokens.tobytes() in held_out:
        continue
      if split != 'train':
        held_out.add(tokens.tobytes())
      rows.append(tokens)
    records[split] = np.stack(rows)
  return records
