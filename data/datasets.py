"""Random-access data sets by name: `load(name, split)`.

Every data set is a TFDS builder written as `array_record` and read with TFDS's
data source, so a split is a sequence: `len(source)`, and `source[i]` is a dict
of feature values decoded by TFDS without TensorFlow (arrays as NumPy arrays,
integer scalars such as 'label' as Python ints, text as UTF-8 bytes).

Nine data sets are prepared from this machine alone (see `data/builders/`):

  mnist1d           train 4,000 / test 1,000   'x' float32 (40,), 'label' 10
  digits            train 1,437 / test 360     'image' uint8 (8, 8, 1), 'label' 10
  fashion_mnist     train 60,000 / test 10,000 'image' uint8 (28, 28, 1), 'label' 10
  tiny_shakespeare  train / validation / test, one example each, 'text'
  co2               train 422 / validation 52 / test 52, one month each, in time
                    order: 'co2' float32 (ppm), 'year', 'month', 'interpolated'
                    (Mauna Loa, 1958-03 to 2001-12, from statsmodels)
  dates             train 20,000 / validation 1,000 / test 2,000, generated:
                    'source' uint8 (40,) a date in one of 18 formats, 'target'
                    uint8 (10,) its ISO 8601 date, ASCII zero-padded;
                    'source_length', 'target_length' int32
  shakespeare_case  train 29,242 / validation 1,703 / test 1,834, pieces of lines
                    of tiny_shakespeare: 'input' uint8 (64,) lower-cased,
                    'tags' uint8 (64,) 1 where upper case, 'length' int32
  associative_recall
                    train 20,000 / validation 500 / test 1,000, generated at
                    the option `length` T (a power of two, 64 to 16,384;
                    default 2,048): 'tokens' int16 (T + 1,) 16 key-value pair
                    tokens among fillers, then 16 queries and their values;
                    'weights' uint8 (T,) 1 at the query keys; 'distance' int32
                    (16,), how far back each query's pair lies
  gaussian_mixture  train 10,000 / test 2,000 points 'x' float32 (2,) of the
                    2-D mixture named by the option `mixture` ('ring' or
                    'grid'; data/toy2d.py has its exact density and score)

Any other name is looked up in the TFDS catalog and prepared by TFDS.

Prepared data sets are kept under the data directory (`data_dir=`, else
$JAXLAB_DATA_DIR, else TFDS's default, ~/tensorflow_datasets) and read from
there on later calls; the local builders write `jaxlab_<name>/` so they never
mix with a catalog copy of the same data set. A data set prepared from local files
keeps their SHA-256: a later call naming other files (by `source_dir` or the
builder's environment variable) is refused in one sentence instead of reading the
copy prepared from the first ones. A data set that is neither
prepared nor obtainable (its local files absent, or no network for a catalog
one) fails within a few seconds with a FileNotFoundError saying what to supply.

Preparing a local data set prints one line on stderr,

  preparing data set 'digits' in DATA_DIR/jaxlab_digits/1.0.0 ... done (1,797 examples, 0.4 s)

and nothing else: TFDS's banners, progress bars and warnings are held back
while it runs. Preparations of one data set take turns (a file lock beside its
versions), so processes started together prepare it once (one naming other files
than those it was prepared from is refused, as above); folders an interrupted
preparation left behind are removed first.
"""

import contextlib
import fcntl
import io
import logging
import os
import re
import shutil
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence

from google.protobuf import json_format
import tensorflow_datasets as tfds
from tensorflow_datasets.core.utils import tqdm_utils

from data.builders import associative_recall
from data.builders import co2
from data.builders import dates
from data.builders import digits
from data.builders import fashion_mnist
from data.builders import gaussian_mixture
from data.builders import mnist1d
from data.builders import shakespeare_case
from data.builders import sources
from data.builders import tiny_shakespeare

DATA_DIR_ENV_VAR = 'JAXLAB_DATA_DIR'

