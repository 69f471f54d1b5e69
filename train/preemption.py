"""Stopping a run cleanly on SIGTERM (what a cluster sends before preempting) or Ctrl-C.

While installed, the first SIGTERM or SIGINT only sets `requested`: the loop
finishes the step under way, saves a checkpoint and stops with
`stopped at step N; rerun the same command to resume`. A second SIGINT exits at
once, without saving (the last checkpoint stays as it was).
"""

import os
import signal
import sys
import threading


class StopRequest:
  """Records the first stop signal; a context manager that installs the handlers."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signal_number = None
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self.signal_number is not None

  @property
  def exit_code(self) -> int | None:
    """128 + the signal number, the shell's convention for a run ended by a signal."""
    return 128 + self.signal_number if self.requested else None

  def _handle(self, number, frame):
    del frame
    if self.requested and number == signal.SIGINT:
      print('interrupted again: exiting without saving', file=sys.stderr, flush=True)
      os._exit(128 + number)  # pylint: disable=protected-access
    if not self.requested:
      self.signal_number = number
      print(f'{signal.Signals(number).name} received: finishing this step and saving a '
            'checkpoint (Ctrl-C again to exit at once)', file=sys.stderr, flush=True)

  def __enter__(self):
    # Handlers can only be installed from the main thread; elsewhere (e.g. a
    # run started from a worker thread) signals keep their default effect.
    if threading.current_thread() is threading.main_thread():
      for number in self.SIGNALS:
        self._previous[number] = signal.signal(number, self._handle)
    return self

  def __exit__(self, *exc):
    for number, handler in self._previous.items():
      signal.signal(number, handler)
    self._previous = {}
    return False
