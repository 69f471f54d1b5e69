"""Tokenizers against a BPE example worked by hand and brute-force references."""

import collections
import hashlib
import json
import os
import random
import re

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import regex

from data import tokenizers
from tests.messages import assert_one_sentence

HUG_PUG_WORDS = {'hug': 10, 'pug': 5, 'pun': 12, 'bun': 4, 'hugs': 5}

CORPUS = """\
The quick brown fox jumps over the lazy dog; the dog sleeps, the fox runs.
Thou art more lovely and more temperate: rough winds do shake the darling buds.
It's 2024 and we've 3 cats, 12 dogs -- they'll all say 'hello' twice!!
Naïve café owners serve crème brûlée; 東京 と 大阪 は 日本 の 都市 です。
Emoji: 🙂🙂 👍🏽 🎉 — and tabs\tand  double  spaces\n\nnew lines.
""" * 3


def _naive_bpe(word_counts, base_vocab, num_merges):
  """Reference trainer: recounts every pair before each merge."""
  segments = {word: tuple(word) for word in word_counts}
  vocab, merges = list(base_vocab), []
  for _ in range(num_merges):
    counts = collections.Counter()
    for word, symbols in segments.items():
      for pair in zip(symbols, symbols[1:]):
        counts[pair] += word_counts[word]
    if not counts:
      break
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    merges.append(best)
    if best[0] + best[1] not in vocab:
      vocab.append(best[0] + best[1])
    segments = {word: _merge_all(symbols, best) for word, symbols in segments.items()}
  return vocab, merges, segments


def _merge_all(symbols, pair):
  """Merges non-overlapping occurrences of `pair`, left to right."""
  merged, i = [], 0
  while i < len(symbols):
    if tuple(symbols[i:i + 2]) == pair:
      merged.append(pair[0] + pair[1])
      i += 2
    else:
      merged.append(symbols[i])
      i += 1
  return tuple(merged)


def _reference_encode(tokenizer, text):
  """Applies every merge in order to each pre-token, as the file format documents."""
  alphabet = tokenizers.byte_to_unicode()
  index = {token: i for i, token in enumerate(tokenizer.vocab)}
  ids = []
  for piece in regex.findall(tokenizers.GPT2_PATTERN, text):
    symbols = tuple(alphabet[b] for b in piece.encode('utf-8'))
    for merge in tokenizer.merges:
      symbols = _merge_all(symbols, merge)
    ids.extend(index[s] for s in symbols)
  return ids


@pytest.fixture(scope='module')
def bpe():
  return tokenizers.ByteBPETokenizer.train(CORPUS, vocab_size=350)


# The example worked by hand: words hug 10, pug 5, pun 12, bun 4, hugs 5.


def _segmented_table(result):
  """The worked table: each word's current segmentation with the word's frequency."""
  return {result.segments[word]: count for word, count in HUG_PUG_WORDS.items()}


def test_hug_pug_example_base_vocabulary():
  assert tokenizers.char_bpe(HUG_PUG_WORDS, 0).vocab == ['b', 'g', 'h', 'n', 'p', 's', 'u']


def test_hug_pug_example_first_pair_table():
  counts = tokenizers.count_pairs(_segmented_table(tokenizers.char_bpe(HUG_PUG_WORDS, 0)))
  assert counts.most_common(5) == [(('u', 'g'), 20), (('p', 'u'), 17), (('u', 'n'), 16),
                                   (('h', 'u'), 15), (('g', 's'), 5)]


def test_hug_pug_example_second_pair_table():
  result = tokenizers.char_bpe(HUG_PUG_WORDS, 1)
  assert result.segments == {'hug': ('h', 'ug'), 'pug': ('p', 'ug'), 'pun': ('p', 'u', 'n'),
                             'bun': ('b', 'u', 'n'), 'hugs': ('h', 'ug', 's')}
  top = tokenizers.count_pairs(_segmented_table(result)).most_common(5)
  assert top[:3] == [(('u', 'n'), 16), (('h', 'ug'), 15), (('p', 'u'), 12)]
  assert set(top[3:]) == {(('p', 'ug'), 5), (('ug', 's'), 5)}


