"""Character-level and byte-level BPE tokenizers (Gage 1994; Sennrich et al. 2016; Radford et al. 2019).

`CharTokenizer` is a character-level encoder: one id per character of its
corpus. `ByteBPETokenizer` is subword byte pair encoding (Sennrich et al. 2016)
as GPT-2 applies it: text is cut into pre-tokens by GPT-2's regular
expression (`GPT2_PATTERN`), each pre-token becomes its UTF-8 bytes (a base
vocabulary of 256), and merges of the most frequent adjacent pair are learnt on
top. `learn_bpe` is the merge learner shared by both BPE variants; `char_bpe`
runs it on plain characters, as Sennrich et al. (2016) do within words (without
their end-of-word symbol).

Merges are learnt over word types weighted by their counts, with pair counts
updated incrementally for the words a merge touches. Ties between equally
frequent pairs go to the smaller (left, right) pair in string order. Training
stops at the requested size or when no pair is left.

File format (`save`/`load`): one UTF-8 JSON object,

    {"format": "jaxlab-tokenizer", "version": 1, "type": "char",
     "vocab": ["\\n", " ", "!", ...]}

    {"format": "jaxlab-tokenizer", "version": 1, "type": "byte_bpe",
     "pattern": "<pre-tokenisation regex>",
     "vocab": ["Ā", "ā", ..., "!", "\\"", ..., "ÿ", "Ġt", "he", ...],
     "merges": [["Ġ", "t"], ["h", "e"], ...]}

A tokenizer learnt by `CharTokenizer.from_corpus` or `ByteBPETokenizer.train`
also writes "train_sha256": the hex SHA-256 of the UTF-8 text it learnt from
(`text_sha256`), so a caller can tell whether a saved tokenizer was learnt on
a given text. Files without it load with `train_sha256` None. `save` writes a new
file beside the path and renames it into place, so an interrupted save leaves the
previous file whole (or no file).

A token's id is its index in "vocab". Byte-level tokens are written in GPT-2's
byte-to-unicode alphabet (`byte_to_unicode`), where each byte is one printable
character: the first 256 vocab entries are the bytes 0..255 in order, and each
later entry is the concatenation of the parts of the first merge that made it.
"merges" is in the order learnt. Encoding applies them in that order to each
pre-token's bytes, each merge to all its non-overlapping occurrences from left
to right, which reproduces the segmentation training ended with.
"""

import collections
import hashlib
import heapq
import json
import numbers
import os
from typing import Hashable, Iterable, Mapping, NamedTuple, Sequence

import regex

FORMAT = 'jaxlab-tokenizer'
VERSION = 1

# GPT-2's pre-tokenisation: English contractions, letter runs, digit runs and
# runs of other symbols (each with at most one leading space), then whitespace.
# Every character falls in some alternative, so the pieces join back to the text.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def text_sha256(text: str) -> str:
  """The hex SHA-256 of `text` encoded as UTF-8 (a lone surrogate as its three bytes)."""
  return hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()


def compile_pattern(pattern: str):
  """`pattern` compiled for pre-tokenisation, or ValueError if it has capturing groups (with
  them, `findall` returns the groups instead of the pieces; `(?:...)` groups without capturing)."""
  compiled = regex.compile(pattern)
  if compiled.groups:
    raise ValueError(f'The pre-tokenisation pattern {pattern!r} has {compiled.groups} capturing '
                     'group(s); write its groups as (?:...) so each match is a whole piece.')
  return compiled


def pretokenize(compiled, text: str) -> list[str]:
  """The pieces of `text`, the matches of `compiled` in order, or ValueError unless they join
  back to the text (as GPT2_PATTERN's always do): a piece must hold every character, and the
  pieces must come in text order (a reverse `(?r)` search finds the last one first)."""
  pieces = compiled.findall(text)
  if ''.join(pieces) != text:
    if sum(map(len, pieces)) == len(text):  # matches never overlap: all covered, out of order
      raise ValueError(f'The pre-tokenisation pattern {compiled.pattern!r} finds its pieces out '
                       'of text order, so they do not join back to the text; its pieces must '
                       'cover the text from left to right.')
    position = 0
    for start, end in sorted(match.span() for match in compiled.finditer(text)):
      if start != position:
        break
      position = end
    raise ValueError(f'The pre-tokenisation pattern {compiled.pattern!r} matches no piece holding '
                     f'the character {text[position]!r} at position {position}; its pieces must '
                     'cover the text.')
  return pieces


