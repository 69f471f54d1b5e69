"""Metric sinks: console progress, TensorBoard event files, and a JSON-lines file.

Only process 0 writes. `metrics.jsonl` in the work directory gets one JSON
object per record, `{"step": ..., "split": "train"|"eval", name: value, ...}`;
a resumed run first drops the records of steps after its checkpoint, then
appends, and starts its TensorBoard event file with a purge of those steps
(which TensorBoard then hides from earlier files), so no step is recorded twice.
Eval-hook outputs (`write_outputs`) are scalars, text or images: text and images
also go to TensorBoard and to `samples/<name>_<step>.txt|png` in the work directory.
"""

import contextlib
import json
import os
import sys
import time

import jax
import numpy as np

# What a run records in its work directory; set aside with the checkpoints when none
# of them can be restored (`checkpoint.Checkpointer.restore_latest`).
RECORDS = ('metrics.jsonl', 'tensorboard', 'samples')


class MetricWriter:
  """Writes scalar metrics to the console, TensorBoard and `metrics.jsonl`."""

  def __init__(self, workdir: str, total_steps: int, start_step: int = 0):
    """A run that resumes at `start_step` first drops the records of later steps that an
    interrupted session wrote (those steps run again) from `metrics.jsonl` and purges
    them from TensorBoard, so no step is recorded twice."""
    self.enabled = jax.process_index() == 0
    self.workdir = workdir
    self.total_steps = total_steps
    self.start_step = start_step
    self.start_time = time.time()
    self._tb = None
    self._jsonl = None
    self._kept = set()
    if self.enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # TensorBoard hides the events of steps >= purge_step written before this file. The
      # file is named by the second it opens; the suffix keeps a session opened in the same
      # second from overwriting an earlier session's file.
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'), purge_step=start_step + 1,
                               filename_suffix=f'.{time.time_ns()}')
      path = os.path.join(workdir, 'metrics.jsonl')
      self._kept = _drop_records_after(path, start_step)
      self._jsonl = open(path, 'a', encoding='utf-8')

  def recorded(self, step: int, split: str) -> bool:
    """Whether `metrics.jsonl` held a `split` record of `step` (at most `start_step`) when
    this writer opened it (always False outside process 0)."""
    return (step, split) in self._kept

  def write(self, step: int, split: str, metrics: dict) -> None:
    with self._reporting_write_errors():
      self._write(step, split, metrics)

  @contextlib.contextmanager
  def _reporting_write_errors(self):
    try:
      yield
    except OSError as e:
      raise ValueError(f'Writing the metrics in {self.workdir!r} failed ({e.strerror or e}); '
                       'free space or fix permissions and rerun.') from e

  def _write(self, step: int, split: str, metrics: dict) -> None:
    if not self.enabled:
      return
    scalars = {name: float(np.asarray(value)) for name, value in metrics.items()}
    for name, value in scalars.items():
      self._tb.add_scalar(f'{split}/{name}', value, step)
    self._jsonl.write(json.dumps({'step': step, 'split': split, **scalars}) + '\n')
    self._jsonl.flush()
    self._print(step, split, scalars)

  def _print(self, step: int, split: str, scalars: dict) -> None:
    fraction = step / max(self.total_steps, 1)
    bar = ('#' * int(20 * fraction)).ljust(20, '.')
    elapsed = time.time() - self.start_time
    # This session's rate: a resumed run has only run `step - start_step` steps.
    done_here = step - self.start_step
    eta = elapsed / done_here * (self.total_steps - step) if done_here > 0 else float('nan')
    shown = ' '.join(f'{k}={_format(v)}' for k, v in scalars.items())
    print(f'[{bar}] {step}/{self.total_steps} {split}: {shown} | {elapsed:.0f}s elapsed, '
          f'eta {eta:.0f}s', file=sys.stderr, flush=True)

  def write_outputs(self, step: int, outputs: dict) -> None:
    """Writes an eval hook's outputs: numbers as eval scalars, text and images as samples."""
    if not self.enabled or not outputs:
      return
    scalars = {k: v for k, v in outputs.items() if np.ndim(v) == 0 and not isinstance(v, str)}
    if scalars:
      self.write(step, 'eval', scalars)
    with self._reporting_write_errors():
      self._write_samples(step, outputs, scalars)

  def _write_samples(self, step: int, outputs: dict, scalars: dict) -> None:
    folder = os.path.join(self.workdir, 'samples')
    for name, value in outputs.items():
      if name in scalars:
        continue
      os.makedirs(folder, exist_ok=True)
      if isinstance(value, str):
        self._tb.add_text(f'samples/{name}', value, step)
        with open(os.path.join(folder, f'{name}_{step}.txt'), 'w', encoding='utf-8') as f:
          f.write(value)
        print(f'{name} at step {step}:\n{value}', file=sys.stderr, flush=True)
      else:  # an image [H, W, C] with values in [0, 1]
        image = np.clip(np.asarray(value, np.float32), 0, 1)
        self._tb.add_image(f'samples/{name}', image, step, dataformats='HWC')
        import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
        plt.imsave(os.path.join(folder, f'{name}_{step}.png'), image.squeeze(-1) if image.shape[-1] == 1
                   else image, cmap='gray', vmin=0, vmax=1)
        print(f'{name} at step {step}: {os.path.join(folder, f"{name}_{step}.png")}',
              file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.enabled:
      with self._reporting_write_errors():
        try:
          self._tb.close()
        finally:
          self._jsonl.close()


def _format(value: float) -> str:
  return f'{value:.4g}' if abs(value) < 1e5 else f'{value:.3e}'


def _drop_records_after(path: str, step: int) -> set:
  """Rewrites `path` without records of steps after `step`, nor a torn last line (atomically);
  returns the (step, split) of each record kept."""
  if not os.path.exists(path):
    return set()
  with open(path, encoding='utf-8') as f:
    lines = f.readlines()
  kept, records = [], set()
  for line in lines:
    try:
      record = json.loads(line)
      if record['step'] <= step and line.endswith('\n'):
        kept.append(line)
        records.add((record['step'], record.get('split')))
    except (ValueError, KeyError, TypeError):
      pass  # the torn last line of a killed run holds no whole record

  if len(kept) < len(lines):
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      f.writelines(kept)
    os.replace(path + '.tmp', path)
  return records
