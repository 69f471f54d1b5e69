import atexit
import os
import shutil
import tempfile

# Tests run on the CPU; multi-device tests start their own processes.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# One compilation cache for the session: set here in the first process, it is inherited by
# the test workers and the runs they start, so the many tests that train, stop and resume the
# same small programs compile each once. Sized, hence locked between processes (filelock);
# removed when the session ends.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _CACHE_DIR = tempfile.mkdtemp(prefix='jaxlab-test-xla-cache-')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _CACHE_DIR
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  os.environ['JAX_COMPILATION_CACHE_MAX_SIZE'] = str(2**31)
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A data directory with scikit-learn's digits prepared once per test session (and worker)."""
  path = str(tmp_path_factory.mktemp('digits_data'))
  import data  # pylint: disable=g-import-not-at-top
  data.load('digits', 'train', data_dir=path)
  data.load('digits', 'test', data_dir=path)
  return path
