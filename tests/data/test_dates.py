"""The generated `dates` data set against an independent reading of its sources.

Each source is read back by the test's own description of every format (a
regular expression for its shape and a `datetime.strptime` pattern), with the
two-digit-year rule, ordinal suffixes and weekdays checked here, never with the
generator's code; every shape that matches a source must give its target.
"""

import collections
import datetime
import re

import numpy as np
import pytest

from data import datasets
from data import pipeline
from data.builders import dates

SIZES = {'train': 20_000, 'validation': 1_000, 'test': 2_000}

# format_date(date(2021, 3, 3), i), as the task describes the formats.
MARCH_3_2021 = (
    '3 March 2021', 'March 3, 2021', 'Mar 3 2021', '03/03/2021', '3.3.21',
    'Wednesday, March 3, 2021', '2021 march 3', 'the 3rd of march 2021', 'MAR 03 2021',
    '3-Mar-2021', '20210303', '03.03.2021', '2021/03/03', 'Wed 3 Mar 2021', '3/3/21',
    'March 3rd, 2021', '03 Mar 21', 'wednesday 3 march 2021',
)

# Per format: the shape of its sources and the strptime pattern reading them
# (an ordinal suffix is checked and removed first). D is a day or month number
# without a leading zero.
D = r'[1-9]\d?'
READERS = (
    (rf'{D} [A-Z][a-z]+ \d{{4}}', '%d %B %Y'),
    (rf'[A-Z][a-z]+ {D}, \d{{4}}', '%B %d, %Y'),
    (rf'[A-Z][a-z]{{2}} {D} \d{{4}}', '%b %d %Y'),
    (r'\d\d/\d\d/\d{4}', '%m/%d/%Y'),
    (rf'{D}\.{D}\.\d\d', '%d.%m.%y'),
    (rf'[A-Z][a-z]+day, [A-Z][a-z]+ {D}, \d{{4}}', '%A, %B %d, %Y'),
    (rf'\d{{4}} [a-z]+ {D}', '%Y %B %d'),
    (rf'the {D}(st|nd|rd|th) of [a-z]+ \d{{4}}', 'the %d of %B %Y'),
    (r'[A-Z]{3} \d\d \d{4}', '%b %d %Y'),
    (rf'{D}-[A-Z][a-z]{{2}}-\d{{4}}', '%d-%b-%Y'),
    (r'\d{8}', '%Y%m%d'),
    (r'\d\d\.\d\d\.\d{4}', '%d.%m.%Y'),
    (r'\d{4}/\d\d/\d\d', '%Y/%m/%d'),
    (rf'[A-Z][a-z]{{2}} {D} [A-Z][a-z]{{2}} \d{{4}}', '%a %d %b %Y'),
    (rf'{D}/{D}/\d\d', '%m/%d/%y'),
    (rf'[A-Z][a-z]+ {D}(st|nd|rd|th), \d{{4}}', '%B %d, %Y'),
    (r'\d\d [A-Z][a-z]{2} \d\d', '%d %b %y'),
    (rf'[a-z]+day {D} [a-z]+ \d{{4}}', '%A %d %B %Y'),
)
SUFFIXES = {1: 'st', 2: 'nd', 3: 'rd', 21: 'st', 22: 'nd', 23: 'rd', 31: 'st'}  # else 'th'


def read(source: str) -> dict[int, datetime.date]:
  """format index -> the date, for every format whose shape `source` has."""
  found = {}
  for i, (shape, pattern) in enumerate(READERS):
    if not re.fullmatch(shape, source):
      continue
    text = source
    ordinal = re.search(r'(\d+)(st|nd|rd|th)', source)
    if ordinal:
      assert ordinal.group(2) == SUFFIXES.get(int(ordinal.group(1)), 'th'), source
      text = source[:ordinal.end(1)] + source[ordinal.end():]
    date = datetime.datetime.strptime(text, pattern).date()
    if '%y' in pattern:  # YY is 19YY for 50..99 and 20YY for 00..49
      yy = date.year % 100
      date = date.replace(year=(1900 if yy >= 50 else 2000) + yy)
    for weekday_code in ('%A', '%a'):
      if weekday_code in pattern:  # strptime does not check the weekday against the date
        assert source.split()[0].strip(',').lower() == date.strftime(weekday_code).lower(), source
    found[i] = date
  return found


