"""One run per work directory: an OS file lock on `<workdir>/.lock`.

    with workdir.acquire('/tmp/digits_mlp'):
      ...  # a second `acquire` of that directory, from any process, raises ValueError

The lock is `fcntl.flock` (exclusive, non-blocking) on an open file, so the
kernel drops it when its holder exits, however it exits: a run killed with
SIGKILL leaves the file but not the lock, and the next run takes it. The file
records the holder's pid and host, only to name them when another run is
refused. In a multi-process run the caller decides who locks: process 0 only,
since every process of one run shares the work directory.
"""

import fcntl
import json
import os
import socket
import time

LOCK_FILE = '.lock'
# The holder writes its pid just after taking the lock; a refused run waits this
# long for it so that the message can name the holder.
_HOLDER_WAIT_S = 0.5


class Lock:
  """A held lock on a work directory; `release()` (or leaving a `with` block) frees it."""

  def __init__(self, workdir: str, fd: int):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_FILE)
    self._fd = fd
    self._owner = os.getpid()

  @property
  def held(self) -> bool:
    return self._fd is not None

  def release(self) -> None:
    """Frees the lock; later calls do nothing. The file stays: removing it would let a
    process that opened the old file and one that creates a new one both hold a lock."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      if os.getpid() == self._owner:  # a forked child's copy must not erase the record
        os.ftruncate(fd, 0)  # a stale pid would only mislead a reader
    finally:
      os.close(fd)  # closing the last descriptor drops the flock

  def __enter__(self) -> 'Lock':
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()

  def __del__(self):
    # A run dropped without release() (e.g. in a notebook) does not keep its
    # directory locked until the interpreter exits.
    if getattr(self, '_fd', None) is not None:
      self.release()

  def __repr__(self) -> str:
    return f'Lock({self.workdir!r}, held={self.held})'


def acquire(workdir: str | os.PathLike) -> Lock:
  """Locks `workdir` (created if missing) for this process, or raises ValueError in one
  sentence naming the directory and the pid and host of the run that holds it."""
  workdir = os.path.abspath(os.fspath(workdir))
  path = os.path.join(workdir, LOCK_FILE)
  try:
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise ValueError(f'The work directory {workdir!r} cannot be locked ({e.strerror}).') from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _read_holder(fd)
    os.close(fd)
    raise ValueError(f'The work directory {workdir!r} is in use by {holder}; wait for that run '
                     'to finish, stop it, or choose another --workdir.') from None
  except OSError as e:
    os.close(fd)
    raise ValueError(f'The work directory {workdir!r} cannot be locked ({e.strerror}).') from None
  record = json.dumps({'pid': os.getpid(), 'host': socket.gethostname()}) + '\n'
  os.ftruncate(fd, 0)
  os.pwrite(fd, record.encode(), 0)
  return Lock(workdir, fd)


def _read_holder(fd: int) -> str:
  """'process PID on HOST' from the lock file, or a vaguer phrase if it says nothing yet."""
  deadline = time.monotonic() + _HOLDER_WAIT_S
  while True:
    try:
      holder = json.loads(os.pread(fd, 4096, 0).decode())
      return f"process {int(holder['pid'])} on {holder['host']}"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
      if time.monotonic() >= deadline:
        return 'another process'
      time.sleep(0.05)