def test_hug_pug_example_final_merges_vocabulary_and_segmentation():
  result = tokenizers.char_bpe(HUG_PUG_WORDS, 3)
  assert result.merges == [('u', 'g'), ('u', 'n'), ('h', 'ug')]
  assert result.vocab == ['b', 'g', 'h', 'n', 'p', 's', 'u', 'ug', 'un', 'hug']
  assert result.segments == {'hug': ('hug',), 'pug': ('p', 'ug'), 'pun': ('p', 'un'),
                             'bun': ('b', 'un'), 'hugs': ('hug', 's')}


# The incremental trainer against full recounting.


@pytest.mark.parametrize('seed', range(6))
def test_learn_bpe_matches_naive_recounting(seed):
  rng = random.Random(seed)
  words = {''.join(rng.choice('abc') for _ in range(rng.randint(1, 9))): rng.randint(1, 5)
           for _ in range(40)}
  expected_vocab, expected_merges, expected_segments = _naive_bpe(words, 'abc', 25)
  result = tokenizers.learn_bpe(words, 'abc', num_merges=25)
  assert result.merges == expected_merges
  assert result.vocab == expected_vocab
  assert result.segments == expected_segments


def test_learn_bpe_stops_at_vocab_size_or_when_no_pair_is_left():
  assert len(tokenizers.learn_bpe(HUG_PUG_WORDS, 'bghnpsu', vocab_size=9).vocab) == 9
  result = tokenizers.learn_bpe({'ab': 3}, 'ab', vocab_size=10)
  assert result.merges == [('a', 'b')] and result.segments == {'ab': ('ab',)}


def test_learn_bpe_rejects_bad_arguments():
  with pytest.raises(ValueError, match="symbol 'z' outside the base vocabulary"):
    tokenizers.learn_bpe({'az': 1}, 'a', num_merges=1)
  with pytest.raises(ValueError, match='vocab_size=100 is smaller than the base vocabulary of 256'):
    tokenizers.ByteBPETokenizer.train('abc', vocab_size=100)
  with pytest.raises(ValueError, match='The base vocabulary has repeated symbols'):
    tokenizers.learn_bpe({'ab': 1}, ['a', 'b', 'a'], num_merges=1)


# Byte-level BPE.


def test_gpt2_byte_alphabet_facts():
  alphabet = tokenizers.byte_to_unicode()
  assert len(set(alphabet)) == 256 and all(c.isprintable() for c in alphabet)
  assert alphabet[ord('A')] == 'A' and alphabet[ord('~')] == '~' and alphabet[0xE9] == 'é'
  assert alphabet[0] == '\u0100' and alphabet[ord(' ')] == 'Ġ' and alphabet[ord('\n')] == 'Ċ'
  assert alphabet[0xAD] == '\u0143'
  # Stand-ins: bytes 0..32 take 256..288, 127..160 take 289..322 and 0xAD (soft hyphen) 323.
  assert alphabet[0x7F] == '\u0121' and alphabet[0xA0] == '\u0142'
  assert alphabet[0xA1] == '¡' and alphabet[0xAC] == '¬' and alphabet[0xAE] == '®'
  assert alphabet[0xFF] == 'ÿ'
  assert sorted(ord(c) for c in alphabet if ord(c) >= 256) == list(range(256, 324))


def test_gpt2_pretokenisation():
  assert regex.findall(tokenizers.GPT2_PATTERN, "Hello world's 123  !!\n\nok") == [
      'Hello', ' world', "'s", ' 123', ' ', ' !!', '\n', '\n', 'ok']
  # Every lower-case contraction is a piece of its own; GPT-2's are case-sensitive.
  assert regex.findall(tokenizers.GPT2_PATTERN, "I'm sure they'll say it'd do; we're, you've, "
                                                "don't IT'S") == [
      'I', "'m", ' sure', ' they', "'ll", ' say', ' it', "'d", ' do', ';', ' we', "'re", ',',
      ' you', "'ve", ',', ' don', "'t", ' IT', "'", 'S']