LOCAL_BUILDERS = {
    'mnist1d': mnist1d.Mnist1d,
    'digits': digits.Digits,
    'fashion_mnist': fashion_mnist.FashionMnist,
    'tiny_shakespeare': tiny_shakespeare.TinyShakespeare,
    'co2': co2.Co2,
    'dates': dates.Dates,
    'shakespeare_case': shakespeare_case.ShakespeareCase,
    'associative_recall': associative_recall.AssociativeRecall,
    'gaussian_mixture': gaussian_mixture.GaussianMixture,
}

# Long enough for a TCP handshake across continents, short enough that an
# offline machine answers well within 5 s.
PROBE_TIMEOUT_S = 3.0
# Catalog builders without recorded URLs mostly fetch from TFDS's bucket.
_FALLBACK_HOSTS = (('storage.googleapis.com', 443),)
_MAX_PROBED_HOSTS = 4


class OptionError(TypeError, ValueError):
  """An option a data set does not take: a TypeError for callers of `load`, and a ValueError
  like every other wrong value of a config, so a run reports it in one sentence."""


def load(name: str, split: str, *, data_dir: str | os.PathLike | None = None,
         **options) -> Sequence[dict]:
  """The random-access source of `split` of data set `name`, prepared if need be.

  Args:
    name: a key of `LOCAL_BUILDERS` or a TFDS catalog name ('mnist', 'cifar10/...').
    split: a split name, or a TFDS split expression over them ('train[:10%]').
    data_dir: where prepared data sets are kept (default: $JAXLAB_DATA_DIR,
      else TFDS's default).
    **options: for fashion_mnist, tiny_shakespeare and shakespeare_case,
      `source_dir`, the folder of the raw files (else their environment
      variable, see the builders); for a local builder with `OPTIONS`, those
      keyword arguments of its constructor (associative_recall: `length`;
      gaussian_mixture: `mixture`);
      for catalog names, keyword arguments of the TFDS builder (config=, ...).

  Returns:
    TFDS's data source: `len()` and `[i]` -> dict of feature values.

  Raises:
    ValueError: unknown data set or split, a split with no examples, or a data
      directory that cannot be a folder (it, or a parent of it, is a file), or a
      file where the data set's folder in it goes.
    OptionError (a TypeError and a ValueError): an option the data set does not take.
    FileNotFoundError: the data set is not prepared and cannot be obtained.
  """
  if not isinstance(split, str):
    raise ValueError(f'The split of data set {name!r} must be a split name or a TFDS split '
                     f"expression such as 'train[:10%]', not {split!r}.")
  source_dir = options.pop('source_dir', None) if name in LOCAL_BUILDERS else None
  if source_dir is not None and not sources.reads_local_files(LOCAL_BUILDERS[name]):
    raise OptionError(f"Data set '{name}' is generated, not read from files: it takes no "
                      'source_dir.')
  builder = make_builder(name, data_dir=data_dir, **options)
  _check_split(name, split, _known_splits(builder))
  if not _is_prepared(builder):
    _prepare(name, builder, source_dir)
    _check_split(name, split, _known_splits(builder))
  # Also after preparing: another process may have prepared it, from its own files, while
  # this one waited for the lock.
  if name in LOCAL_BUILDERS and sources.reads_local_files(type(builder)):
    sources.check_record(name, builder.data_dir, type(builder), source_dir)
  # TFDS counts a slice that ends before it starts ('train[5:2]') as negative.
  if builder.info.splits[split].num_examples <= 0:
    raise ValueError(f'Split {split!r} of data set {name!r} holds no examples.')
  try:
    source = builder.as_data_source(split=split)
    if len(source):  # a shard cut short is found on reading, the first and last at least
      source[0], source[len(source) - 1]  # pylint: disable=pointless-statement
  except (RuntimeError, OSError, ValueError) as e:
    why = str(e).strip().split('\n')[0].split('; ')[0].rstrip('.')
    raise ValueError(f"Data set '{name}' in {builder.data_dir} is damaged (split {split!r}: "
                     f'{why}): remove that folder to prepare it again, or copy it in again.'
                     ) from None
  return source


