"""Associative recall: key–value pairs scattered through a long context, then queries.

A synthetic long-context task generated here, the same on every machine and every run: it
asks whether a model can retrieve a token seen far back. Each key–value pair is ONE token,
as in the synthetic retrieval tasks of Ba et al. 2016 and Schlag et al. 2021 (§6.1), where
a key and its value arrive together; recalling a value is then one content-based lookup
(the query key against the pair tokens), which any attention layer can learn, so the task
separates attention kinds by what they can reach rather than by how hard it is to learn.
Several queries per example, as in Arora et al. 2024 ("Zoology", multi-query associative
recall), give many scored targets per example.

An example of length T (the model's context; T + 1 tokens) is

  f f k5:v2 f f f … k17:v0 f … f  ?  k17 v0  k5 v2  …  (16 queries)
  └──────────── n = T − 32 tokens ────────────┘

  * P = 16 pair tokens `k{a}:v{b}` (key a of 32, value b of 8) at 16 distinct positions of
    the first n = T − 2P tokens, the other n − P of them fillers `f0` … `f15`;
  * the marker `?`;
  * P queries: each key of the example once, as `k{a}`, followed by its value `v{b}`.

The prediction made at a query key is scored (weight 1); every other target has weight 0,
so the language_model task's `accuracy` is the recall accuracy (chance 1/8). A query's
distance is its position minus its pair's, from 2 to T − 1; the pairs are spread uniformly
over the first n positions, so at T = 2,048 the mean distance is about 1,025 and a layer that
sees only the last w positions reaches a query's pair in roughly w / n of the cases.

Vocabulary (313 tokens): pair k{a}:v{b} is id 8a + b (0 … 255); query key k{a} is
256 + a; value v{b} is 288 + b; filler f{c} is 296 + c; `?` is 312.

Length: T any power of two from 64 to 16,384, chosen by the builder's `length`
(`data.load('associative_recall', split, length=64)`; default 2,048); each length is its own
configuration, prepared in `jaxlab_associative_recall/length_<T>/`.

Draws: draw i of split s reads 4·32 + P + 4n + n + 4P bytes of SHAKE-256 of 'SEED:s:i'
(SEED = 0, FIPS 202; `hashlib.shake_256`), so it depends on no library's random generator
and any draw can be made alone. In that order, big-endian 4-byte "sort numbers" and single
bytes: 32 sort numbers for the keys (the example's keys are the P with the smallest numbers,
in increasing order of them: the order the pairs appear in); P bytes mod 8, the values of
those pairs in turn; n sort numbers for the positions (the pairs go, in order, to the P
positions with the smallest numbers, taken in increasing position); n bytes mod 16, the
filler at each position (pair positions ignore theirs); P sort numbers for the queries (pair
j is asked in the rank of its number). Ties between sort numbers, which are rare, go to the
lower index.

Splits: train 20,000 / validation 500 / test 1,000 records at every length. Validation is
drawn first, then test, then train, each from its own stream of draws; a draw equal to a
held-out record already kept is skipped, so held-out records never appear in train.

Records: 'tokens' int16 (T + 1,); 'weights' uint8 (T,), 1 at the P query keys; 'distance'
int32 (P,), each query's distance, in query order.
"""

import hashlib

import numpy as np
import tensorflow_datasets as tfds

SEED = 0
SPLIT_SIZES = {'train': 20_000, 'validation': 500, 'test': 1_000}
# Held-out splits are drawn first so that train can avoid their records.
DRAW_ORDER = ('validation', 'test', 'train')

NUM_KEYS = 32
NUM_VALUES = 8
NUM_FILLERS = 16
PAIRS = 16
FIRST_KEY = NUM_KEYS * NUM_VALUES
FIRST_VALUE = FIRST_KEY + NUM_KEYS
FIRST_FILLER = FIRST_VALUE + NUM_VALUES
MARKER = FIRST_FILLER + NUM_FILLERS
VOCAB_SIZE = MARKER + 1
DEFAULT_LENGTH = 2048
LENGTHS = tuple(2 ** i for i in range(6, 15))


def check_length(length) -> int:
  """`length` (T) if an example can have it, else ValueError in one sentence."""
  if (not isinstance(length, int) or isinstance(length, bool) or length not in LENGTHS):
    raise ValueError(f'The associative-recall length must be a power of two from {LENGTHS[0]} '
                     f'to {LENGTHS[-1]}, not {length!r}.')
  return length


