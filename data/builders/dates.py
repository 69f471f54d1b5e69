"""Dates written in many human formats, to be translated to ISO 8601 (YYYY-MM-DD).

A toy machine-translation task generated here, the same on every machine and
every run: draw `i` (i = 0, 1, ...) takes its numbers from SHA-256 digests of
'SEED:i:date' and 'SEED:i:format' (SEED = 0), so it depends on no library's
random generator. The date is uniform over the 73,049 days from 1900-01-01 to
2099-12-31; the format is uniform over the `FORMATS` that can write it.

Formats (`format_date(date(2021, 3, 3), i)` for i = 0, 1, ...):

   0 '3 March 2021'              9 '3-Mar-2021'
   1 'March 3, 2021'            10 '20210303'
   2 'Mar 3 2021'               11 '03.03.2021'    day first
   3 '03/03/2021'  month first  12 '2021/03/03'
   4 '3.3.21'      day first    13 'Wed 3 Mar 2021'
   5 'Wednesday, March 3, 2021' 14 '3/3/21'        month first
   6 '2021 march 3'             15 'March 3rd, 2021'
   7 'the 3rd of march 2021'    16 '03 Mar 21'
   8 'MAR 03 2021'              17 'wednesday 3 march 2021'

Every source names one date: numbers separated by '/' are month first, by '.'
day first, and a two-digit year YY is 19YY for 50..99 and 20YY for 00..49, so
the formats with a two-digit year (4, 14, 16) only write dates from 1950-01-01
to 2049-12-31. Month and weekday names are English, the text ASCII.

Splits: validation (1,000) is drawn first, then test (2,000), then train
(20,000), from one sequence of draws. A held-out source (validation or test)
appears once in the held-out splits and never in train; train skips such draws
and may repeat a source of its own (with the same target).

Records: 'source' uint8 (40,), the source's ASCII bytes zero-padded;
'source_length' int32; 'target' uint8 (10,), the ISO date's bytes;
'target_length' int32, always 10. Byte 0 is only padding.
"""

import datetime
import hashlib
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

SEED = 0
SPLIT_SIZES = {'train': 20_000, 'validation': 1_000, 'test': 2_000}
# Held-out splits are drawn first so that train can avoid their sources.
DRAW_ORDER = ('validation', 'test', 'train')
SOURCE_LENGTH = 40
TARGET_LENGTH = 10

FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)
# The dates a two-digit year can name: YY is 19YY for 50..99, 20YY for 00..49.
TWO_DIGIT_YEARS = (1950, 2049)

MONTHS = ('January', 'February', 'March', 'April', 'May', 'June', 'July', 'August',
          'September', 'October', 'November', 'December')
WEEKDAYS = ('Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday')

# Fields of `_fields`: D day, DD zero-padded day, Dth ordinal day; M, MM month
# number; Month/month/Mon/MON month name; Weekday/weekday/Wkd day of the week;
# YYYY year, YY its last two digits.
FORMATS = (
    '{D} {Month} {YYYY}',
    '{Month} {D}, {YYYY}',
    '{Mon} {D} {YYYY}',
    '{MM}/{DD}/{YYYY}',
    '{D}.{M}.{YY}',
    '{Weekday}, {Month} {D}, {YYYY}',
    '{YYYY} {month} {D}',
    'the {Dth} of {month} {YYYY}',
    '{MON} {DD} {YYYY}',
    '{D}-{Mon}-{YYYY}',
    '{YYYY}{MM}{DD}',
    '{DD}.{MM}.{YYYY}',
    '{YYYY}/{MM}/{DD}',
    '{Wkd} {D} {Mon} {YYYY}',
    '{M}/{D}/{YY}',
    '{Month} {Dth}, {YYYY}',
    '{DD} {Mon} {YY}',
    '{weekday} {D} {month} {YYYY}',
)