def info(name: str, *, data_dir: str | os.PathLike | None = None,
         **options) -> tfds.core.DatasetInfo:
  """TFDS's description of `name`: `.features` (shapes, dtypes, `['label'].num_classes`).

  Split sizes (`.splits`) are filled once the data set is prepared. Takes the
  options `load` takes (a local data set's `source_dir` is not needed here).
  """
  if name in LOCAL_BUILDERS:
    options.pop('source_dir', None)
  return make_builder(name, data_dir=data_dir, **options).info


def make_builder(name: str, *, data_dir: str | os.PathLike | None = None,
                 **options) -> tfds.core.DatasetBuilder:
  """The array_record builder of `name` under the data directory, prepared or not.

  Raises ValueError if the data directory, or the nearest of its parents that
  exists, is not a folder.
  """
  if not isinstance(name, str) or not name.strip():
    raise ValueError(f'The data set name must be one of {", ".join(LOCAL_BUILDERS)} or a TFDS '
                     f"data set name such as 'mnist', got {name!r}.")
  origin = 'data_dir=' if data_dir else f'${DATA_DIR_ENV_VAR}'
  data_dir = data_dir or os.environ.get(DATA_DIR_ENV_VAR) or None
  if data_dir is not None:
    data_dir = os.fspath(data_dir)
    _check_data_dir(data_dir, origin)
  if name in LOCAL_BUILDERS:
    allowed = getattr(LOCAL_BUILDERS[name], 'OPTIONS', ())
    unknown = sorted(set(options) - set(allowed))
    if unknown and not allowed:
      raise OptionError(f"Data set '{name}' takes no options {sorted(options)}.")
    if unknown:
      raise OptionError(f"Data set '{name}' takes no option {unknown[0]!r}; its options are: "
                      f'{", ".join(allowed)}.')
  try:
    if name in LOCAL_BUILDERS:
      return LOCAL_BUILDERS[name](data_dir=data_dir, file_format='array_record', **options)
    return tfds.builder(name, data_dir=data_dir, file_format='array_record', **options)
  except json_format.ParseError as e:
    raise _damaged_info(name, data_dir, e) from None
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(f"Unknown data set '{name}': it is neither one of "
                     f'{", ".join(LOCAL_BUILDERS)} nor a TFDS data set this installation registers '
                     "(TFDS registers the builders that import TensorFlow only with it: pip "
                     "install -e '.[tensorflow]').") from None
  except (AssertionError, TypeError, ValueError) as e:
    if name in LOCAL_BUILDERS:  # their own errors are one sentence already
      raise
    # TFDS's 'Failed to construct dataset "mnist", builder_kwargs "{…}": <why>', the why
    # being e.g. a version it does not have, a config it does not know, an unknown option.
    why = re.sub(r'^Failed to construct dataset "[^"]*", builder_kwargs "[^"]*": ', '',
                 str(e).strip()).split('\n')[0].split('. ')[0].rstrip('.')
    error = OptionError if isinstance(e, TypeError) else ValueError
    given = f' with options {options}' if options else ''
    raise error(f'Data set {name!r} cannot be built{given}: {why}.') from None


def _damaged_info(name: str, data_dir: str | None, error: Exception) -> ValueError:
  """The one sentence for a prepared folder whose dataset_info.json does not parse."""
  builder = LOCAL_BUILDERS.get(name)
  if builder is not None and data_dir:
    where = os.path.join(data_dir, builder.name, str(builder.VERSION))
  else:
    where = f'{data_dir or "TFDS default data directory"} (its folder {name.split(":")[0]})'
  return ValueError(f"Data set '{name}' in {where} is damaged (its dataset_info.json: "
                    f'{str(error).strip().rstrip(".")}): remove that folder to prepare it '
                    'again, or copy it in again.')


