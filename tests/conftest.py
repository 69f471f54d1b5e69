import os

# Tests run on the CPU; multi-device tests start their own processes.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A data directory with scikit-learn's digits prepared once per test session (and worker)."""
  path = str(tmp_path_factory.mktemp('digits_data'))
  import data  # pylint: disable=g-import-not-at-top
  data.load('digits', 'train', data_dir=path)
  data.load('digits', 'test', data_dir=path)
  return path