def test_trained_vocabulary_has_the_requested_size_and_is_built_from_merges(bpe):
  assert bpe.vocab_size == 350
  assert bpe.vocab[:256] == tokenizers.byte_to_unicode()
  assert set(bpe.vocab[256:]) <= {left + right for left, right in bpe.merges}


def test_encode_applies_merges_in_order(bpe):
  for text in [CORPUS, 'the fox\'s 東京 café 🙂 jumps', 'unseen wordsmithery 99']:
    assert bpe.encode(text) == _reference_encode(bpe, text)


def test_encode_reproduces_the_segmentation_training_ended_with(bpe):
  alphabet = tokenizers.byte_to_unicode()
  words = collections.Counter(regex.findall(tokenizers.GPT2_PATTERN, CORPUS))
  learnt = tokenizers.learn_bpe(
      {tuple(alphabet[b] for b in word.encode('utf-8')): n for word, n in words.items()},
      alphabet, vocab_size=350)
  assert learnt.merges == bpe.merges
  for word in words:
    symbols = learnt.segments[tuple(alphabet[b] for b in word.encode('utf-8'))]
    assert [bpe.vocab[i] for i in bpe.encode(word)] == list(symbols)


def test_encode_does_not_reopen_merges_passed_before_a_token_is_rebuilt():
  # 'aa' + 'a' rebuilds 'aaa' at rank 3, after ('aa', 'aaa') had its turn at rank 2.
  tokenizer = tokenizers.ByteBPETokenizer([('a', 'a'), ('a', 'aa'), ('aa', 'aaa'), ('aa', 'a')])
  assert tokenizer.vocab[256:] == ['aa', 'aaa', 'aaaaa']
  assert tokenizer.encode('aaaaa') == _reference_encode(tokenizer, 'aaaaa') == [256, 257]


@pytest.mark.parametrize('seed', range(10))
def test_encode_applies_arbitrary_merge_lists_in_order(seed):
  # Random merge lists rebuild existing tokens and repeat pairs, which learnt ones rarely do.
  rng = random.Random(seed)
  tokens, merges = ['a', 'b'], []
  for _ in range(30):
    merge = (rng.choice(tokens[-6:] + ['a', 'b']), rng.choice(tokens[-6:] + ['a', 'b']))
    merges.append(merge)
    if merge[0] + merge[1] not in tokens:
      tokens.append(merge[0] + merge[1])
  tokenizer = tokenizers.ByteBPETokenizer(merges)
  assert len(set(tokenizer.vocab)) == tokenizer.vocab_size
  for _ in range(30):
    text = ''.join(rng.choice('ab') for _ in range(rng.randint(0, 30)))
    assert tokenizer.encode(text) == _reference_encode(tokenizer, text)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_training_with_a_pattern_keeps_it_for_encoding():
  # Whole runs of non-space: 'ab,ab,ab' is one piece, so (a, b) and then (',', 'ab') (tied with
  # ('ab', ','), 2 each; ',' < 'ab') are learnt. GPT-2's pattern would cut at each comma.
  pattern = r'\S+|\s+'
  tokenizer = tokenizers.ByteBPETokenizer.train('ab,ab,ab', 258, pattern=pattern)
  assert tokenizer.pattern == pattern
  assert tokenizer.merges == [('a', 'b'), (',', 'ab')]
  assert tokenizer.encode('ab,ab') == [256, 257]


def test_encoding_compresses_the_training_text(bpe):
  assert len(bpe.encode(CORPUS)) < 0.6 * len(CORPUS.encode('utf-8'))


@hypothesis.given(st.text())
@hypothesis.example('')
@hypothesis.example('👩‍👩‍👧 naïve 日本語\r\n\t  x')
def test_byte_bpe_round_trips_any_text(bpe, text):
  assert bpe.decode(bpe.encode(text)) == text


