import os
import shutil
import tempfile

from tests.subprocess_util import FAST_COMPILE_FLAGS

# Tests run on the CPU; multi-device tests start their own processes.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# LLVM's optimisations off for the tests' own programs and the processes they start (unless
# XLA_FLAGS is set already): their shapes are tiny, so compiling dominates, and tests/models
# took 4 min 57 s with these flags against 8 min 0 s without (-n 2, one run each). XLA's
# HLO passes, which decide the compiled programs' operations, run either way.
os.environ.setdefault('XLA_FLAGS', FAST_COMPILE_FLAGS)

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


def pytest_configure(config):
  """One JAX compilation cache for the whole session: every process of it (xdist workers, and
  the runs, evaluations and multi-device checks the tests launch, which inherit the
  environment) reuses a program another has compiled, e.g. a config's train step compiled
  again by each of the preemption tests' nine launches. A temporary folder, removed at the
  end; set JAX_COMPILATION_CACHE_DIR to keep one across sessions."""
  if 'JAX_COMPILATION_CACHE_DIR' in os.environ:  # the user's, or the xdist controller's
    return
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='jaxlab_tests_xla_cache_')
  # Every program, however fast it compiles (JAX's default keeps those over 1 s only).
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  config.stash[_OWN_CACHE] = os.environ['JAX_COMPILATION_CACHE_DIR']


def pytest_unconfigure(config):
  if _OWN_CACHE in config.stash:
    shutil.rmtree(config.stash[_OWN_CACHE], ignore_errors=True)


_OWN_CACHE = pytest.StashKey[str]()


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A data directory with scikit-learn's digits prepared once per test session (and worker)."""
  path = str(tmp_path_factory.mktemp('digits_data'))
  import data  # pylint: disable=g-import-not-at-top
  data.load('digits', 'train', data_dir=path)
  data.load('digits', 'test', data_dir=path)
  return path