def texts(arrays: dict, name: str) -> list[str]:
  return [bytes(row[:n]).decode('ascii') for row, n in zip(arrays[name], arrays[f'{name}_length'])]


def prepare(data_dir) -> dict[str, dict[str, np.ndarray]]:
  return {split: pipeline.InMemorySource(datasets.load('dates', split, data_dir=data_dir)).arrays
          for split in SIZES}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('dates')


@pytest.fixture(scope='module')
def prepared(data_dir):
  return prepare(data_dir)


def written_files(data_dir) -> dict[str, bytes]:
  """The prepared version folder's record files by name."""
  folder = data_dir / 'jaxlab_dates' / '1.0.0'
  return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if 'array_record' in p.name}


@pytest.fixture(scope='module')
def pairs(prepared):
  """split -> list of (source, target) strings."""
  return {split: list(zip(texts(arrays, 'source'), texts(arrays, 'target')))
          for split, arrays in prepared.items()}


def test_formats_write_the_documented_examples():
  assert len(dates.FORMATS) == len(MARCH_3_2021) >= 15
  assert [dates.format_date(datetime.date(2021, 3, 3), i)
          for i in range(len(dates.FORMATS))] == list(MARCH_3_2021)
  assert dates.format_date(datetime.date(2049, 11, 22), 7) == 'the 22nd of november 2049'
  assert dates.format_date(datetime.date(1912, 9, 11), 15) == 'September 11th, 1912'
  assert dates.format_date(datetime.date(1950, 1, 1), 14) == '1/1/50'
  assert dates.format_date(datetime.date(2099, 12, 31), 17) == 'thursday 31 december 2099'
  for date in (datetime.date(1949, 12, 31), datetime.date(2050, 1, 1)):
    for i in (4, 14, 16):  # a two-digit year would name another date
      with pytest.raises(ValueError, match='two-digit year'):
        dates.format_date(date, i)


def test_two_digit_year_formats_are_allowed_exactly_from_1950_to_2049():
  every, two_digit = set(range(18)), {4, 14, 16}  # the formats with YY
  for date, allowed in ((datetime.date(1949, 12, 31), every - two_digit),
                        (datetime.date(1950, 1, 1), every), (datetime.date(2049, 12, 31), every),
                        (datetime.date(2050, 1, 1), every - two_digit),
                        (datetime.date(1900, 1, 1), every - two_digit)):
    assert dates.formats_for(date) == tuple(sorted(allowed)), date


def test_encode_pads_with_zero_bytes_and_refuses_texts_it_cannot_hold():
  record = dates.encode('3.3.21', '2021-03-03')
  assert record['source'].tolist() == [ord(c) for c in '3.3.21'] + [0] * 34
  assert record['target'].tolist() == [ord(c) for c in '2021-03-03']
  assert (record['source_length'], record['target_length']) == (6, 10)
  for source, target in (('3.3\x0021', '2021-03-03'), ('', '2021-03-03'), ('x' * 41, '2021-03-03'),
                         ('3.3.21', '2021-03-031')):
    with pytest.raises(ValueError, match='nonzero ASCII bytes'):
      dates.encode(source, target)