def test_byte_bpe_decode_rejects_unknown_ids(bpe):
  with pytest.raises(ValueError, match=r'Token 350 at position 1 is not an id in \[0, 350\)'):
    bpe.decode([1, 350])
  # A negative id would otherwise index the vocabulary from its end.
  for tokenizer, size in ((bpe, 350), (_CHAR, _CHAR.vocab_size)):
    with pytest.raises(ValueError, match=rf'Token -1 at position 2 is not an id in \[0, {size}\)'):
      tokenizer.decode([1, 2, -1])


def test_byte_bpe_decode_replaces_bytes_that_are_not_utf8():
  # Ids 0..255 are the bytes themselves; 0xE6 0x9D begins 東 (E6 9D B1) without its last byte,
  # and 0xFF never occurs in UTF-8: each becomes one U+FFFD.
  tokenizer = tokenizers.ByteBPETokenizer([])
  assert tokenizer.decode([ord('a'), 0xE6, 0x9D, ord('b'), 0xFF]) == 'a\ufffdb\ufffd'
  assert tokenizer.decode([0xE6, 0x9D, 0xB1]) == '東'


def test_decode_takes_numpy_ids_as_it_takes_python_ints(bpe):
  text = 'the fox runs'
  for tokenizer in (bpe, _CHAR):
    ids = tokenizer.encode(text)
    for array in (np.asarray(ids), np.asarray(ids, np.int32), np.asarray(ids, np.uint16)):
      assert tokenizer.decode(array) == text
  with pytest.raises(ValueError, match=r'Token 350 at position 1 is not an id in \[0, 350\)'):
    bpe.decode(np.array([1, 350]))


@pytest.mark.parametrize('pattern, parts', [
    (r'\p{L}+', [r"'\\p{L}+'", "character ' ' at position 2", 'cover the text']),
    (r'(?:\p{L}+)|[.,]', ["character ' ' at position 2"]),
])
def test_a_pattern_whose_pieces_leave_out_characters_is_refused(pattern, parts):
  text = 'To be, or not to be.'
  with pytest.raises(ValueError) as error:
    tokenizers.ByteBPETokenizer.train(text, 260, pattern=pattern)
  assert_one_sentence(str(error.value), *parts)
  tokenizer = tokenizers.ByteBPETokenizer([], pattern)
  assert tokenizer.decode(tokenizer.encode('Tobe')) == 'Tobe'
  with pytest.raises(ValueError) as error:
    tokenizer.encode(text)
  assert_one_sentence(str(error.value), *parts)


def test_a_pattern_with_capturing_groups_is_refused(bpe, tmp_path):
  pattern = r"(\p{L}+)|\s+|[^\s\p{L}]+"  # findall would return the group, '' for spaces
  with pytest.raises(ValueError) as error:
    tokenizers.ByteBPETokenizer.train('To be, or not.', 260, pattern=pattern)
  assert_one_sentence(str(error.value), '1 capturing group', '(?:...)')
  path = tmp_path / 'bpe.json'
  bpe.save(path)
  payload = json.loads(path.read_text(encoding='utf-8'))
  path.write_text(json.dumps(dict(payload, pattern=pattern)), encoding='utf-8')
  with pytest.raises(ValueError, match='capturing group') as error:
    tokenizers.load(path)
  assert str(path) in str(error.value)


def test_a_pattern_that_finds_its_pieces_out_of_text_order_is_refused():
  # A reverse search finds every piece, last first: 'To be' was encoded as 'beTo ' without a word.
  pattern = r'(?r)\p{L}+|\s+|[^\s\p{L}]+'
  assert sorted(regex.findall(pattern, 'To be')) == sorted(['To', ' ', 'be'])
  with pytest.raises(ValueError) as error:
    tokenizers.ByteBPETokenizer.train('To be, or not to be.', 260, pattern=pattern)
  assert_one_sentence(str(error.value), repr(pattern), 'out of text order', 'left to right')
  tokenizer = tokenizers.ByteBPETokenizer([], pattern)
  with pytest.raises(ValueError) as error:
    tokenizer.encode('To be')
  assert_one_sentence(str(error.value), 'out of text order')
  assert tokenizer.decode(tokenizer.encode('Tobe')) == 'Tobe'  # one piece: in order
  # A character outside every piece is named at its position, whatever order the pieces have.
  with pytest.raises(ValueError) as error:
    tokenizers.ByteBPETokenizer([], r'(?r)\p{L}+').encode('To be')
  assert_one_sentence(str(error.value), "the character ' ' at position 2")


