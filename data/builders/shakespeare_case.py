"""Restoring capitals in Tiny Shakespeare: a per-character tagging task.

Made from the same `input.txt` as `tiny_shakespeare` (found the same way,
source_dir or $TINY_SHAKESPEARE_DIR) and cut into the same train / validation
/ test pieces of text (`tiny_shakespeare.split_text`). Each split's text is
cut into lines at '\\n' (a line cut by a split boundary is cut there too); each
non-empty line is cut into pieces of at most 64 characters (the first pieces
64 long, the last the rest), and each piece is a record, in text order:

  'input'   uint8 (64,)  the piece lower-cased, as ASCII bytes, zero-padded
  'tags'    uint8 (64,)  1 where the piece's character is upper case, else 0
                         (0 in the padding)
  'length'  int32        the piece's length, 1..64

Every other character is kept as written. The text must be ASCII, as the
published file is (its longest line has 63 characters, so no line is cut).
"""

import os

import numpy as np
import tensorflow_datasets as tfds

from data.builders import sources
from data.builders import tiny_shakespeare

PIECE_LENGTH = 64


class ShakespeareCase(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Reads `input.txt` from the folder given as the download config's manual_dir."""

  name = 'jaxlab_shakespeare_case'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = tiny_shakespeare.TinyShakespeare.SPLITS
  SOURCE_FILES = tiny_shakespeare.TinyShakespeare.SOURCE_FILES
  SOURCE_ENV_VAR = tiny_shakespeare.TinyShakespeare.SOURCE_ENV_VAR
  SOURCE_DEFAULT_DIRS = tiny_shakespeare.TinyShakespeare.SOURCE_DEFAULT_DIRS
  MANUAL_DOWNLOAD_INSTRUCTIONS = tiny_shakespeare.TinyShakespeare.MANUAL_DOWNLOAD_INSTRUCTIONS

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'input': tfds.features.Tensor(shape=(PIECE_LENGTH,), dtype=np.uint8),
            'tags': tfds.features.Tensor(shape=(PIECE_LENGTH,), dtype=np.uint8),
            'length': tfds.features.Tensor(shape=(), dtype=np.int32),
        }),
        homepage='https://github.com/karpathy/char-rnn',
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    # Written in the folder TFDS renames into place once the data is, so never one without it.
    sources.write_record(self.data_dir, type(self), os.fspath(dl_manager.manual_dir))
    path = os.path.join(dl_manager.manual_dir, 'input.txt')
    text = tiny_shakespeare.read_utf8(path, 'shakespeare_case')
    if not text.isascii():
      position = next(i for i, c in enumerate(text) if not c.isascii())
      raise ValueError(f"Data set 'shakespeare_case' takes ASCII text, but {path} has "
                       f'{text[position]!r} at character {position}.')
    return {name: self._generate_examples(piece)
            for name, piece in tiny_shakespeare.split_text(text).items()}

  def _generate_examples(self, text):
    for i, piece in enumerate(pieces(text)):
      yield i, encode(piece)


def pieces(text: str) -> list[str]:
  """The non-empty lines of `text` cut into pieces of at most `PIECE_LENGTH` characters."""
  return [line[start:start + PIECE_LENGTH]
          for line in text.split('\n')
          for start in range(0, len(line), PIECE_LENGTH)]


def encode(piece: str) -> dict:
  """The record of an ASCII piece of 1 to `PIECE_LENGTH` characters."""
  if not 0 < len(piece) <= PIECE_LENGTH or not piece.isascii():
    raise ValueError(f'A piece must be 1 to {PIECE_LENGTH} ASCII characters, not {piece!r}.')
  data = np.frombuffer(piece.encode('ascii'), np.uint8)
  inputs = np.zeros(PIECE_LENGTH, np.uint8)
  tags = np.zeros(PIECE_LENGTH, np.uint8)
  inputs[:len(data)] = np.frombuffer(piece.lower().encode('ascii'), np.uint8)
  tags[:len(data)] = (data >= ord('A')) & (data <= ord('Z'))
  return {'input': inputs, 'tags': tags, 'length': np.int32(len(data))}
