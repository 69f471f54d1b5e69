"""Random-access data sets by name: `load(name, split)`.

Every data set is a TFDS builder written as `array_record` and read with TFDS's
data source, so a split is a sequence: `len(source)`, and `source[i]` is a dict
of feature values decoded by TFDS without TensorFlow (arrays as NumPy arrays,
integer scalars such as 'label' as Python ints, text as UTF-8 bytes).

Four data sets are prepared from this machine alone (see `data/builders/`):

  mnist1d           train 4,000 / test 1,000   'x' float32 (40,), 'label' 10
  digits            train 1,437 / test 360     'image' uint8 (8, 8, 1), 'label' 10
  fashion_mnist     train 60,000 / test 10,000 'image' uint8 (28, 28, 1), 'label' 10
  tiny_shakespeare  train / validation / test, one example each, 'text'

Any other name is looked up in the TFDS catalog and prepared by TFDS.

Prepared data sets are kept under the data directory (`data_dir=`, else
$JAXLAB_DATA_DIR, else TFDS's default, ~/tensorflow_datasets) and read from
there on later calls; the local builders write `jaxlab_<name>/` so they never
mix with a catalog copy of the same data set. A data set that is neither
prepared nor obtainable (its local files absent, or no network for a catalog
one) fails within a few seconds with a FileNotFoundError saying what to supply.
"""

import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence

import tensorflow_datasets as tfds

from data.builders import digits
from data.builders import fashion_mnist
from data.builders import mnist1d
from data.builders import sources
from data.builders import tiny_shakespeare

DATA_DIR_ENV_VAR = 'JAXLAB_DATA_DIR'

LOCAL_BUILDERS = {
    'mnist1d': mnist1d.Mnist1d,
    'digits': digits.Digits,
    'fashion_mnist': fashion_mnist.FashionMnist,
    'tiny_shakespeare': tiny_shakespeare.TinyShakespeare,
}

# Long enough for a TCP handshake across continents, short enough that an
# offline machine answers well within 5 s.
PROBE_TIMEOUT_S = 3.0
# Catalog builders without recorded URLs mostly fetch from TFDS's bucket.
_FALLBACK_HOSTS = (('storage.googleapis.com', 443),)
_MAX_PROBED_HOSTS = 4


def load(name: str, split: str, *, data_dir: str | os.PathLike | None = None,
         **options) -> Sequence[dict]:
  """The random-access source of `split` of data set `name`, prepared if need be.

  Args:
    name: a key of `LOCAL_BUILDERS` or a TFDS catalog name ('mnist', 'cifar10/...').
    split: a split name, or a TFDS split expression over them ('train[:10%]').
    data_dir: where prepared data sets are kept (default: $JAXLAB_DATA_DIR,
      else TFDS's default).
    **options: for fashion_mnist and tiny_shakespeare, `source_dir`, the folder
      of the raw files (else their environment variable, see the builders);
      for catalog names, keyword arguments of the TFDS builder (config=, ...).

  Returns:
    TFDS's data source: `len()` and `[i]` -> dict of feature values.

  Raises:
    ValueError: unknown data set or split, or a split with no examples.
    TypeError: an option the data set does not take.
    FileNotFoundError: the data set is not prepared and cannot be obtained.
  """
  source_dir = options.pop('source_dir', None) if name in LOCAL_BUILDERS else None
  if source_dir is not None and not sources.reads_local_files(LOCAL_BUILDERS[name]):
    raise TypeError(f"Data set '{name}' is generated, not read from files: it takes no source_dir.")
  builder = make_builder(name, data_dir=data_dir, **options)
  _check_split(name, split, _known_splits(builder))
  if not builder.is_prepared():
    _prepare(name, builder, source_dir)
    _check_split(name, split, _known_splits(builder))
  if builder.info.splits[split].num_examples == 0:
    raise ValueError(f'Split {split!r} of data set {name!r} holds no examples.')
  return builder.as_data_source(split=split)


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
  """The array_record builder of `name` under the data directory, prepared or not."""
  data_dir = data_dir or os.environ.get(DATA_DIR_ENV_VAR) or None
  if data_dir is not None:
    data_dir = os.fspath(data_dir)
  if name in LOCAL_BUILDERS:
    if options:
      raise TypeError(f"Data set '{name}' takes no options {sorted(options)}.")
    return LOCAL_BUILDERS[name](data_dir=data_dir, file_format='array_record')
  try:
    return tfds.builder(name, data_dir=data_dir, file_format='array_record', **options)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(f"Unknown data set '{name}': it is neither one of "
                     f'{", ".join(LOCAL_BUILDERS)} nor in the TFDS catalog.') from None


def _known_splits(builder) -> tuple[str, ...]:
  return tuple(builder.info.splits) or tuple(getattr(builder, 'SPLITS', ()))


def _check_split(name: str, split, allowed: Sequence[str]) -> None:
  """Rejects split names outside `allowed`; slices and '+' are left to TFDS."""
  if not isinstance(split, str) or not allowed:
    return
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if base not in allowed and base != 'all':
      raise ValueError(f"Unknown split '{base}' of data set '{name}'; "
                       f'its splits are: {", ".join(allowed)}.')


def _prepare(name: str, builder, source_dir) -> None:
  if name in LOCAL_BUILDERS:
    config = None
    if sources.reads_local_files(type(builder)):
      folder = sources.find_dir(name, type(builder), source_dir, builder.data_dir)
      config = tfds.download.DownloadConfig(manual_dir=folder)
    builder.download_and_prepare(download_config=config)
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
