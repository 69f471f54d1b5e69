"""Tiny Shakespeare (Karpathy's char-rnn `input.txt`) split as TFDS does it.

The TFDS catalog builder `tiny_shakespeare` (1.0.0) reads the file as text and
cuts it by characters: train is the first `int(0.9 * n)` characters; of the
remaining `m`, validation is the first `int(0.5 * m)` and test the rest. Each
split is one example whose 'text' is that whole piece. For the 1,115,394
characters of the published file: 1,003,854 / 55,770 / 55,770.
"""

import os

import tensorflow_datasets as tfds

from data.builders import sources


def read_utf8(path: str, name: str) -> str:
  """The UTF-8 text of `path`, every character as written (no newline translation, so counts
  are the file's), or ValueError naming data set `name`, the file and the first invalid byte
  (or saying the file is empty)."""
  with open(path, 'rb') as f:
    data = f.read()
  if not data:
    raise ValueError(f"Data set '{name}' reads UTF-8 text, but {path} is empty.")
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError as e:
    raise ValueError(f"Data set '{name}' reads UTF-8 text, but {path} has an invalid byte at "
                     f'offset {e.start}.') from None

class TinyShakespeare(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Reads `input.txt` from the folder given as the download config's manual_dir."""

  name = 'jaxlab_tiny_shakespeare'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = ('train', 'validation', 'test')
  SOURCE_FILES = ('input.txt',)
  SOURCE_ENV_VAR = 'TINY_SHAKESPEARE_DIR'
  SOURCE_DEFAULT_DIRS = ()
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Put input.txt of https://github.com/karpathy/char-rnn (data/tinyshakespeare)'
      ' in a folder and pass it as source_dir or in $TINY_SHAKESPEARE_DIR.')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({'text': tfds.features.Text()}),
        homepage='https://github.com/karpathy/char-rnn',
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    # Written in the folder TFDS renames into place once the data is, so never one without it.
    sources.write_record(self.data_dir, type(self), os.fspath(dl_manager.manual_dir))
    text = read_utf8(os.path.join(dl_manager.manual_dir, 'input.txt'), 'tiny_shakespeare')
    pieces = split_text(text)
    return {name: self._generate_examples(name, text) for name, text in pieces.items()}

  def _generate_examples(self, name, text):
    yield name, {'text': text}


def split_text(text: str) -> dict[str, str]:
  """The catalog's 90/5/5 cut of `text` by character counts."""
  i = int(len(text) * 0.9)
  train, rest = text[:i], text[i:]
  j = int(len(rest) * 0.5)
  return {'train': train, 'validation': rest[:j], 'test': rest[j:]}
