"""The grain input pipeline: deterministic, disjoint per process, resumable."""

import numpy as np
import pytest

from data import pipeline


def _source(n=50):
  return [{'x': np.float32(i), 'label': np.int64(i % 3)} for i in range(n)]


def _preprocess(batch):
  return {'input': np.asarray(batch['x'], np.float32), 'label': np.asarray(batch['label'], np.int32)}


def _batches(iterator, n):
  return [next(iterator)['input'].astype(int).tolist() for _ in range(n)]


def test_epochs_are_permutations_and_seeded():
  it = pipeline.train_iterator(_source(), global_batch_size=10, seed=1, preprocess=_preprocess)
  batches = _batches(it, 15)  # three epochs of 50
  for epoch in range(3):
    assert sorted(sum(batches[5 * epoch:5 * epoch + 5], [])) == list(range(50))
  assert sum(batches[0:5], []) != sum(batches[5:10], [])  # each epoch reshuffled
  again = pipeline.train_iterator(_source(), global_batch_size=10, seed=1, preprocess=_preprocess)
  assert _batches(again, 15) == batches
  other = pipeline.train_iterator(_source(), global_batch_size=10, seed=2, preprocess=_preprocess)
  assert _batches(other, 5) != batches[:5]


def test_batches_that_span_two_epochs_keep_each_epoch_a_permutation():
  # 37 records in batches of 8: most epochs begin inside a batch.
  it = pipeline.train_iterator(_source(37), global_batch_size=8, seed=5, preprocess=_preprocess)
  stream = sum(_batches(it, 37), [])  # eight epochs of 37
  epochs = [stream[37 * e:37 * e + 37] for e in range(8)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(37))
  for previous, following in zip(epochs, epochs[1:]):
    assert previous != following  # each epoch reshuffled