def byte_to_unicode() -> list[str]:
  """GPT-2's printable stand-in for each byte value 0..255.

  Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves;
  the other 68 get code points 256, 257, ... in byte order.
  """
  printable = set(range(ord('!'), ord('~') + 1)) | set(range(ord('¡'), ord('¬') + 1)) | set(
      range(ord('®'), ord('ÿ') + 1))
  alphabet, extra = [], 0
  for byte in range(256):
    if byte in printable:
      alphabet.append(chr(byte))
    else:
      alphabet.append(chr(256 + extra))
      extra += 1
  return alphabet


# Merge learning.


class BPE(NamedTuple):
  """Result of `learn_bpe`: the vocabulary, the merges and each word's final segmentation."""
  vocab: list
  merges: list[tuple]
  segments: dict


def count_pairs(segments: Mapping[Sequence, int]) -> collections.Counter:
  """Frequency of each adjacent symbol pair over segmented words with counts."""
  counts = collections.Counter()
  for symbols, count in segments.items():
    for pair in zip(symbols, symbols[1:]):
      counts[pair] += count
  return counts


def _merge_pair(word: list[int], left: int, right: int, merged: int) -> list[int]:
  """Replaces each non-overlapping (left, right), scanning left to right."""
  out, i, n = [], 0, len(word)
  while i < n:
    if i + 1 < n and word[i] == left and word[i + 1] == right:
      out.append(merged)
      i += 2
    else:
      out.append(word[i])
      i += 1
  return out


def learn_bpe(word_counts: Mapping[Sequence[Hashable], int], base_vocab: Sequence, *,
              vocab_size: int | None = None, num_merges: int | None = None) -> BPE:
  """Learns BPE merges over words given as symbol sequences with counts.

  Args:
    word_counts: each word (a sequence of str or bytes symbols) and its count.
    base_vocab: the initial symbols; every word symbol must be among them.
    vocab_size: stop once the vocabulary has this many symbols.
    num_merges: stop after this many merges.

  Returns:
    The vocabulary (base, then new symbols in order of creation), the merges in
    order, and each word's segmentation after the last merge.
  """
  if vocab_size is None and num_merges is None:
    raise ValueError('learn_bpe needs vocab_size or num_merges to know when to stop.')
  vocab = list(base_vocab)
  ids = {symbol: index for index, symbol in enumerate(vocab)}
  if len(ids) != len(vocab):
    raise ValueError('The base vocabulary has repeated symbols.')
  if vocab_size is not None and vocab_size < len(vocab):
    raise ValueError(f'vocab_size={vocab_size} is smaller than the base vocabulary of '
                     f'{len(vocab)} symbols; it must be at least that.')
  keys, words, counts = list(word_counts), [], []
  for key in keys:
    try:
      words.append([ids[symbol] for symbol in key])
    except KeyError as error:
      raise ValueError(f'Word {key!r} has symbol {error.args[0]!r} outside the base '
                       'vocabulary.') from None
    counts.append(word_counts[key])

  pair_counts = collections.defaultdict(int)
  where = collections.defaultdict(set)
  for index, (word, count) in enumerate(zip(words, counts)):
    for pair in zip(word, word[1:]):
      pair_counts[pair] += count
      where[pair].add(index)
  # A max-heap by count, then smallest strings; outdated entries are skipped on pop.
  heap = [(-count, vocab[a], vocab[b], a, b) for (a, b), count in pair_counts.items()]
  heapq.heapify(heap)

  merges = []
  while heap:
    if num_merges is not None and len(merges) >= num_merges:
      break
    if vocab_size is not None and len(vocab) >= vocab_size:
      break
    negative_count, _, _, left, right = heapq.heappop(heap)
    if pair_counts.get((left, right)) != -negative_count:
      continue
    symbol = vocab[left] + vocab[right]
    if symbol not in ids:
      ids[symbol] = len(vocab)
      vocab.append(symbol)
    merged = ids[symbol]
    merges.append((vocab[left], vocab[right]))
    touched = set()
    for index in where.pop((left, right)):
      word, count = words[index], counts[index]
      new_word = _merge_pair(word, left, right, merged)
      if len(new_word) == len(word):
        continue
      for pair in zip(word, word[1:]):
        pair_counts[pair] -= count
        touched.add(pair)
      for pair in zip(new_word, new_word[1:]):
        pair_counts[pair] += count
        where[pair].add(index)
        touched.add(pair)
      words[index] = new_word
    for pair in touched:
      count = pair_counts[pair]
      if count > 0:
        heapq.heappush(heap, (-count, vocab[pair[0]], vocab[pair[1]], pair[0], pair[1]))
      else:
        del pair_counts[pair]
  segments = {key: tuple(vocab[i] for i in word) for key, word in zip(keys, words)}
  return BPE(vocab, merges, segments)


