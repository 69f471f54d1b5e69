"""Deterministic grain input pipelines over random-access data sources.

The train stream is an endless sequence of epochs, each a fresh seeded
permutation of the source. Global batch `i` is the stream's elements
`[i*G, (i+1)*G)`; in a run with `P` processes, process `p` reads the elements of
that range whose position is `p` modulo `P`, so processes read disjoint parts
of every global batch and together read exactly the global batch a
single-process run reads. The iterator's state (one integer position) is saved
in checkpoints, so a resumed run sees the batches an uninterrupted run would.
"""

from typing import Callable

import grain
import numpy as np


def _check_batch(global_batch_size: int, process_count: int) -> int:
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(f'The global batch size {global_batch_size} must be a positive multiple '
                     f'of the process count {process_count}.')
  return global_batch_size // process_count


def _stack(records: list[dict]) -> dict:
  return {key: np.stack([r[key] for r in records]) for key in records[0]}


def train_iterator(source, *, global_batch_size: int, seed: int,
                   preprocess: Callable[[dict], dict], process_index: int = 0,
                   process_count: int = 1, num_threads: int = 2,
                   prefetch: int = 8) -> grain.DatasetIterator:
  """Endless iterator of this process's share of each shuffled global batch."""
  local_batch_size = _check_batch(global_batch_size, process_count)
  stream = grain.MapDataset.source(source).shuffle(seed=seed).repeat(None)
  local = stream[process_index::process_count].map(preprocess)
  batches = local.batch(local_batch_size, drop_remainder=True, batch_fn=_stack)
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
  return iter(batches.to_iter_dataset(options))


def eval_batches(source, *, global_batch_size: int, preprocess: Callable[[dict], dict],
                 process_index: int = 0, process_count: int = 1, num_threads: int = 2):
  """One pass over `source` in order, the last global batch padded with `mask` 0.

  Every batch has the full size so the eval step compiles once; metrics weight
  each example by its `mask`.
  """
  local_batch_size = _check_batch(global_batch_size, process_count)
  size = len(source)
  padded = -(-size // global_batch_size) * global_batch_size
  template = preprocess(source[0])

  def record(index):
    if index < size:
      return {**preprocess(source[index]), 'mask': np.int32(1)}
    return {**{k: np.zeros_like(v) for k, v in template.items()}, 'mask': np.int32(0)}

  ds = grain.MapDataset.range(padded)[process_index::process_count].map(record)
  ds = ds.batch(local_batch_size, drop_remainder=True, batch_fn=_stack)
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4)))