@pytest.mark.parametrize('text, position', [('ab \udcff', 3), ('\ud83d\ude42 x', 0),
                                            ('caf\u00e9 \udc80\udc81', 5)])
def test_text_holding_surrogates_is_one_sentence_naming_its_position(bpe, text, position):
  # A byte that is not UTF-8, decoded with errors='surrogateescape' (as a command-line prompt
  # is), becomes a surrogate; UTF-8 has no bytes for it. The error named its position inside its
  # pre-token (0 for each of these) instead of in the text.
  for call, what in ((lambda: bpe.encode(text), 'ByteBPETokenizer.encode'),
                     (lambda: tokenizers.ByteBPETokenizer.train(text, 260),
                      'ByteBPETokenizer.train')):
    with pytest.raises(ValueError) as error:
      call()
    assert_one_sentence(str(error.value), f'{what} cannot encode the character '
                        f'{text[position]!r} at position {position}: a surrogate code point')


# Character-level.


def test_char_vocabulary_is_the_sorted_corpus_characters():
  tokenizer = tokenizers.CharTokenizer.from_corpus('hello, world')
  assert tokenizer.vocab == [' ', ',', 'd', 'e', 'h', 'l', 'o', 'r', 'w']
  assert tokenizer.encode('low') == [5, 6, 8]


_CHAR = tokenizers.CharTokenizer.from_corpus(CORPUS)


@hypothesis.given(st.text(alphabet=_CHAR.vocab))
@hypothesis.example('')
def test_char_round_trips_text_over_its_vocabulary(text):
  ids = _CHAR.encode(text)
  assert len(ids) == len(text)
  assert _CHAR.decode(ids) == text


def test_char_rejects_unknown_characters():
  # The first unknown character is named, at its first position.
  with pytest.raises(ValueError, match=r"Character 'Z' at position 4 is not in the vocabulary"):
    _CHAR.encode('the Zebra Zone')


# Files.


def test_save_load_round_trip_gives_identical_encodings(bpe, tmp_path):
  sample = CORPUS + 'unseen: ☃ 𝄞 Ω'
  bpe.save(tmp_path / 'bpe.json')
  loaded = tokenizers.load(tmp_path / 'bpe.json')
  assert isinstance(loaded, tokenizers.ByteBPETokenizer)
  assert loaded.vocab == bpe.vocab and loaded.merges == bpe.merges
  assert loaded.encode(sample) == bpe.encode(sample)
  _CHAR.save(tmp_path / 'char.json')
  loaded_char = tokenizers.CharTokenizer.load(tmp_path / 'char.json')
  assert loaded_char.encode(CORPUS) == _CHAR.encode(CORPUS)
  assert loaded.train_sha256 == loaded_char.train_sha256 == tokenizers.text_sha256(CORPUS)


def test_train_text_digest_is_the_sha256_of_the_utf8_bytes():
  # A lone surrogate counts as its three bytes (U+DCFF: ED B3 BF), as UTF-8 would write it.
  assert tokenizers.text_sha256('é\udcff') == hashlib.sha256(b'\xc3\xa9\xed\xb3\xbf').hexdigest()


def test_saved_file_has_the_documented_fields(bpe, tmp_path):
  bpe.save(tmp_path / 'bpe.json')
  payload = json.loads((tmp_path / 'bpe.json').read_text(encoding='utf-8'))
  assert payload['format'] == 'jaxlab-tokenizer' and payload['version'] == 1
  assert payload['type'] == 'byte_bpe' and payload['pattern'] == tokenizers.GPT2_PATTERN
  assert payload['vocab'] == bpe.vocab and payload['merges'] == [list(m) for m in bpe.merges]
  assert payload['train_sha256'] == hashlib.sha256(CORPUS.encode('utf-8')).hexdigest()