def char_bpe(word_counts: Mapping[str, int], num_merges: int) -> BPE:
  """BPE on plain characters: base vocabulary = the characters of the words."""
  base_vocab = sorted({character for word in word_counts for character in word})
  return learn_bpe(word_counts, base_vocab, num_merges=num_merges)


# File input and output.


def _invalid(path, reason: str) -> ValueError:
  return ValueError(f'Tokenizer file {os.fspath(path)!r} is invalid: {reason}.')


def _write(path, payload: dict, train_sha256: str | None) -> None:
  """Writes a new file beside `path` and renames it into place, so an interrupted save
  leaves `path` as it was (absent, or the previous whole file)."""
  if train_sha256 is not None:
    payload = {**payload, 'train_sha256': train_sha256}
  path = os.fspath(path)
  temporary = f'{path}.{os.getpid()}.tmp'
  try:
    # A surrogate character (which a str may hold, e.g. in a character vocabulary) has no
    # UTF-8 bytes: it is written as its JSON escape \uXXXX, which `json.load` reads back.
    with open(temporary, 'w', encoding='utf-8', errors='backslashreplace') as f:
      json.dump({'format': FORMAT, 'version': VERSION, **payload}, f, ensure_ascii=False,
                indent=1)
      f.write('\n')
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise


def _read(path, expected_type: str | None = None) -> dict:
  try:
    with open(path, encoding='utf-8') as f:
      payload = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise _invalid(path, f'it is not UTF-8 JSON ({error})') from None
  except RecursionError:
    raise _invalid(path, 'it nests deeper than any tokenizer file') from None
  except IsADirectoryError:
    raise _invalid(path, 'it is a folder, not a file') from None
  if not isinstance(payload, dict) or payload.get('format') != FORMAT:
    found = payload.get('format') if isinstance(payload, dict) else type(payload).__name__
    raise _invalid(path, f'its format is {found!r}, not {FORMAT!r}')
  if payload.get('version') != VERSION:
    raise _invalid(path, f'its version is {payload.get("version")!r}; only {VERSION} is read')
  kind = payload.get('type')
  if kind not in _TYPES or (expected_type is not None and kind != expected_type):
    allowed = expected_type or ', '.join(_TYPES)
    raise _invalid(path, f'its type is {kind!r}; expected {allowed}')
  vocab = payload.get('vocab')
  if (not isinstance(vocab, list) or not all(isinstance(t, str) and t for t in vocab)
      or len(set(vocab)) != len(vocab)):
    raise _invalid(path, '"vocab" must be a list of distinct non-empty strings')
  digest = payload.get('train_sha256')
  if digest is not None and not (isinstance(digest, str) and len(digest) == 64 and
                                 all(c in '0123456789abcdef' for c in digest)):
    raise _invalid(path, '"train_sha256" must be 64 lowercase hex digits')
  return payload


def load(path) -> 'CharTokenizer | ByteBPETokenizer':
  """Loads whichever tokenizer `path` holds."""
  return _TYPES[_read(path)['type']].load(path)


# Tokenizers.


def _check_text(text, what: str) -> None:
  """One sentence for text that is not a str, e.g. the UTF-8 bytes `data.load` returns."""
  if not isinstance(text, str):
    hint = (" (data sets return text as UTF-8 bytes: decode it with .decode('utf-8'))"
            if isinstance(text, (bytes, bytearray)) else '')
    raise TypeError(f'{what} takes text as a str, got {type(text).__name__}{hint}.')