class Tokenizer:
  """Token ids ↔ the readable form 'f3 k5:v2 … ? k5 v2 …' (one word per token)."""

  def __init__(self):
    self.vocab = ([f'k{a}:v{b}' for a in range(NUM_KEYS) for b in range(NUM_VALUES)] +
                  [f'k{a}' for a in range(NUM_KEYS)] + [f'v{b}' for b in range(NUM_VALUES)] +
                  [f'f{c}' for c in range(NUM_FILLERS)] + ['?'])
    self._ids = {word: index for index, word in enumerate(self.vocab)}

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def encode(self, text: str) -> list[int]:
    words = text.split()
    allowed = (f'k0:v0 to k{NUM_KEYS - 1}:v{NUM_VALUES - 1}, k0 to k{NUM_KEYS - 1}, '
               f'v0 to v{NUM_VALUES - 1}, f0 to f{NUM_FILLERS - 1} and ?')
    if not words:
      raise ValueError(f'{text!r} holds no associative-recall token ({allowed}).')
    unknown = [word for word in words if word not in self._ids]
    if unknown:
      raise ValueError(f'{unknown[0]!r} is not an associative-recall token; the tokens are '
                       f'{allowed}.')
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
  VERSION = tfds.core.Version('2.0.0')
  RELEASE_NOTES = {'2.0.0': 'One token per key–value pair, fillers, 16 queries per example.'}
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
            'distance': tfds.features.Tensor(shape=(PAIRS,), dtype=np.int32),
        }),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    tokens = generate(self.length)
    return {split: self._generate_examples(tokens[split]) for split in self.SPLITS}

  def _generate_examples(self, tokens_NxL1):
    weights_T = query_weights(self.length)
    for i, tokens in enumerate(tokens_NxL1):
      yield i, {'tokens': tokens, 'weights': weights_T, 'distance': distances(tokens)}


def query_weights(length: int) -> np.ndarray:
  """uint8 [T]: 1 at the predictions made at the query keys (targets = their values)."""
  weights_T = np.zeros(length, np.uint8)
  weights_T[length - 2 * PAIRS + 1::2] = 1
  return weights_T


def _smallest(sort_numbers: np.ndarray, count: int) -> np.ndarray:
  """Indices of the `count` smallest sort numbers, smallest first (ties: lower index)."""
  return np.argsort(sort_numbers, kind='stable')[:count]


def draw(split: str, index: int, length: int) -> np.ndarray:
  """The T + 1 tokens (int16) of draw `index` of `split`'s stream (see the module docstring)."""
  prefix = check_length(length) - 2 * PAIRS
  sizes = (4 * NUM_KEYS, PAIRS, 4 * prefix, prefix, 4 * PAIRS)
  stream = hashlib.shake_256(f'{SEED}:{split}:{index}'.encode('ascii')).digest(sum(sizes))
  parts, start = [], 0
  for size in sizes:
    parts.append(stream[start:start + size])
    start += size
  key_numbers, value_bytes, position_numbers, filler_bytes, query_numbers = parts
  keys = _smallest(np.frombuffer(key_numbers, '>u4'), PAIRS)
  values = np.frombuffer(value_bytes, np.uint8).astype(np.int64) % NUM_VALUES
  positions = np.sort(_smallest(np.frombuffer(position_numbers, '>u4'), PAIRS))
  tokens = np.empty(length + 1, np.int16)
  tokens[:prefix] = FIRST_FILLER + np.frombuffer(filler_bytes, np.uint8).astype(np.int64) % NUM_FILLERS
  tokens[positions] = keys * NUM_VALUES + values
  tokens[prefix] = MARKER
  order = np.argsort(np.argsort(np.frombuffer(query_numbers, '>u4'), kind='stable'),
                     kind='stable')  # pair j is asked in place order[j]
  tokens[prefix + 1 + 2 * order] = FIRST_KEY + keys
  tokens[prefix + 2 + 2 * order] = FIRST_VALUE + values
  return tokens


def distances(tokens: np.ndarray) -> np.ndarray:
  """int32 [P]: each query's position minus its pair token's, in query order."""
  prefix = len(tokens) - 1 - 2 * PAIRS
  pair_keys = {int(t) // NUM_VALUES: p for p, t in enumerate(tokens[:prefix]) if t < FIRST_KEY}
  query_positions = prefix + 1 + 2 * np.arange(PAIRS)
  return np.array([q - pair_keys[int(tokens[q]) - FIRST_KEY] for q in query_positions], np.int32)


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