@pytest.mark.parametrize('interruption', [KeyboardInterrupt, OSError])
def test_an_interrupted_save_leaves_the_previous_file_whole(bpe, tmp_path, monkeypatch,
                                                           interruption):
  path = tmp_path / 'bpe.json'
  bpe.save(path)
  before = path.read_bytes()

  def stopped_half_way(obj, f, **kwargs):
    f.write(json.dumps(obj, **kwargs)[:300])
    raise interruption

  monkeypatch.setattr(tokenizers.json, 'dump', stopped_half_way)
  for tokenizer in (bpe, _CHAR):
    with pytest.raises(interruption):
      tokenizer.save(path)
  assert path.read_bytes() == before and os.listdir(tmp_path) == ['bpe.json']
  monkeypatch.undo()
  assert tokenizers.load(path).merges == bpe.merges
  _CHAR.save(path)  # a completed save replaces it
  assert tokenizers.load(path).vocab == _CHAR.vocab and os.listdir(tmp_path) == ['bpe.json']


def test_a_char_vocabulary_holding_surrogates_saves_and_loads(tmp_path):
  # Saving was a UnicodeEncodeError: a surrogate has no UTF-8 bytes; its JSON escape has.
  text = 'ab\udcff a\ud83d'
  tokenizer = tokenizers.CharTokenizer.from_corpus(text)
  path = tmp_path / 'char.json'
  tokenizer.save(path)
  assert '\\udcff' in path.read_text(encoding='utf-8')  # valid UTF-8, the escape spelt out
  loaded = tokenizers.load(path)
  assert loaded.vocab == tokenizer.vocab == [' ', 'a', 'b', '\ud83d', '\udcff']
  assert loaded.decode(loaded.encode(text)) == text
  assert loaded.train_sha256 == tokenizers.text_sha256(text)


def test_tokenizers_built_from_merges_or_vocab_record_no_train_text(tmp_path):
  path = tmp_path / 'char.json'
  tokenizers.CharTokenizer(list('abc')).save(path)
  assert 'train_sha256' not in json.loads(path.read_text(encoding='utf-8'))
  assert tokenizers.load(path).train_sha256 is None


def _corrupt(payload, **changes):
  return json.dumps(dict(payload, **changes))