def _nearest_existing(path: str) -> str | None:
  """`path` or the nearest of its parents that exists; None on a remote file system TFDS
  reaches (gs://...), which is not checked here."""
  if '://' in path:
    return None
  existing = os.path.abspath(path)
  while not os.path.exists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)
  return existing


def _check_data_dir(data_dir: str, origin: str) -> None:
  existing = _nearest_existing(data_dir)
  if existing is not None and not os.path.isdir(existing):
    raise ValueError(f'The data directory {data_dir} given by {origin} cannot be a folder, as '
                     f'{existing} is a file; give {origin} a folder to keep data sets in.')


def _check_version_dir(name: str, version_dir: str) -> None:
  """ValueError in one sentence if `version_dir`, where `name` is to be prepared, or the
  nearest of its parents that exists is a file, or that folder cannot be written."""
  existing = _nearest_existing(version_dir)
  if existing is not None and not os.path.isdir(existing):
    raise ValueError(f"Data set '{name}' cannot be prepared in {version_dir}, as {existing} is "
                     f'a file; move that file away or give data_dir= (or ${DATA_DIR_ENV_VAR}) '
                     f'another folder.')
  if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f"Data set '{name}' is not prepared in {version_dir}, and it cannot be "
                     f'prepared there: permission denied on the folder {existing}; give '
                     f'data_dir= (or ${DATA_DIR_ENV_VAR}) a folder that can be written, or '
                     'prepare it elsewhere and copy it in.')


def _known_splits(builder) -> tuple[str, ...]:
  return tuple(builder.info.splits) or tuple(getattr(builder, 'SPLITS', ()))


def _check_split(name: str, split: str, allowed: Sequence[str]) -> None:
  """Rejects split names outside `allowed`; slices and '+' are left to TFDS."""
  if not allowed:
    return
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if base not in allowed and base != 'all':
      raise ValueError(f"Unknown split '{base}' of data set '{name}'; "
                       f'its splits are: {", ".join(allowed)}.')


def _is_prepared(builder) -> bool:
  # TFDS warns that the version folder lacks dataset_info.json when it is
  # merely not there yet, which is the usual reason to ask.
  with _tfds_quiet():
    return builder.is_prepared()


def _prepare(name: str, builder, source_dir) -> None:
  _check_version_dir(name, builder.data_dir)
  if name in LOCAL_BUILDERS:
    config = None
    if sources.reads_local_files(type(builder)):
      folder = sources.find_dir(name, type(builder), source_dir, builder.data_dir)
      config = tfds.download.DownloadConfig(manual_dir=folder)
    _prepare_local(name, builder, config)
    return
  hosts = _download_hosts(builder)
  if not _reachable(hosts, PROBE_TIMEOUT_S):
    names = ', '.join(host for host, _ in hosts)
    raise FileNotFoundError(
        f"Data set '{name}' is not prepared in {builder.data_dir} and its download hosts "
        f'({names}) did not answer within {PROBE_TIMEOUT_S:g} s; prepare it on a machine with '
        f'network access and copy it into the data directory given by data_dir= or '
        f'${DATA_DIR_ENV_VAR}.')
  builder.download_and_prepare()


def _prepare_local(name: str, builder, download_config) -> None:
  """Prepares a local data set with one line of output, unless another process just did."""
  versions_dir = os.path.dirname(builder.data_dir)
  with _preparation_lock(versions_dir):
    if _is_prepared(builder):  # another process prepared it while this one waited
      builder.info.read_from_directory(builder.data_dir)
      return
    _remove_incomplete(builder.data_dir)
    start = time.perf_counter()
    print(f"preparing data set '{name}' in {builder.data_dir} ...", end=' ', file=sys.stderr,
          flush=True)
    try:
      with _tfds_quiet():
        builder.download_and_prepare(download_config=download_config)
    except BaseException:
      print('failed', file=sys.stderr, flush=True)  # the error's own line follows
      raise
    examples = sum(split.num_examples for split in builder.info.splits.values())
    print(f'done ({examples:,} examples, {time.perf_counter() - start:.1f} s)', file=sys.stderr,
          flush=True)


