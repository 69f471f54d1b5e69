"""Deterministic grain input pipelines over random-access data sources.

The train stream is an endless sequence of epochs, each a fresh seeded
permutation of the source's indices. Global batch `i` is the stream's elements
`[i*G, (i+1)*G)`; in a run with `P` processes, process `p` reads the elements of
that range whose position is `p` modulo `P`, so processes read disjoint parts
of every global batch and together read exactly the global batch a
single-process run reads. The iterator's state (one integer position) is saved
in checkpoints, so a resumed run sees the batches an uninterrupted run would.

Batches are read whole: the pipeline computes each batch's *indices* at once
(epoch `e` is the permutation drawn from the seed sequence `(seed, e)`), gathers
them with one call (sources with a `gather` method, such as `InMemorySource`
and `data.text.TokenWindows`, slice NumPy arrays; TFDS sources answer
`__getitems__`) and preprocesses the batch at once, so the per-example
Python work is nil.
"""

import functools
import numbers
import sys
from typing import Callable

import grain
import numpy as np

_CHUNK = 4096


def _stack(records: list[dict]) -> dict:
  return {key: np.stack([np.asarray(r[key]) for r in records]) for key in records[0]}


def read_batch(source, indices: np.ndarray) -> dict:
  """The records `indices` of `source` as a dict of stacked arrays."""
  if hasattr(source, 'gather'):
    return source.gather(indices)
  indices = [int(i) for i in indices]
  if hasattr(source, '__getitems__'):
    return _stack(source.__getitems__(indices))
  return _stack([source[i] for i in indices])


class InMemorySource:
  """A data split held as stacked NumPy arrays, for data sets that fit in memory."""

  def __init__(self, source):
    chunks = [read_batch(source, np.arange(start, min(start + _CHUNK, len(source))))
              for start in range(0, len(source), _CHUNK)]
    self.arrays = {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}
    self._len = len(source)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> dict:
    return {key: value[index] for key, value in self.arrays.items()}

  def gather(self, indices: np.ndarray) -> dict:
    return {key: value[indices] for key, value in self.arrays.items()}


def _check_batch(global_batch_size: int, process_count: int, process_index: int) -> int:
  if not isinstance(process_count, numbers.Integral) or process_count < 1:
    raise ValueError(f'The process count must be a positive integer, got {process_count!r}.')
  if not isinstance(process_index, numbers.Integral) or not 0 <= process_index < process_count:
    raise ValueError(f'The process index {process_index!r} must be an integer in '
                     f'[0, {process_count}), the process count.')
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(f'The global batch size {global_batch_size} must be a positive multiple '
                     f'of the process count {process_count}.')
  return global_batch_size // process_count


def train_iterator(source, *, global_batch_size: int, seed: int,
                   preprocess: Callable[[dict], dict], process_index: int = 0,
                   process_count: int = 1, num_threads: int = 2,
                   prefetch: int = 8) -> grain.DatasetIterator:
  """Endless iterator of this process's share of each shuffled global batch.

  `preprocess` maps a batch (dict of stacked arrays) to the model's batch.
  """
  _check_batch(global_batch_size, process_count, process_index)
  size = len(source)
  if size == 0:
    raise ValueError('The training source holds no examples; it needs at least one to draw '
                     'batches from.')

  @functools.lru_cache(maxsize=4)
  def permutation(epoch: int) -> np.ndarray:
    return np.random.default_rng((seed, epoch)).permutation(size)

  def local_indices(batch_number: int) -> np.ndarray:
    positions = np.arange(batch_number * global_batch_size + process_index,
                          (batch_number + 1) * global_batch_size, process_count)
    epochs, offsets = np.divmod(positions, size)
    indices = np.empty_like(positions)
    for epoch in np.unique(epochs):  # a batch spans at most a few epochs
      where = epochs == epoch
      indices[where] = permutation(int(epoch))[offsets[where]]
    return indices

  batches = grain.MapDataset.range(sys.maxsize).map(
      lambda b: preprocess(read_batch(source, local_indices(b))))
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
  return iter(batches.to_iter_dataset(options))


def eval_batches(source, *, global_batch_size: int, preprocess: Callable[[dict], dict],
                 process_index: int = 0, process_count: int = 1, num_threads: int = 2):
  """One pass over `source` in order, the last global batch padded with `mask` 0.

  Every batch has the full size so the eval step compiles once; metrics weight
  each example by its `mask`.
  """
  local_batch_size = _check_batch(global_batch_size, process_count, process_index)
  size = len(source)
  padded = -(-size // global_batch_size) * global_batch_size

  def read(indices):
    mask = (indices < size).astype(np.int32)
    # Padding rows repeat record 0 and are masked out of every metric.
    return {**preprocess(read_batch(source, np.where(mask == 1, indices, 0))), 'mask': mask}

  ds = grain.MapDataset.range(padded)[process_index::process_count]
  ds = ds.batch(local_batch_size, drop_remainder=True).map(read)
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4)))