@pytest.mark.parametrize('make_text, message', [
    (lambda text, payload: text[:len(text) // 2], 'not UTF-8 JSON'),
    (lambda text, payload: '{"format": ', 'not UTF-8 JSON'),
    (lambda text, payload: '[1, 2]', "format is 'list'"),
    (lambda text, payload: _corrupt(payload, format='gpt2'), "format is 'gpt2'"),
    (lambda text, payload: _corrupt(payload, version=2), 'version is 2; only 1 is read'),
    (lambda text, payload: _corrupt(payload, type='wordpiece'), "type is 'wordpiece'"),
    (lambda text, payload: _corrupt(payload, vocab=payload['vocab'][:-1]), '"vocab" is not'),
    # Two merged tokens swapped: the right tokens, but not at the ids the merges give them.
    (lambda text, payload: _corrupt(payload, vocab=payload['vocab'][:256] + [
        payload['vocab'][257], payload['vocab'][256]] + payload['vocab'][258:]), '"vocab" is not'),
    (lambda text, payload: _corrupt(payload, vocab=payload['vocab'] + ['a']), 'distinct'),
    (lambda text, payload: _corrupt(payload, merges=[['zz', 'q']]), 'uses a token not made'),
    (lambda text, payload: _corrupt(payload, merges=[['a']]), 'string pairs'),
    (lambda text, payload: _corrupt(payload, merges=[['a', 'b', 'c']]), 'string pairs'),
    (lambda text, payload: _corrupt(payload, pattern='(unclosed'), 'invalid'),
    (lambda text, payload: _corrupt(payload, train_sha256='abc'), '"train_sha256" must be 64'),
    (lambda text, payload: _corrupt(payload, train_sha256='0' * 40), '"train_sha256" must be 64'),
])
def test_bad_files_raise_value_errors_naming_the_file(bpe, tmp_path, make_text, message):
  good = tmp_path / 'good.json'
  bpe.save(good)
  text = good.read_text(encoding='utf-8')
  bad = tmp_path / 'bad.json'
  bad.write_text(make_text(text, json.loads(text)), encoding='utf-8')
  with pytest.raises(ValueError, match=message) as error:
    tokenizers.load(bad)
  assert str(bad) in str(error.value)


@pytest.mark.parametrize('vocab, message', [
    (['a', 'bc'], 'a character vocabulary holds single characters'),
    (['a', ''], '"vocab" must be a list of distinct non-empty strings'),
    (['a', 'a'], '"vocab" must be a list of distinct non-empty strings'),
    ('abc', '"vocab" must be a list of distinct non-empty strings'),
    (['a', 7], '"vocab" must be a list of distinct non-empty strings'),
])
def test_bad_char_vocabularies_are_one_sentence_naming_the_file(tmp_path, vocab, message):
  path = tmp_path / 'char.json'
  _CHAR.save(path)
  payload = json.loads(path.read_text(encoding='utf-8'))
  path.write_text(json.dumps(dict(payload, vocab=vocab)), encoding='utf-8')
  for load in (tokenizers.load, tokenizers.CharTokenizer.load):
    with pytest.raises(ValueError) as error:
      load(path)
    assert str(error.value) == f'Tokenizer file {str(path)!r} is invalid: {message}.'


def test_a_tokenizer_file_nested_too_deep_is_one_sentence_naming_it(tmp_path):
  path = tmp_path / 'deep.json'
  path.write_text('[' * 100_000)
  with pytest.raises(ValueError) as error:
    tokenizers.load(path)
  assert_one_sentence(str(error.value), repr(str(path)), 'nests deeper than any tokenizer file')


def test_loading_the_wrong_kind_or_non_utf8_names_the_file(tmp_path):
  path = tmp_path / 'char.json'
  _CHAR.save(path)
  with pytest.raises(ValueError, match=f"{path}.* type is 'char'; expected byte_bpe"):
    tokenizers.ByteBPETokenizer.load(path)
  binary = tmp_path / 'binary.json'
  binary.write_bytes(b'\xff\xfe\x00garbage')
  with pytest.raises(ValueError, match=f'{binary}.* not UTF-8 JSON'):
    tokenizers.load(binary)


@pytest.mark.parametrize('call, what', [
    (lambda text: tokenizers.CharTokenizer.from_corpus(text), 'CharTokenizer.from_corpus'),
    (lambda text: tokenizers.CharTokenizer.from_corpus('abc').encode(text), 'CharTokenizer.encode'),
    (lambda text: tokenizers.ByteBPETokenizer.train(text, vocab_size=258),
     'ByteBPETokenizer.train'),
    (lambda text: tokenizers.ByteBPETokenizer.train('abc', vocab_size=256).encode(text),
     'ByteBPETokenizer.encode'),
])
def test_text_as_bytes_is_one_sentence(call, what):
  # data.load returns text as UTF-8 bytes; given them, CharTokenizer.encode used to report
  # "Character 97 ... is not in the vocabulary", from_corpus an AttributeError, and BPE
  # "cannot use a string pattern on a bytes-like object".
  with pytest.raises(TypeError, match=re.escape(
      f"{what} takes text as a str, got bytes (data sets return text as UTF-8 bytes: decode it "
      "with .decode('utf-8')).")):
    call(b'abc abc')


@pytest.mark.parametrize('vocab_size', [300.0, True])
def test_a_vocab_size_that_is_not_an_integer_is_one_sentence(vocab_size):
  # 300.0 used to train a tokenizer as if it were 300.
  with pytest.raises(ValueError, match=re.escape(
      f'vocab_size must be an integer of at least 256, got {vocab_size!r}.')):
    tokenizers.ByteBPETokenizer.train('abc abc', vocab_size=vocab_size)


def test_a_bool_is_not_a_token_id():
  with pytest.raises(ValueError, match=r'Token True at position 1 is not an id in \[0, 3\)\.'):
    tokenizers.CharTokenizer.from_corpus('abc').decode([0, True])
