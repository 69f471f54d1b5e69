"""Random-access windows of tokens over any text data set, for language modelling.

A split's text (`read_text`) is tokenized once into one stream x_0 … x_{n−1}.
A language model of context T predicts x_{t+1} from x_{o..t} within a window
that starts at offset o; a window record holds the T + 1 tokens x_{o..o+T}
(inputs are its first T, targets its last T) and one weight per target.

  training   every offset o = 0 … n − T − 1, so each epoch of the pipeline's
             seeded permutation sees every position of the text as a target at
             every depth of context it can have;
  evaluation offsets o = 0, T, 2T, … < n, so each target x_1 … x_{n−1} is scored
             exactly once and each token x_0 … x_{n−1} is among the first T of
             one window (a masked language model's text); the last window is
             padded with id 0 and weight 0 (when n − 1 is a multiple of T it
             holds x_{n−1} alone, and no target).

The tokenizer is trained on the train split only and kept in the run's workdir
(`tokenizer.json`) so a resumed run and its samplers encode text identically.

A data set whose records are windows already ('tokens' [T + 1] and 'weights'
[T] each, e.g. the generated associative_recall) takes tokenizer='dataset':
its records are the windows, its builder's `tokenizer` names the ids, and
every token is one unit (bits per token).
"""

import os

import numpy as np

from data import datasets
from data import pipeline
from data import tokenizers

TOKENIZER_KINDS = ('char', 'byte_bpe')
# The tokenizer of a data set of token records, given by its builder.
DATASET_TOKENIZER = 'dataset'
TOKENIZER_FILE = 'tokenizer.json'
PAD_ID = 0


def read_text(name: str, split: str, *, data_dir=None, text_key: str = 'text', **options) -> str:
  """The `text_key` of every record of `data.load(name, split)`, joined by newlines.

  The feature must hold text (str, or UTF-8 bytes as TFDS gives it): any other value (a
  number, an array of ids) is refused rather than read as its printed form.
  """
  source = datasets.load(name, split, data_dir=data_dir, **options)
  pieces = []
  for index in range(len(source)):
    record = source[index]
    if text_key not in record:
      raise ValueError(f'Data set {name!r} has no text feature {text_key!r}; its features are: '
                       f'{", ".join(sorted(record))}.')
    value = record[text_key]
    if isinstance(value, bytes):
      try:
        value = value.decode('utf-8')
      except UnicodeDecodeError as error:
        raise ValueError(f'Record {index} of split {split!r} of data set {name!r} holds '
                         f'{text_key!r} bytes that are not UTF-8 (an invalid byte at offset '
                         f'{error.start}).') from None
    elif not isinstance(value, str):
      texts = sorted(key for key, item in record.items() if isinstance(item, (str, bytes)))
      allowed = f'its text features are: {", ".join(texts)}' if texts else 'it has no text feature'
      raise ValueError(f'Feature {text_key!r} of data set {name!r} holds {type(value).__name__} '
                       f'values, not text; {allowed}.')
    pieces.append(value)
  return '\n'.join(pieces)


def _check_tokenizer_options(kind: str, vocab_size) -> None:
  if kind not in TOKENIZER_KINDS:
    raise ValueError(f'Unknown tokenizer {kind!r}; the tokenizers are: {", ".join(TOKENIZER_KINDS)}.')
  if kind == 'char' and vocab_size is not None:
    raise ValueError(f'A char tokenizer takes its vocabulary from the text, so vocab_size must be '
                     f'None, not {vocab_size!r}.')
  if kind == 'byte_bpe' and (not isinstance(vocab_size, int) or vocab_size < 256):
    raise ValueError(f'A byte_bpe tokenizer needs an integer vocab_size of at least 256 (its byte '
                     f'alphabet), not {vocab_size!r}.')


def make_tokenizer(kind: str, train_text: str, *, vocab_size: int | None = None):
  """A 'char' or 'byte_bpe' tokenizer learnt from `train_text`.

  A BPE tokenizer has exactly `vocab_size` tokens: if the text runs out of
  pairs to merge first, that is an error, so the model's output size is always
  the configured one.
  """
  _check_tokenizer_options(kind, vocab_size)
  if kind == 'char':
    return tokenizers.CharTokenizer.from_corpus(train_text)
  tokenizer = tokenizers.ByteBPETokenizer.train(train_text, vocab_size)
  if tokenizer.vocab_size != vocab_size:
    raise ValueError(f'The train text has only enough distinct pairs for a byte_bpe vocabulary of '
                     f'{tokenizer.vocab_size} tokens, fewer than vocab_size={vocab_size}.')
  return tokenizer