@contextlib.contextmanager
def _preparation_lock(versions_dir: str):
  """Holds an exclusive lock on `versions_dir`/.preparing.lock (waiting for it), so that
  any incomplete folder seen inside is a dead preparation's, not a live one's."""
  os.makedirs(versions_dir, exist_ok=True)
  with open(os.path.join(versions_dir, '.preparing.lock'), 'a', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX)
    except OSError:
      pass  # a file system without locks: preparations may overlap, as TFDS allows
    yield  # closing the file drops the lock, however the preparation ends


def _remove_incomplete(version_dir: str) -> None:
  """Removes the `incomplete.*_<version>` folders TFDS leaves beside `version_dir` when
  a preparation is interrupted; other versions' folders are not touched."""
  parent, version = os.path.split(version_dir.rstrip('/'))
  prefix, suffix = 'incomplete.', f'_{version}'
  for entry in os.listdir(parent):
    path = os.path.join(parent, entry)
    if entry.startswith(prefix) and entry.endswith(suffix) and os.path.isdir(path):
      shutil.rmtree(path)


class _DropTfdsRecords(logging.Filter):
  """Drops TFDS's own log records below ERROR (all TFDS logs go to absl's logger)."""

  def filter(self, record: logging.LogRecord) -> bool:
    from_tfds = f'{os.sep}tensorflow_datasets{os.sep}' in record.pathname
    return record.levelno >= logging.ERROR or not from_tfds


@contextlib.contextmanager
def _tfds_quiet():
  """Within: no TFDS progress bars, stdout banners, or log records below ERROR."""
  absl_logger = logging.getLogger('absl')
  log_filter = _DropTfdsRecords()
  # TFDS offers only setters for its progress bars; its flag is read to restore it.
  bars_were_on = getattr(tqdm_utils, '_active', True)
  tfds.display_progress_bar(False)
  absl_logger.addFilter(log_filter)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    absl_logger.removeFilter(log_filter)
    tfds.display_progress_bar(bars_were_on)


def _download_hosts(builder) -> tuple[tuple[str, int], ...]:
  """(host, port) of the URLs the catalog records for `builder`, a few at most."""
  try:
    urls = list(builder.url_infos or ())
  except Exception:  # pylint: disable=broad-except
    # Reading the recorded URLs imports optional packages of TFDS; without them
    # the fallback host still tells whether the machine is online.
    urls = []
  hosts = {}
  for url in urls:
    parts = urllib.parse.urlsplit(url)
    if parts.hostname:
      default_port = {'http': 80, 'ftp': 21}.get(parts.scheme, 443)
      hosts.setdefault(parts.hostname, parts.port or default_port)
  return tuple(hosts.items())[:_MAX_PROBED_HOSTS] or _FALLBACK_HOSTS


def _reachable(hosts: Sequence[tuple[str, int]], timeout: float) -> bool:
  """Whether a TCP connection to any of `hosts` opens within `timeout` seconds.

  Each probe runs in a daemon thread because name resolution ignores socket
  timeouts and can hang on a machine without network.
  """
  answered = threading.Event()

  def probe(host, port):
    try:
      with socket.create_connection((host, port), timeout=timeout):
        answered.set()
    except OSError:
      pass

  threads = [threading.Thread(target=probe, args=host, daemon=True) for host in hosts]
  for thread in threads:
    thread.start()
  deadline = time.monotonic() + timeout
  for thread in threads:
    thread.join(max(0.0, deadline - time.monotonic()))
    if answered.is_set():
      return True
  return answered.is_set()
