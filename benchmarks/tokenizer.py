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

FLAGS = flags.FLAGS


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('corpus', os.environ.get('TINYSHAKESPEARE_PATH'),
                      'UTF-8 text file to train and encode (default: $TINYSHAKESPEARE_PATH).')
  flags.DEFINE_integer('vocab_size', 1024, 'Target vocabulary size (>= 256).')
  flags.DEFINE_string('save_to', None, 'Optional path for the trained tokenizer file.')


def main(argv):
  del argv
  if not FLAGS.corpus:
    raise app.UsageError('No corpus: pass --corpus=PATH or set TINYSHAKESPEARE_PATH.')
  with open(FLAGS.corpus, encoding='utf-8') as f:
    text = f.read()
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
    tokenizer.save(FLAGS.save_to)
    print(f'saved: {FLAGS.save_to}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