@pytest.mark.parametrize('process_count', [2, 5])
def test_processes_read_disjoint_parts_of_each_global_batch(process_count):
  single = _batches(pipeline.train_iterator(_source(), global_batch_size=10, seed=3,
                                            preprocess=_preprocess), 12)
  parts = [_batches(pipeline.train_iterator(_source(), global_batch_size=10, seed=3,
                                            preprocess=_preprocess, process_index=p,
                                            process_count=process_count), 12)
           for p in range(process_count)]
  for i, global_batch in enumerate(single):
    local = [parts[p][i] for p in range(process_count)]
    assert all(len(l) == 10 // process_count for l in local)
    assert sorted(sum(local, [])) == sorted(global_batch)  # disjoint and complete


def test_restored_state_replays_the_same_batches():
  it = pipeline.train_iterator(_source(), global_batch_size=8, seed=0, preprocess=_preprocess)
  _batches(it, 7)
  state = it.get_state()
  expected = _batches(it, 9)
  fresh = pipeline.train_iterator(_source(), global_batch_size=8, seed=0, preprocess=_preprocess)
  fresh.set_state(state)
  assert _batches(fresh, 9) == expected


def test_eval_batches_pad_and_mask():
  batches = list(pipeline.eval_batches(_source(23), global_batch_size=10, preprocess=_preprocess))
  assert len(batches) == 3 and all(len(b['mask']) == 10 for b in batches)
  mask = np.concatenate([b['mask'] for b in batches])
  values = np.concatenate([b['input'] for b in batches])
  assert mask.sum() == 23
  assert values[mask == 1].astype(int).tolist() == list(range(23))


@pytest.mark.parametrize('size, expected_batches', [(20, 2), (1, 1), (10, 1), (11, 2)])
def test_eval_batches_are_ceil_of_size_over_batch_and_add_no_empty_batch(size, expected_batches):
  # ceil(size / 10) batches: a size that is a multiple of the batch gets no all-padding batch.
  batches = list(pipeline.eval_batches(_source(size), global_batch_size=10, preprocess=_preprocess))
  assert len(batches) == expected_batches
  mask = np.concatenate([b['mask'] for b in batches])
  np.testing.assert_array_equal(mask, np.arange(10 * expected_batches) < size)


def test_batch_not_divisible_by_processes():
  with pytest.raises(ValueError, match='global batch size 10 must be a positive multiple of the process count 3'):
    pipeline.train_iterator(_source(), global_batch_size=10, seed=0, preprocess=_preprocess,
                            process_count=3)


def test_in_memory_source_reads_the_same_records():
  source = _source(30)
  memory = pipeline.InMemorySource(source)
  assert len(memory) == 30
  indices = np.array([29, 0, 7, 7])
  np.testing.assert_array_equal(memory.gather(indices)['x'], [29, 0, 7, 7])
  np.testing.assert_array_equal(pipeline.read_batch(source, indices)['label'], [2, 0, 1, 1])
  a = _batches(pipeline.train_iterator(source, global_batch_size=6, seed=4, preprocess=_preprocess), 8)
  b = _batches(pipeline.train_iterator(memory, global_batch_size=6, seed=4, preprocess=_preprocess), 8)
  assert a == b


def test_epoch_e_is_the_permutation_of_the_seed_sequence_seed_e():
  # The documented stream: epoch e is default_rng((seed, e)).permutation(n), read in order.
  n, seed = 12, 7
  it = pipeline.train_iterator(_source(n), global_batch_size=4, seed=seed, preprocess=_preprocess)
  stream = sum(_batches(it, 9), [])  # three epochs
  expected = np.concatenate([np.random.default_rng((seed, e)).permutation(n) for e in range(3)])
  assert stream == expected.tolist()


@pytest.mark.parametrize('process_count', [2, 4])
def test_process_p_reads_the_positions_p_modulo_process_count(process_count):
  single = _batches(pipeline.train_iterator(_source(), global_batch_size=8, seed=3,
                                            preprocess=_preprocess), 9)
  for p in range(process_count):
    local = _batches(pipeline.train_iterator(_source(), global_batch_size=8, seed=3,
                                             preprocess=_preprocess, process_index=p,
                                             process_count=process_count), 9)
    assert local == [global_batch[p::process_count] for global_batch in single]


@pytest.mark.parametrize('process_count', [2, 5])
def test_eval_batches_split_each_global_batch_over_processes(process_count):
  # 23 records in global batches of 10: process p's batch i holds positions 10 i + p,
  # 10 i + p + P, ... of the padded pass; together they read every record once.
  parts = [list(pipeline.eval_batches(_source(23), global_batch_size=10, preprocess=_preprocess,
                                      process_index=p, process_count=process_count))
           for p in range(process_count)]
  for p, batches in enumerate(parts):
    assert len(batches) == 3
    for i, batch in enumerate(batches):
      positions = np.arange(10 * i + p, 10 * (i + 1), process_count)
      np.testing.assert_array_equal(batch['mask'], positions < 23)
      np.testing.assert_array_equal(batch['input'][batch['mask'] == 1], positions[positions < 23])
  seen = np.concatenate([b['input'][b['mask'] == 1] for batches in parts for b in batches])
  assert sorted(seen.astype(int).tolist()) == list(range(23))


def test_zero_global_batch_size_is_refused():
  with pytest.raises(ValueError, match='global batch size 0 must be a positive multiple'):
    pipeline.train_iterator(_source(), global_batch_size=0, seed=0, preprocess=_preprocess)
  with pytest.raises(ValueError, match='global batch size 0 must be a positive multiple'):
    pipeline.eval_batches(_source(), global_batch_size=0, preprocess=_preprocess)


def test_in_memory_source_reads_across_chunk_boundaries(monkeypatch):
  monkeypatch.setattr(pipeline, '_CHUNK', 7)
  memory = pipeline.InMemorySource(_source(30))  # chunks of 7, 7, 7, 7 and 2 records
  assert len(memory) == 30
  np.testing.assert_array_equal(memory.arrays['x'], np.arange(30))
  np.testing.assert_array_equal(memory.arrays['label'], np.arange(30) % 3)


class _BatchReadSource(list):
  """A source answering `__getitems__` (as TFDS sources do), with no `gather`."""

  def __getitems__(self, indices):
    return [self[i] for i in indices]


def test_a_source_read_through_getitems_keeps_the_order_of_the_indices():
  # The records come back in the order asked for, not sorted: a shuffled batch stays shuffled
  # and an evaluation batch's mask stays on its padding rows.
  source = _BatchReadSource(_source(30))
  batch = pipeline.read_batch(source, np.array([29, 0, 7, 7, 3]))
  np.testing.assert_array_equal(batch['x'], [29, 0, 7, 7, 3])
  np.testing.assert_array_equal(batch['label'], [2, 0, 1, 1, 0])
  expected = _batches(pipeline.train_iterator(_source(30), global_batch_size=6, seed=4,
                                              preprocess=_preprocess), 8)
  assert _batches(pipeline.train_iterator(source, global_batch_size=6, seed=4,
                                          preprocess=_preprocess), 8) == expected


@pytest.mark.parametrize('process_index', [2, -1])
def test_a_process_index_outside_the_process_count_is_refused(process_index):
  # Process 2 of 2 used to read a batch of 1 record instead of 2 (positions 2, 4, … of a
  # global batch of 4 stop at 3), and the evaluation batches of another slice of the split.
  message = (rf'The process index {process_index} must be an integer in \[0, 2\), the process '
             r'count\.')
  with pytest.raises(ValueError, match=message):
    pipeline.train_iterator(_source(), global_batch_size=4, seed=0, preprocess=_preprocess,
                            process_index=process_index, process_count=2)
  with pytest.raises(ValueError, match=message):
    pipeline.eval_batches(_source(), global_batch_size=4, preprocess=_preprocess,
                          process_index=process_index, process_count=2)


def test_an_empty_training_source_is_refused_when_the_iterator_is_made():
  # It used to divide by zero and fail at the first batch with an IndexError inside grain.
  with pytest.raises(ValueError, match='The training source holds no examples; it needs at '
                                       'least one to draw batches from.'):
    pipeline.train_iterator([], global_batch_size=4, seed=0, preprocess=_preprocess)
