"""The work-directory lock: one holder at a time, across processes, freed by the kernel
when its holder dies."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.subprocess_util import REPO_ROOT
from train import workdir as workdir_lib

_HOLD = textwrap.dedent('''
    import sys, time
    from train import workdir
    lock = workdir.acquire(sys.argv[1])
    print('locked', flush=True)
    time.sleep(600)
''')
_TRY = textwrap.dedent('''
    import sys
    from train import workdir
    try:
      workdir.acquire(sys.argv[1]).release()
      print('acquired')
    except ValueError as e:
      print(e)
''')


def _python(source, *args, **kwargs):
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT}
  return [sys.executable, '-c', source, *args], dict(env=env, cwd=REPO_ROOT, text=True, **kwargs)


@pytest.fixture
def holder(tmp_path):
  """A process that holds the lock of tmp_path/'w' until killed."""
  command, options = _python(_HOLD, str(tmp_path / 'w'))
  process = subprocess.Popen(command, stdout=subprocess.PIPE, **options)
  assert process.stdout.readline().strip() == 'locked'
  yield process
  if process.poll() is None:
    process.kill()
  process.wait(timeout=30)


def test_a_second_process_is_refused_at_once_naming_the_holder(holder, tmp_path):
  workdir = str(tmp_path / 'w')
  start = time.monotonic()
  with pytest.raises(ValueError) as info:
    workdir_lib.acquire(workdir)
  assert time.monotonic() - start < 1.0
  assert str(info.value) == (
      f'The work directory {workdir!r} is in use by process {holder.pid} on '
      f'{socket.gethostname()}; wait for that run to finish, stop it, or choose another --workdir.')
  with open(os.path.join(workdir, workdir_lib.LOCK_FILE), encoding='utf-8') as f:
    assert json.load(f) == {'pid': holder.pid, 'host': socket.gethostname()}


def test_a_killed_holder_leaves_the_lock_free(holder, tmp_path):
  holder.send_signal(signal.SIGKILL)
  holder.wait(timeout=30)
  with workdir_lib.acquire(tmp_path / 'w') as lock:
    assert lock.held
    with open(lock.path, encoding='utf-8') as f:
      assert json.load(f)['pid'] == os.getpid()  # the dead holder's record is replaced


def test_release_lets_another_process_in(tmp_path):
  workdir = str(tmp_path / 'w')
  command, options = _python(_TRY, workdir)
  lock = workdir_lib.acquire(workdir)
  refused = subprocess.run(command, capture_output=True, check=True, timeout=60, **options)
  assert refused.stdout.strip().startswith(f'The work directory {workdir!r} is in use by process '
                                           f'{os.getpid()} on ')
  lock.release()
  lock.release()  # releasing twice is harmless
  assert not lock.held
  with open(lock.path, encoding='utf-8') as f:
    assert f.read() == ''  # no stale holder is recorded
  accepted = subprocess.run(command, capture_output=True, check=True, timeout=60, **options)
  assert accepted.stdout.strip() == 'acquired'


def test_context_manager_releases_and_the_same_process_is_refused_while_held(tmp_path):
  with workdir_lib.acquire(tmp_path / 'w') as lock:
    with pytest.raises(ValueError, match=f'in use by process {os.getpid()} on '):
      workdir_lib.acquire(tmp_path / 'w')
  assert not lock.held
  workdir_lib.acquire(tmp_path / 'w').release()


def test_an_unusable_directory_is_one_sentence(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  with pytest.raises(ValueError) as info:
    workdir_lib.acquire(blocker / 'w')
  assert str(info.value) == (f"The work directory {str(blocker / 'w')!r} cannot be locked "
                             '(Not a directory).')