def _surrogate_error(text: str, what: str) -> ValueError:
  """One sentence for text that UTF-8 cannot encode: a str holding a surrogate code point, as
  text decoded with errors='surrogateescape' (e.g. a command-line argument) holds for each
  byte that was not UTF-8."""
  position = next(i for i, character in enumerate(text) if '\ud800' <= character <= '\udfff')
  return ValueError(f'{what} cannot encode the character {text[position]!r} at position '
                    f'{position}: a surrogate code point has no UTF-8 bytes.')


def _check_ids(ids: Iterable[int], vocab_size: int) -> list[int]:
  """`ids` as Python ints; any integer type (Python's or NumPy's, e.g. a row of an id array)."""
  ids = list(ids)
  for position, token in enumerate(ids):
    integral = isinstance(token, numbers.Integral) and not isinstance(token, bool)
    if not integral or not 0 <= token < vocab_size:
      shown = int(token) if integral else repr(token)
      raise ValueError(f'Token {shown} at position {position} is not an id in [0, {vocab_size}).')
  return [int(token) for token in ids]


class CharTokenizer:
  """One id per character, ids in code-point order of the corpus's characters.

  `train_sha256` is the `text_sha256` of the corpus it was made from, or None.
  """

  def __init__(self, vocab: Sequence[str], train_sha256: str | None = None):
    if not all(isinstance(c, str) and len(c) == 1 for c in vocab) or len(set(vocab)) != len(vocab):
      raise ValueError('A character vocabulary must be distinct single characters.')
    self.vocab = list(vocab)
    self.train_sha256 = train_sha256
    self._ids = {character: index for index, character in enumerate(self.vocab)}

  @classmethod
  def from_corpus(cls, text: str) -> 'CharTokenizer':
    _check_text(text, 'CharTokenizer.from_corpus')
    return cls(sorted(set(text)), text_sha256(text))

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def encode(self, text: str) -> list[int]:
    _check_text(text, 'CharTokenizer.encode')
    try:
      return [self._ids[character] for character in text]
    except KeyError as error:
      position = text.index(error.args[0])
      raise ValueError(f'Character {error.args[0]!r} at position {position} is not in the '
                       f'vocabulary of {self.vocab_size} characters.') from None

  def decode(self, ids: Iterable[int]) -> str:
    return ''.join(self.vocab[i] for i in _check_ids(ids, self.vocab_size))

  def save(self, path) -> None:
    _write(path, {'type': 'char', 'vocab': self.vocab}, self.train_sha256)

  @classmethod
  def load(cls, path) -> 'CharTokenizer':
    payload = _read(path, 'char')
    vocab = payload['vocab']
    if not all(len(c) == 1 for c in vocab):
      raise _invalid(path, 'a character vocabulary holds single characters')
    return cls(vocab, payload.get('train_sha256'))