def _describe(tokenizer) -> str:
  kind = 'char' if isinstance(tokenizer, tokenizers.CharTokenizer) else 'byte_bpe'
  return f'a {kind} tokenizer of {tokenizer.vocab_size} tokens'


def load_or_train_tokenizer(path: str, kind: str, train_text: str, *, vocab_size=None,
                            save: bool = True):
  """The tokenizer saved at `path`, or one trained on `train_text` (and saved there if `save`).

  A saved tokenizer of another kind or size, or one whose file records (as
  "train_sha256") that it was learnt on a text other than `train_text`, is
  refused and left as it is: it belongs to an earlier run whose checkpoints
  depend on it. A file without that record loads whatever `train_text` is.
  The new file is written beside `path` and renamed into place, so a crash
  mid-write leaves no file that a later run would load. Missing folders on the way to `path`
  are made; a file standing where one goes is refused before any training.
  """
  _check_tokenizer_options(kind, vocab_size)
  if os.path.exists(path):
    tokenizer = tokenizers.load(path)
    expected = tokenizers.CharTokenizer if kind == 'char' else tokenizers.ByteBPETokenizer
    if not isinstance(tokenizer, expected) or (vocab_size is not None and
                                               tokenizer.vocab_size != vocab_size):
      asked = kind if vocab_size is None else f'{kind} with vocab_size={vocab_size}'
      raise ValueError(f'Tokenizer file {path!r} holds {_describe(tokenizer)} but the config asks '
                       f'for {asked}; use another workdir or delete the file to retrain.')
    if (tokenizer.train_sha256 is not None and
        tokenizer.train_sha256 != tokenizers.text_sha256(train_text)):
      raise ValueError(f'Tokenizer file {path!r} was trained on other text than the configured '
                       'train split; use another workdir or delete the file to retrain.')
    return tokenizer
  if save:
    # Refused before training: the nearest existing folder on the way to `path` must be one.
    blocking = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(blocking) and os.path.dirname(blocking) != blocking:
      blocking = os.path.dirname(blocking)
    if not os.path.isdir(blocking):
      raise ValueError(f'Tokenizer file {path!r} cannot be saved, as {blocking!r} is a file where '
                       'a folder must be.')
  tokenizer = make_tokenizer(kind, train_text, vocab_size=vocab_size)
  if not save:
    return tokenizer
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tokenizer.save(path)  # written beside `path` and renamed into place
  return tokenizer


def token_units(tokenizer) -> tuple[np.ndarray, str]:
  """Characters (char tokenizer) or UTF-8 bytes (byte BPE) each token id spells, and the unit.

  Byte tokens are written in GPT-2's byte-to-unicode alphabet, one character
  per byte, so in both cases a token's unit count is the length of its string.
  """
  units = np.array([len(token) for token in tokenizer.vocab], np.float32)
  return units, 'char' if isinstance(tokenizer, tokenizers.CharTokenizer) else 'byte'