class Dates(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Record `i` of a split is pair `i` of `generate()` for it."""

  name = 'jaxlab_dates'
  VERSION = tfds.core.Version('1.0.0')
  SPLITS = ('train', 'validation', 'test')

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'source': tfds.features.Tensor(shape=(SOURCE_LENGTH,), dtype=np.uint8),
            'source_length': tfds.features.Tensor(shape=(), dtype=np.int32),
            'target': tfds.features.Tensor(shape=(TARGET_LENGTH,), dtype=np.uint8),
            'target_length': tfds.features.Tensor(shape=(), dtype=np.int32),
        }),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    pairs = generate()
    return {name: self._generate_examples(pairs[name]) for name in self.SPLITS}

  def _generate_examples(self, pairs):
    for i, (source, target) in enumerate(pairs):
      yield i, encode(source, target)


def format_date(date: datetime.date, format_index: int) -> str:
  """`date` written in format `FORMATS[format_index]`.

  Raises:
    ValueError: the format has a two-digit year and `date` lies outside 1950..2049.
  """
  template = FORMATS[format_index]
  if '{YY}' in template and not TWO_DIGIT_YEARS[0] <= date.year <= TWO_DIGIT_YEARS[1]:
    raise ValueError(f'Format {format_index} ({template}) has a two-digit year, which names '
                     f'only the years {TWO_DIGIT_YEARS[0]} to {TWO_DIGIT_YEARS[1]}, not {date.year}.')
  return template.format(**_fields(date))


def formats_for(date: datetime.date) -> tuple[int, ...]:
  """The indices of the formats that can write `date`, in order."""
  two_digits_ok = TWO_DIGIT_YEARS[0] <= date.year <= TWO_DIGIT_YEARS[1]
  return tuple(i for i, template in enumerate(FORMATS) if two_digits_ok or '{YY}' not in template)


def generate() -> dict[str, list[tuple[str, str]]]:
  """(source, ISO target) pairs of every split (see the module docstring)."""
  draws = _draws()
  held_out = set()
  pairs = {}
  for split in DRAW_ORDER:
    pairs[split] = []
    while len(pairs[split]) < SPLIT_SIZES[split]:
      source, target = next(draws)
      if source in held_out:
        continue
      if split != 'train':
        held_out.add(source)
      pairs[split].append((source, target))
  return pairs


def encode(source: str, target: str) -> dict:
  """The record of a pair: zero-padded ASCII bytes and their lengths."""
  record = {}
  for name, text, size in (('source', source, SOURCE_LENGTH), ('target', target, TARGET_LENGTH)):
    data = text.encode('ascii')
    if not 0 < len(data) <= size or 0 in data:
      raise ValueError(f'The {name} {text!r} must be 1 to {size} nonzero ASCII bytes.')
    array = np.zeros(size, np.uint8)
    array[:len(data)] = np.frombuffer(data, np.uint8)
    record[name] = array
    record[f'{name}_length'] = np.int32(len(data))
  return record


def _draws() -> Iterator[tuple[str, str]]:
  """The endless sequence of drawn (source, target) pairs."""
  days = (LAST_DATE - FIRST_DATE).days + 1
  i = 0
  while True:
    date = FIRST_DATE + datetime.timedelta(days=_uniform(i, 'date', days))
    allowed = formats_for(date)
    format_index = allowed[_uniform(i, 'format', len(allowed))]
    yield format_date(date, format_index), date.isoformat()
    i += 1


def _uniform(i: int, stream: str, n: int) -> int:
  """An integer in [0, n) from draw `i`'s digest; the bias of the modulo is below n / 2**64."""
  digest = hashlib.sha256(f'{SEED}:{i}:{stream}'.encode('ascii')).digest()
  return int.from_bytes(digest[:8], 'big') % n


def _ordinal(day: int) -> str:
  suffix = 'th' if day in (11, 12, 13) else {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')
  return f'{day}{suffix}'


def _fields(date: datetime.date) -> dict[str, str]:
  month, weekday = MONTHS[date.month - 1], WEEKDAYS[date.weekday()]
  return {
      'D': str(date.day), 'DD': f'{date.day:02d}', 'Dth': _ordinal(date.day),
      'M': str(date.month), 'MM': f'{date.month:02d}',
      'Month': month, 'month': month.lower(), 'Mon': month[:3], 'MON': month[:3].upper(),
      'Weekday': weekday, 'weekday': weekday.lower(), 'Wkd': weekday[:3],
      'YYYY': f'{date.year:04d}', 'YY': f'{date.year % 100:02d}',
  }
