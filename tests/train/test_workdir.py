"""The work-directory lock: one holder at a time, across processes, freed by the kernel
when its holder dies."""

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
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


_FORK = textwrap.dedent('''
    import json, os, sys
    from train import workdir
    lock = workdir.acquire(sys.argv[1])
    child = os.fork()
    if child == 0:
      lock.release()  # the child's copy of the descriptor: neither the lock nor the record go
      os._exit(0)
    os.waitpid(child, 0)
    with open(lock.path, encoding='utf-8') as f:
      record = json.load(f)
    try:
      workdir.acquire(sys.argv[1])
      still_held = False
    except ValueError:
      still_held = True
    print(json.dumps({'record_pid': record['pid'], 'pid': os.getpid(), 'still_held': still_held}))
''')


def test_a_forked_child_releasing_its_copy_keeps_the_parents_lock_and_record(tmp_path):
  command, options = _python(_FORK, str(tmp_path / 'w'))
  result = subprocess.run(command, capture_output=True, check=True, timeout=60, **options)
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out['still_held'] and out['record_pid'] == out['pid']


def test_a_lock_dropped_without_release_frees_the_directory(tmp_path):
  lock = workdir_lib.acquire(tmp_path / 'w')
  del lock  # e.g. a run dropped in a notebook
  workdir_lib.acquire(tmp_path / 'w').release()


@contextlib.contextmanager
def _held_by_another(workdir, record: bytes):
  """`workdir`'s lock held through a descriptor of this process, as another run holds it, with
  `record` written in its file; yields the descriptor."""
  workdir.mkdir()
  fd = os.open(workdir / workdir_lib.LOCK_FILE, os.O_RDWR | os.O_CREAT)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, record)
    yield fd
  finally:
    os.close(fd)


def test_a_holder_that_wrote_no_record_is_named_vaguely_after_a_short_wait(tmp_path):
  workdir = tmp_path / 'w'
  # A holder that has not finished writing its record.
  with _held_by_another(workdir, b'{"pid": '):
    outcome = []
    def refused():
      try:
        workdir_lib.acquire(workdir)
      except ValueError as e:
        outcome.append(str(e))
    start = time.monotonic()
    attempt = threading.Thread(target=refused, daemon=True)
    attempt.start()
    attempt.join(timeout=30)
    assert not attempt.is_alive(), 'acquire kept waiting for a record that never came'
    assert 0.4 < time.monotonic() - start < 5
    assert outcome == [f'The work directory {str(workdir)!r} is in use by another process; wait '
                       'for that run to finish, stop it, or choose another --workdir.']


def test_a_stale_longer_record_is_replaced_whole(tmp_path):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  stale = json.dumps({'pid': 4000000, 'host': 'a-much-longer-host-name.example.org' * 4}) + '\n'
  (workdir / workdir_lib.LOCK_FILE).write_text(stale)
  with workdir_lib.acquire(workdir) as lock:
    with open(lock.path, encoding='utf-8') as f:
      assert json.load(f) == {'pid': os.getpid(), 'host': socket.gethostname()}


def test_a_refused_acquire_leaves_no_descriptor_open(tmp_path):
  with workdir_lib.acquire(tmp_path / 'w'):
    before = len(os.listdir('/proc/self/fd'))
    for _ in range(3):
      with pytest.raises(ValueError):
        workdir_lib.acquire(tmp_path / 'w')
    assert len(os.listdir('/proc/self/fd')) == before


@pytest.mark.parametrize('record,named', [
    ('{"pid": 7, "host": "node-7"}\n', 'process 7 on node-7'),  # a holder on another machine
    ('[7, "node-7"]', 'another process'),  # valid JSON of another shape
    ('{"pid": 7}', 'another process'),
])
def test_the_holder_is_named_from_its_record(tmp_path, monkeypatch, record, named):
  monkeypatch.setattr(workdir_lib, '_HOLDER_WAIT_S', 0.05)
  workdir = tmp_path / 'w'
  with _held_by_another(workdir, record.encode()):
    with pytest.raises(ValueError) as info:
      workdir_lib.acquire(workdir)
    assert str(info.value) == (f'The work directory {str(workdir)!r} is in use by {named}; wait '
                               'for that run to finish, stop it, or choose another --workdir.')


def test_a_holder_that_finishes_its_record_while_refused_is_named(tmp_path):
  workdir = tmp_path / 'w'
  # The rest of the record follows within the refused run's wait.
  with _held_by_another(workdir, b'{"pid": ') as fd:
    finish = threading.Timer(0.1, lambda: os.pwrite(fd, b'{"pid": 7, "host": "node-7"}\n', 0))
    finish.start()
    with pytest.raises(ValueError, match='is in use by process 7 on node-7; '):
      workdir_lib.acquire(workdir)
    finish.join()


def test_a_lock_the_kernel_refuses_is_one_sentence_and_leaves_no_descriptor_open(tmp_path,
                                                                                 monkeypatch):
  def refuse(*_):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
  monkeypatch.setattr(fcntl, 'flock', refuse)
  before = len(os.listdir('/proc/self/fd'))
  with pytest.raises(ValueError) as info:
    workdir_lib.acquire(tmp_path / 'w')
  assert str(info.value) == (f"The work directory {str(tmp_path / 'w')!r} cannot be locked "
                             '(No locks available).')
  assert len(os.listdir('/proc/self/fd')) == before
