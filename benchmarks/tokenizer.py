"""Times byte-level BPE (Gage 1994; Sennrich et al. 2016) training and encoding on a text corpus.

Usage:
  python benchmarks/tokenizer.py --corpus=/path/to/tinyshakespeare/input.txt

The corpus path may instead come from the TINYSHAKESPEARE_PATH environment
variable.
"""

import os
import time

from absl import app
from absl import flags

from data import tokenizers
from experiments import command_line

FLAGS = flags.FLAGS


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('corpus', os.environ.get('TINYSHAKESPEARE_PATH'),
                      'UTF-8 text file to train and encode (default: $TINYSHAKESPEARE_PATH).')
  flags.DEFINE_integer('vocab_size', 1024, 'Target vocabulary size (>= 256: the bytes).')
  flags.register_validator('vocab_size', lambda size: size >= 256,
                           'the vocabulary must hold at least the 256 bytes, every token merged '
                           'from them.')
  flags.DEFINE_string('save_to', None, 'Optional path for the trained tokenizer file.')


def read_corpus(path: str) -> str:
  """The text of --corpus=`path`, or UsageError in one sentence if it cannot be read as
  non-empty UTF-8 text."""
  if not os.path.isfile(path):
    raise app.UsageError(f'--corpus={path} is not a file; give a UTF-8 text file.')
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except UnicodeDecodeError as error:
    raise app.UsageError(f'--corpus={path} is not UTF-8 text (byte {error.object[error.start]:#04x} '
                         f'at offset {error.start} cannot be decoded).') from None
  except OSError as error:
    raise app.UsageError(f'--corpus={path} cannot be read ({error.strerror}).') from None
  if not text:
    raise app.UsageError(f'--corpus={path} is empty; give a text to train on.')
  return text


def main(argv):
  del argv
  if not FLAGS.corpus:
    raise app.UsageError('No corpus: pass --corpus=PATH or set TINYSHAKESPEARE_PATH.')
  if FLAGS.save_to:
    command_line.output_file(FLAGS.save_to, 'save_to', figure=False)
  text = read_corpus(FLAGS.corpus)
  print(f'corpus: {FLAGS.corpus} ({len(text):,} characters, '
        f'{len(text.encode("utf-8")):,} bytes)')

  start = time.perf_counter()
  tokenizer = tokenizers.ByteBPETokenizer.train(text, vocab_size=FLAGS.vocab_size)
  train_seconds = time.perf_counter() - start
  print(f'train: {train_seconds:.2f} s to a vocabulary of {tokenizer.vocab_size} tokens '
        f'({len(tokenizer.merges)} merges)')

  start = time.perf_counter()
  ids = tokenizer.encode(text)
  encode_seconds = time.perf_counter() - start
  print(f'encode: {encode_seconds:.2f} s for {len(ids):,} tokens = '
        f'{len(ids) / encode_seconds:,.0f} tokens/s '
        f'({len(text.encode("utf-8")) / len(ids):.2f} bytes per token)')

  start = time.perf_counter()
  round_trip = tokenizer.decode(ids) == text
  print(f'decode: {time.perf_counter() - start:.2f} s, round trip exact: {round_trip}')
  if FLAGS.save_to:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.save_to)), exist_ok=True)
    tokenizer.save(FLAGS.save_to)
    print(f'saved: {FLAGS.save_to}')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