def test_split_sizes_and_record_layout(prepared, tmp_path):
  assert {split: len(arrays['source']) for split, arrays in prepared.items()} == SIZES
  info = datasets.info('dates', data_dir=tmp_path)
  assert info.features['source'].shape == (40,) and info.features['target'].shape == (10,)
  for arrays in prepared.values():
    assert arrays['source'].dtype == np.uint8 and arrays['source'].shape[1:] == (40,)
    assert arrays['target'].dtype == np.uint8 and arrays['target'].shape[1:] == (10,)
    np.testing.assert_array_equal(arrays['target_length'], 10)
    for name in ('source', 'target'):
      lengths = arrays[f'{name}_length']
      assert lengths.min() >= 1
      inside = np.arange(arrays[name].shape[1]) < lengths[:, None]
      assert np.all(arrays[name][~inside] == 0), f'{name} is not zero past its length'
      assert np.all((arrays[name][inside] > 0) & (arrays[name][inside] < 128)), name


def test_every_source_reads_as_its_target_in_each_format(pairs):
  per_format = collections.Counter()
  for source, target in (pair for split in pairs.values() for pair in split):
    assert re.fullmatch(r'\d{4}-\d\d-\d\d', target), target
    expected = datetime.date.fromisoformat(target)
    assert datetime.date(1900, 1, 1) <= expected <= datetime.date(2099, 12, 31), target
    found = read(source)
    assert found, f'{source!r} has the shape of no format'
    assert set(found.values()) == {expected}, (source, target, found)
    per_format.update(found.keys())
  total = sum(SIZES.values())
  # Uniform over the formats that can write a date: about total / 18 each, half
  # that for the three formats with a two-digit year (1950..2049 only).
  # 'Mar 3 2021' and 'MAR 03 2021' share a strptime pattern, not a shape.
  assert all(per_format[i] > total / len(READERS) / 3 for i in range(len(READERS))), per_format


def test_dates_are_spread_over_the_two_centuries(pairs):
  years = np.array([int(target[:4]) for split in pairs.values() for _, target in split])
  assert years.min() <= 1901 and years.max() >= 2098
  # Uniform over 200 years: a quarter before 1950, a quarter from 2050.
  assert abs(np.mean(years < 1950) - 0.25) < 0.02 and abs(np.mean(years >= 2050) - 0.25) < 0.02


def test_a_source_always_has_the_same_target(pairs):
  targets = collections.defaultdict(set)
  counts = collections.Counter()
  for source, target in (pair for split in pairs.values() for pair in split):
    targets[source].add(target)
    counts[source] += 1
  assert all(len(t) == 1 for t in targets.values()), [s for s, t in targets.items() if len(t) > 1]
  assert sum(n > 1 for n in counts.values()) > 50  # train repeats sources, so this checks something


def test_no_held_out_source_is_in_train(pairs):
  sources = {split: [source for source, _ in split_pairs] for split, split_pairs in pairs.items()}
  held_out = sources['validation'] + sources['test']
  assert len(set(held_out)) == len(held_out)  # distinct within and across validation and test
  assert not set(sources['train']) & set(held_out)


def test_preparing_again_gives_the_same_records(data_dir, prepared, pairs, tmp_path):
  for split in SIZES:
    assert len(datasets.load('dates', split, data_dir=tmp_path)) == SIZES[split]
  first, again = written_files(data_dir), written_files(tmp_path)
  assert len(first) == len(SIZES) and first.keys() == again.keys()
  assert all(first[name] == again[name] for name in first), 'the record files differ'
  # The draws depend on SHA-256 alone, so these are the records on any machine.
  assert pairs['train'][:2] == [('Saturday, November 5, 1955', '1955-11-05'),
                                ('Friday, December 3, 2083', '2083-12-03')]
  assert pairs['validation'][:2] == [('friday 12 march 1915', '1915-03-12'),
                                     ('24-Apr-1907', '1907-04-24')]
  assert pairs['test'][:2] == [('thursday 26 april 1906', '1906-04-26'),
                               ('tuesday 8 december 1998', '1998-12-08')]


def test_dates_takes_no_source_dir(tmp_path):
  with pytest.raises(TypeError, match='generated'):
    datasets.load('dates', 'train', data_dir=tmp_path, source_dir=tmp_path)