class ByteBPETokenizer:
  """Byte-level BPE with GPT-2's byte alphabet and pre-tokenisation."""

  _CACHE_LIMIT = 1 << 17

  def __init__(self, merges: Sequence[tuple[str, str]], pattern: str = GPT2_PATTERN,
               train_sha256: str | None = None):
    """Builds the tokenizer from merges written in the `byte_to_unicode` alphabet.

    `pattern` cuts text into pre-tokens: it may not have capturing groups, and `train`
    and `encode` refuse a text its matches do not cover from left to right (`pretokenize`),
    so no character is dropped or moved. `train_sha256` is the `text_sha256` of the text the
    merges were learnt on, or None.
    """
    alphabet = byte_to_unicode()
    self.train_sha256 = train_sha256
    self.vocab = list(alphabet)
    self.merges = [tuple(m) for m in merges]
    self.pattern = pattern
    ids = {symbol: index for index, symbol in enumerate(self.vocab)}
    # (left id, right id) -> (merged id, ranks); a pair can recur once a later
    # merge rebuilds one of its tokens.
    self._ranks = {}
    for rank, (left, right) in enumerate(self.merges):
      if left not in ids or right not in ids:
        raise ValueError(f'Merge {rank} {(left, right)!r} uses a token not made by the bytes or an '
                         'earlier merge.')
      symbol = left + right
      if symbol not in ids:
        ids[symbol] = len(self.vocab)
        self.vocab.append(symbol)
      self._ranks.setdefault((ids[left], ids[right]), (ids[symbol], []))[1].append(rank)
    unicode_to_byte = {character: byte for byte, character in enumerate(alphabet)}
    self._token_bytes = [bytes(unicode_to_byte[c] for c in token) for token in self.vocab]
    self._regex = compile_pattern(pattern)
    self._cache = {}

  @classmethod
  def train(cls, text: str, vocab_size: int, pattern: str = GPT2_PATTERN) -> 'ByteBPETokenizer':
    """Learns merges on `text` until the vocabulary has `vocab_size` tokens (or no pair is left)."""
    _check_text(text, 'ByteBPETokenizer.train')
    if not isinstance(vocab_size, numbers.Integral) or isinstance(vocab_size, bool):
      raise ValueError(f'vocab_size must be an integer of at least 256, got {vocab_size!r}.')
    alphabet = byte_to_unicode()
    word_counts = collections.Counter(pretokenize(compile_pattern(pattern), text))
    symbol_counts = collections.Counter()
    try:
      for word, count in word_counts.items():
        symbol_counts[tuple(alphabet[b] for b in word.encode('utf-8'))] += count
    except UnicodeEncodeError:
      raise _surrogate_error(text, 'ByteBPETokenizer.train') from None
    return cls(learn_bpe(symbol_counts, alphabet, vocab_size=vocab_size).merges, pattern,
               text_sha256(text))

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def _encode_piece(self, piece: str) -> list[int]:
    word = list(piece.encode('utf-8'))
    last_rank = -1
    while len(word) > 1:
      # The next merge that training would apply to this word: the lowest rank
      # after the last one applied among the pairs present.
      best = None
      for pair in zip(word, word[1:]):
        entry = self._ranks.get(pair)
        if entry is None:
          continue
        rank = next((r for r in entry[1] if r > last_rank), None)
        if rank is not None and (best is None or rank < best[0]):
          best = (rank, entry[0], pair)
      if best is None:
        break
      last_rank, merged, (left, right) = best
      word = _merge_pair(word, left, right, merged)
    return word

  def encode(self, text: str) -> list[int]:
    _check_text(text, 'ByteBPETokenizer.encode')
    ids = []
    for piece in pretokenize(self._regex, text):
      piece_ids = self._cache.get(piece)
      if piece_ids is None:
        try:
          piece_ids = self._encode_piece(piece)
        except UnicodeEncodeError:
          raise _surrogate_error(text, 'ByteBPETokenizer.encode') from None
        if len(self._cache) >= self._CACHE_LIMIT:
          self._cache.clear()
        self._cache[piece] = piece_ids
      ids.extend(piece_ids)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Joins the tokens' bytes; byte runs that are not UTF-8 become U+FFFD."""
    data = b''.join(self._token_bytes[i] for i in _check_ids(ids, self.vocab_size))
    return data.decode('utf-8', errors='replace')

  def save(self, path) -> None:
    _write(path, {'type': 'byte_bpe', 'pattern': self.pattern, 'vocab': self.vocab,
                  'merges': [list(m) for m in self.merges]}, self.train_sha256)

  @classmethod
  def load(cls, path) -> 'ByteBPETokenizer':
    payload = _read(path, 'byte_bpe')
    merges, pattern = payload.get('merges'), payload.get('pattern')
    if not isinstance(merges, list) or not all(
        isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) and s for s in m)
        for m in merges):
      raise _invalid(path, '"merges" must be a list of [left, right] string pairs')
    if not isinstance(pattern, str):
      raise _invalid(path, '"pattern" must be a regular expression string')
    try:
      tokenizer = cls([tuple(m) for m in merges], pattern, payload.get('train_sha256'))
    except (ValueError, regex.error) as error:
      raise _invalid(path, str(error).rstrip('.')) from None
    if tokenizer.vocab != payload['vocab']:
      raise _invalid(path, '"vocab" is not the byte alphabet followed by the merged tokens')
    return tokenizer


_TYPES = {'char': CharTokenizer, 'byte_bpe': ByteBPETokenizer}