class TokenWindows:
  """Windows of `length` + 1 tokens over one token stream, as a random-access source.

  Record i is {'tokens': int32[length + 1], 'weights': float32[length]}, the
  window at offset i (training) or i · length (evaluation); see the module
  docstring. `tokens` is the whole stream.
  """

  def __init__(self, tokens: np.ndarray, length: int, *, training: bool):
    self.tokens = np.asarray(tokens, np.int32)
    self.length = int(length)
    self.training = training
    n = len(self.tokens)
    if self.length < 1:
      raise ValueError(f'The window length must be a positive integer, not {length!r}.')
    # Evaluation pads its last window, so two tokens (one target) suffice there.
    needed = self.length + 1 if training else 2
    if n < needed:
      kind = 'training' if training else 'evaluation'
      raise ValueError(f'A text of {n} tokens is too short for one {kind} window of length '
                       f'{self.length}; it needs at least {needed} tokens.')
    self._stride = 1 if training else self.length
    self._len = n - self.length if training else -(-n // self.length)
    # Padding after the text lets every window be one slice of the same array.
    self._padded = np.concatenate([self.tokens, np.full(self.length, PAD_ID, np.int32)])
    self._window = np.arange(self.length + 1)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> dict:
    if not -self._len <= index < self._len:
      raise IndexError(f'Window {index} is out of range for {self._len} windows.')
    batch = self.gather(np.array([index % self._len]))
    return {key: value[0] for key, value in batch.items()}

  def gather(self, indices: np.ndarray) -> dict:
    """The windows `indices` stacked: 'tokens' int32 [B, length + 1], 'weights' float32 [B, length]."""
    indices = np.asarray(indices, np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= self._len):
      raise IndexError(f'Window indices must lie in [0, {self._len}).')
    positions_BxL1 = (indices * self._stride)[:, None] + self._window
    # Target j of a window is the token at position offset + 1 + j.
    weights_BxL = (positions_BxL1[:, 1:] < len(self.tokens)).astype(np.float32)
    return {'tokens': self._padded[positions_BxL1], 'weights': weights_BxL}


def _encode(tokenizer, text: str, name: str, split: str, origin: str) -> np.ndarray:
  """`text` encoded, or one sentence naming its first character outside a char tokenizer's
  vocabulary and where that vocabulary comes from (`origin`)."""
  if isinstance(tokenizer, tokenizers.CharTokenizer):
    missing = set(text) - set(tokenizer.vocab)
    if missing:
      character = min(missing, key=text.index)
      raise ValueError(f'The character {character!r} at position {text.index(character)} of split '
                       f'{split!r} of {name!r} is not in the {tokenizer.vocab_size}-character '
                       f'vocabulary {origin}.')
  return np.asarray(tokenizer.encode(text), np.int32)


def _check_long_enough(tokens: np.ndarray, window: int, name: str, split: str, *,
                       training: bool) -> None:
  """`TokenWindows`'s length check, in one sentence naming the split and data.window."""
  n = len(tokens)
  count = f'{n} token{"" if n == 1 else "s"}'
  if training and n < window + 1:
    fits = f'data.window must be at most {n - 1}' if n >= 2 else 'no data.window fits it'
    raise ValueError(f'Split {split!r} of {name!r} has {count}, fewer than the {window + 1} a '
                     f'training window of data.window={window} needs; {fits}.')
  if not training and n < 2:
    raise ValueError(f'Split {split!r} of {name!r} has {count}, fewer than the 2 (one input and '
                     'one target) an evaluation window needs at any data.window.')


def make_sources(data_config, workdir: str) -> tuple[TokenWindows, TokenWindows, dict]:
  """Training and evaluation windows of a text data set, and what the model needs to know.

  Args:
    data_config: `name`, `train_split`, `eval_split`, `data_dir` (or None),
      `options` (for `data.load`, e.g. source_dir), `text_key`, `tokenizer`
      ('char' or 'byte_bpe'; 'dataset' for token records, see the module
      docstring), `vocab_size` (None for char) and `window` (T).
    workdir: the run's folder, where the tokenizer is kept.

  Returns:
    (train windows, eval windows, meta) with meta holding 'vocab_size',
    'tokenizer', 'token_units' (float32 [V], see `token_units`), 'unit',
    'token_counts' (int64 [V], how often each id occurs in the train split's
    stream, for unigram baselines), 'window' and 'workdir_files'
    ({'tokenizer.json': save function}: the tokenizer is not written here, so a
    config that fails later writes nothing).
  """
  kind, vocab_size = data_config.tokenizer, data_config.get('vocab_size')
  if kind == DATASET_TOKENIZER:
    return _token_record_sources(data_config)
  if kind not in TOKENIZER_KINDS:
    raise ValueError(f'Unknown data.tokenizer {kind!r}; allowed: {", ".join(TOKENIZER_KINDS)} '
                     f'and {DATASET_TOKENIZER!r} (for a data set of token records).')
  _check_tokenizer_options(kind, vocab_size)
  window = data_config.window
  if not isinstance(window, int) or isinstance(window, bool) or window < 1:
    raise ValueError(f'data.window must be a positive integer, not {window!r}.')
  name = data_config.name
  read = lambda split: read_text(name, split, data_dir=data_config.get('data_dir'),
                                 text_key=data_config.get('text_key', 'text'),
                                 **dict(data_config.get('options') or {}))
  train_text, eval_text = read(data_config.train_split), read(data_config.eval_split)
  # Saved by the caller once the whole config is known to work (`meta['workdir_files']`).
  path = os.path.join(workdir, TOKENIZER_FILE)
  tokenizer = load_or_train_tokenizer(path, kind, train_text, vocab_size=vocab_size, save=False)
  # A tokenizer learnt here records its train text; one without that record is a file's.
  origin = ('learnt from the train split' if tokenizer.train_sha256 is not None else
            f'of tokenizer file {path!r}, which does not record the text it was learnt from')
  train_tokens = _encode(tokenizer, train_text, name, data_config.train_split, origin)
  eval_tokens = _encode(tokenizer, eval_text, name, data_config.eval_split, origin)
  _check_long_enough(train_tokens, window, name, data_config.train_split, training=True)
  _check_long_enough(eval_tokens, window, name, data_config.eval_split, training=False)
  units, unit = token_units(tokenizer)
  meta = {'vocab_size': tokenizer.vocab_size, 'tokenizer': tokenizer, 'token_units': units,
          'unit': unit, 'window': window, 'workdir_files': {TOKENIZER_FILE: tokenizer.save},
          'token_counts': np.bincount(train_tokens, minlength=tokenizer.vocab_size)}
  return (TokenWindows(train_tokens, window, training=True),
          TokenWindows(eval_tokens, window, training=False), meta)


def _token_record_sources(data_config) -> tuple[pipeline.InMemorySource, pipeline.InMemorySource,
                                                 dict]:
  """`make_sources` for tokenizer='dataset': the splits' records, held in memory, are the
  windows; meta as for text, with unit 'token' and no workdir file. Both splits' windows must
  have the train split's length and ids in the builder's tokenizer's vocabulary."""
  name, data_dir = data_config.name, data_config.get('data_dir')
  options = dict(data_config.get('options') or {})
  if data_config.get('vocab_size') is not None:
    raise ValueError(f"With tokenizer='dataset' the data set fixes the vocabulary, so "
                     f"data.vocab_size must be None, not {data_config.vocab_size!r}.")
  builder_options = {key: value for key, value in options.items() if key != 'source_dir'}
  tokenizer = getattr(datasets.make_builder(name, data_dir=data_dir, **builder_options),
                      'tokenizer', None)
  if tokenizer is None:
    raise ValueError(f"Data set {name!r} has no tokenizer of its own, so tokenizer='dataset' "
                     f"does not apply to it; use 'char' or 'byte_bpe' on its text.")
  sources = [pipeline.InMemorySource(datasets.load(name, split, data_dir=data_dir, **options))
             for split in (data_config.train_split, data_config.eval_split)]
  window = sources[0].arrays['tokens'].shape[1] - 1
  for split, source in zip((data_config.train_split, data_config.eval_split), sources):
    tokens = source.arrays['tokens']
    if tokens.shape[1] - 1 != window:
      raise ValueError(f'Split {split!r} of {name!r} holds windows of {tokens.shape[1] - 1} '
                       f"tokens, not the train split's {window}.")
    outside = tokens[(tokens < 0) | (tokens >= tokenizer.vocab_size)]
    if outside.size:
      raise ValueError(f'Split {split!r} of {name!r} holds token id {int(outside[0])}, outside the '
                       f"vocabulary of {tokenizer.vocab_size} its builder's tokenizer names.")
  given = data_config.get('window')
  if given is not None and (type(given) is not int or given != window):
    raise ValueError(f'The records of {name!r} are windows of {window} tokens, so data.window '
                     f'must be None or {window}, not {data_config.window!r}.')
  meta = {'vocab_size': tokenizer.vocab_size, 'tokenizer': tokenizer,
          'token_units': np.ones(tokenizer.vocab_size, np.float32), 'unit': 'token',
          'window': window, 'token_counts': np.bincount(sources[0].arrays['tokens'].ravel(),
                                                        minlength=tokenizer.vocab_size)}
  return sources[0], sources[1], meta
