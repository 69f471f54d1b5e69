"""Verified checkpoints: the digest against a brute-force reference, and every kind of damage
(truncated or overwritten array data, missing or garbled metadata, garbled iterator state,
a half-written newer step) falls back to the newest good checkpoint, bit-identical, and sets
the damaged one aside with one warning line, deleting nothing; a read failing for a reason
outside the checkpoint (too many open files, an I/O error, memory) sets nothing aside."""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler
import pytest

from tests.messages import assert_one_sentence, one_sentence
from tests.subprocess_util import REPO_ROOT, run_python
from train import checkpoint
from train import metrics

_STEPS = (1, 2, 3)


@flax.struct.dataclass
class _State:
  step: jax.Array
  params: dict
  rng: jax.Array


def _make_state(step: int) -> _State:
  """A small train-state-like pytree whose values depend on `step`."""
  r = np.random.default_rng(step)
  params = {'dense': {'kernel': jnp.asarray(r.normal(size=(48, 40)), jnp.float32),
                      'bias': jnp.asarray(r.normal(size=(40,)), jnp.float32)},
            'norm': {'scale': jnp.asarray(r.normal(size=(16,)), jnp.bfloat16)}}
  return _State(step=jnp.int32(step), params=params, rng=jax.random.PRNGKey(step))


def _data_state(step: int) -> dict:
  return {'iterator': {'next_index': 10 * step, 'epoch': 0}}


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _assert_bit_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert (x.dtype, x.shape) == (y.dtype, y.shape)
    assert x.tobytes() == y.tobytes()


def _checkpointer(workdir):
  return checkpoint.Checkpointer(str(workdir), every_steps=1, keep=3)


def _save(ckpt, steps):
  for step in steps:
    assert ckpt.save(step, _make_state(step), _data_state(step))
  ckpt.wait()


@pytest.fixture(scope='module')
def template(tmp_path_factory):
  """A work directory with checkpoints of steps 1, 2, 3, written once for the module."""
  workdir = tmp_path_factory.mktemp('template')
  ckpt = _checkpointer(workdir)
  _save(ckpt, _STEPS)
  ckpt.close()
  return workdir


@pytest.fixture
def workdir(template, tmp_path):
  path = tmp_path / 'run'
  shutil.copytree(template, path)
  return path


def _step_dir(workdir, step):
  return os.path.join(workdir, 'checkpoints', str(step))


def _file_count(workdir):
  return sum(len(files) for _, _, files in os.walk(workdir))


def _set_aside(workdir):
  directory = os.path.join(workdir, 'checkpoints_set_aside')
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def _warnings_naming(caplog, path):
  return [r.getMessage() for r in caplog.records
          if r.levelname == 'WARNING' and path in r.getMessage()]


# Digest ------------------------------------------------------------------------------


def _mix32(h: int) -> int:
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & 0xFFFFFFFF
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & 0xFFFFFFFF
  return h ^ (h >> 16)


def _reference_checksums(x: np.ndarray) -> list[int]:
  """Σ_i (mix(i ⊕ seed) | 1) · mix(w_i) mod 2^32, one Python integer at a time over the
  little-endian words w_i of `x` (bool as 0/1, 8- and 16-bit values zero-extended, a complex
  value as its real word then its imaginary one)."""
  x = np.ascontiguousarray(x)
  if x.dtype == np.bool_:
    words = x.astype(np.uint32)
  else:
    unsigned = {1: np.uint8, 2: np.uint16}.get(x.dtype.itemsize, np.uint32)
    words = x.view(unsigned) if x.ndim else x.reshape(1).view(unsigned)
  sums = []
  for seed in (0x243F6A88, 0x85A308D3):
    total = 0
    for i, w in enumerate(words.reshape(-1).tolist()):
      total += (_mix32(i ^ seed) | 1) * _mix32(int(w))
    sums.append(total % 2**32)
  return sums


@pytest.mark.parametrize('dtype,shape', [
    (jnp.float32, (7, 5)), (jnp.bfloat16, (3, 4, 2)), (jnp.float16, (9,)), (jnp.int32, ()),
    (jnp.uint32, (2,)), (jnp.bool_, (6, 3)), (jnp.int8, (5,)), (jnp.complex64, (3, 2)),
])
def test_checksums_match_a_brute_force_reference(dtype, shape):
  # Would fail with a wrong flat index (strides), a bitcast of the wrong width, or sums that
  # overflow into a wider type. A complex value is its real and imaginary words in turn.
  r = np.random.default_rng(0)
  x = jnp.asarray(r.normal(size=shape) * 100).astype(dtype)
  if jnp.issubdtype(dtype, jnp.complexfloating):
    x = x + 1j * jnp.asarray(r.normal(size=shape), dtype)
  entry = checkpoint.array_digest({'x': x})['x']
  assert entry == {'shape': list(shape), 'dtype': np.dtype(dtype).name,
                   'checksum': _reference_checksums(np.asarray(x))}


def test_digest_sees_every_leaf_every_position_and_high_bits():
  state = _make_state(1)
  base = checkpoint.array_digest(state)
  names = sorted(base)
  assert names == ['params/dense/bias', 'params/dense/kernel', 'params/norm/scale', 'rng', 'step']
  # One changed element in any one leaf changes exactly that leaf's entry (a digest that
  # skipped a leaf, e.g. the integer ones, would miss it).
  for name in names:
    def bump(path, x, name=name):
      if jax.tree_util.keystr(path, simple=True, separator='/') != name:
        return x
      return x.at[(0,) * x.ndim].add(1).astype(x.dtype)
    changed = checkpoint.array_digest(jax.tree_util.tree_map_with_path(bump, state))
    assert [n for n in names if changed[n] != base[n]] == [name]
  kernel = np.asarray(state.params['dense']['kernel'])
  digest = lambda k: checkpoint.array_digest({'k': jnp.asarray(k)})['k']
  # Two values swapped: same multiset of words, so a position-blind sum would not notice.
  swapped = kernel.copy()
  swapped[[0, 7], [3, 1]] = swapped[[7, 0], [1, 3]]
  assert digest(swapped)['checksum'] != digest(kernel)['checksum']
  # Two sign bits flipped: Σ m_i w_i with odd m_i sees only the parity of the top bits.
  negated = kernel.copy()
  negated[0, 0], negated[5, 9] = -negated[0, 0], -negated[5, 9]
  assert digest(negated)['checksum'] != digest(kernel)['checksum']
  # Same bits under another shape or dtype.
  assert digest(kernel.reshape(40, 48))['shape'] == [40, 48]
  assert digest(kernel.view(np.int32))['dtype'] == 'int32'


def test_iterator_digest_is_canonical_json():
  a = {'iterator': {'next_index': 3, 'order': (1, 2)}, 'epoch': 0}
  b = {'epoch': 0, 'iterator': {'order': [1, 2], 'next_index': 3}}  # as it reads back from JSON
  assert checkpoint.data_digest(a) == checkpoint.data_digest(b)
  assert checkpoint.data_digest(a) != checkpoint.data_digest({**a, 'epoch': 1})
  # Integer keys read back as strings, which sort otherwise ('10' < '9'): the digest of what
  # was saved must still match what reads back.
  shards = {'shards': {9: 'b', 10: 'a'}}
  assert checkpoint.data_digest(shards) == checkpoint.data_digest(json.loads(json.dumps(shards)))


def test_one_flipped_bit_of_one_element_changes_both_checksums():
  # Whichever element (the first, the last), bit (the lowest, the sign bit) and dtype.
  checksums = jax.jit(jax.vmap(checkpoint._checksums))  # pylint: disable=protected-access
  r = np.random.default_rng(1)
  for dtype in (np.float32, jnp.bfloat16, np.int32, np.uint16, np.int8, np.bool_):
    x = (r.normal(size=(3, 5)) * 50).astype(dtype)
    variants = [x]
    for index in ((0, 0), (2, 4)):
      for bit in (0,) if dtype == np.bool_ else (0, 8 * x.itemsize - 1):
        y = x.copy()
        y.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.itemsize])[index] ^= 1 << bit
        variants.append(y)
    sums = np.asarray(checksums(jnp.asarray(np.stack(variants))))
    assert (sums[1:] != sums[0]).all(), (np.dtype(dtype).name, sums)


def test_64_bit_host_arrays_digest_every_word_without_x64():
  # restore_arrays digests NumPy arrays: wider than 32 bits, they must not be narrowed (as jit
  # would without x64) before their words are summed.
  for x in (np.arange(-6, 6).reshape(3, 4) * 1e9 + 0.25,
            np.arange(12, dtype=np.int64).reshape(3, 4) << 40 | 7):
    entry = checkpoint.array_digest({'x': x})['x']
    assert entry == {'shape': [3, 4], 'dtype': x.dtype.name, 'checksum': _reference_checksums(x)}


def test_digest_mismatch_sees_an_emptied_iterator_state_and_a_missing_array():
  mismatch = checkpoint._digest_mismatch  # pylint: disable=protected-access
  state = {'params': {'w': jnp.arange(3.0)}}
  digest = {'arrays': checkpoint.array_digest(state),
            'data_sha256': checkpoint.data_digest(_data_state(1))}
  assert mismatch(state, _data_state(1), digest) is None
  assert mismatch(state, None, digest) is None  # restore_arrays reads no iterator state
  assert mismatch(state, {}, digest) == (
      'does not match its digest: the iterator state differs from what was saved')
  # An array the digest records but the read did not return (e.g. dropped from the metadata).
  fewer = {'params': {}}
  assert mismatch(fewer, _data_state(1), digest) == (
      'does not match its digest: array params/w differs from what was saved')


_X64_DIGEST = '''
import json
import jax
jax.config.update('jax_enable_x64', True)
import jax.numpy as jnp, numpy as np
from tests.train.test_checkpoint import _reference_checksums
from train import checkpoint
out = {}
for dtype in ('float64', 'int64', 'uint64'):
  x = (np.arange(-6, 6).reshape(3, 4) * 1e9 + 0.25).astype(dtype)
  on_device = checkpoint.array_digest({'x': jnp.asarray(x)})['x']
  on_host = checkpoint.array_digest({'x': x})['x']  # the path restore_arrays takes
  out[dtype] = [on_device == on_host, on_device['checksum'] == _reference_checksums(x),
                on_device['dtype']]
print(json.dumps(out))
'''


def test_64_bit_dtypes_digest_like_the_reference():
  # Would fail if 64-bit words were truncated to 32 bits or split in another order on the
  # device than on the host.
  result = run_python(_X64_DIGEST)
  assert result == {d: [True, True, d] for d in ('float64', 'int64', 'uint64')}


# Restoring intact checkpoints ------------------------------------------------------------


def test_save_writes_only_due_steps_unless_forced(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=2, keep=3)
  assert ckpt.save(2, _make_state(2), _data_state(2))
  assert not ckpt.save(3, _make_state(3), _data_state(3))
  assert ckpt.save(5, _make_state(5), _data_state(5), force=True)  # e.g. the last step
  ckpt.close()
  assert sorted(os.listdir(os.path.join(tmp_path, 'checkpoints'))) == ['2', '5']
  assert sorted(os.listdir(_step_dir(tmp_path, 5))) == [
      '_CHECKPOINT_METADATA', 'commit_success.txt', 'data', 'digest', 'state']


def test_no_checkpoints_gives_none(tmp_path):
  ckpt = _checkpointer(tmp_path)
  ckpt.check_compatible(_abstract(_make_state(0)))
  assert ckpt.restore_latest(_abstract(_make_state(0))) is None
  ckpt.close()
  directory = os.path.join(str(tmp_path), 'checkpoints')
  assert one_sentence(lambda: checkpoint.restore_arrays(str(tmp_path)), error=FileNotFoundError) == (
      f'No checkpoint in {directory!r}: the run has saved none.')
  assert one_sentence(lambda: checkpoint.restore_arrays(str(tmp_path), 3),
                      error=FileNotFoundError) == (
      f'No checkpoint of step 3 in {directory!r}; found steps [].')


def test_intact_checkpoints_restore_the_newest_bit_identical(workdir, caplog):
  ckpt = _checkpointer(workdir)
  abstract = _abstract(_make_state(0))
  ckpt.check_compatible(abstract)
  state, data_state, step = ckpt.restore_latest(abstract)
  assert step == 3 and data_state == _data_state(3)
  _assert_bit_identical(state, _make_state(3))
  older, older_data = ckpt.restore(abstract, step=1)
  _assert_bit_identical(older, _make_state(1))
  assert older_data == _data_state(1)
  ckpt.close()
  arrays = checkpoint.restore_arrays(str(workdir))
  _assert_bit_identical(arrays['params'], _make_state(3).params)
  assert not _set_aside(workdir) and not [r for r in caplog.records if r.levelname == 'WARNING']


def test_a_changed_config_stops_without_setting_anything_aside(workdir):
  # Would fail if a shape mismatch counted as damage: a good run's checkpoints would be moved.
  wider = _make_state(0).replace(params={**_make_state(0).params, 'extra': jnp.zeros(3)})
  ckpt = _checkpointer(workdir)
  for call in (ckpt.check_compatible, ckpt.restore_latest):
    with pytest.raises(ValueError, match=r"checkpoint '.*/3' does not fit this config: "
                                         r'params/extra is absent there but float32 \(3,\) here'):
      call(_abstract(wider))
  ckpt.close()
  assert not _set_aside(workdir) and sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == [
      '1', '2', '3']


def test_checkpoint_without_digest_restores_unverified(tmp_path, caplog):
  # Checkpoints written before digests existed must keep resuming their runs.
  manager = ocp.CheckpointManager(str(tmp_path / 'checkpoints'), item_names=('state', 'data'))
  manager.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(_make_state(5)),
                                          data=ocp.args.JsonSave(_data_state(5))))
  manager.close()
  ckpt = _checkpointer(tmp_path)
  state, data_state, step = ckpt.restore_latest(_abstract(_make_state(0)))
  ckpt.close()
  assert step == 5 and data_state == _data_state(5)
  _assert_bit_identical(state, _make_state(5))
  assert len(_warnings_naming(caplog, 'no digest')) == 1 and not _set_aside(tmp_path)


# Damage ---------------------------------------------------------------------------------


def _array_data_file(step_dir, process=0):
  """The OCDBT data file holding the array chunks `process` wrote: the largest in its d/ folder."""
  directory = os.path.join(step_dir, 'state', f'ocdbt.process_{process}', 'd')
  return max((os.path.join(directory, f) for f in os.listdir(directory)), key=os.path.getsize)


def _garble(path):
  with open(path, 'wb') as f:
    f.write(b'\x00{"not json' + bytes(range(200, 256)))


def _truncate_array_data(step_dir):
  path = _array_data_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)


def _rewrite_iterator(step_dir):
  """Valid JSON with another position: only the iterator digest can tell."""
  with open(os.path.join(step_dir, 'data', 'metadata'), 'w', encoding='utf-8') as f:
    json.dump({'iterator': {'next_index': 31, 'epoch': 0}}, f)


# damage -> (what it does to the newest checkpoint's folder, the reason it is set aside for)
_DAMAGE = {
    'array data truncated': (_truncate_array_data, 'unreadable'),
    'state _METADATA missing': (
        lambda d: os.remove(os.path.join(d, 'state', '_METADATA')), 'unreadable'),
    'state _METADATA garbled': (
        lambda d: _garble(os.path.join(d, 'state', '_METADATA')), 'unreadable'),
    'OCDBT manifest garbled': (
        lambda d: _garble(os.path.join(d, 'state', 'manifest.ocdbt')), 'unreadable'),
    'iterator JSON garbled': (lambda d: _garble(os.path.join(d, 'data', 'metadata')), 'unreadable'),
    'iterator JSON rewritten': (_rewrite_iterator, 'digest-mismatch'),
    'digest JSON garbled': (lambda d: _garble(os.path.join(d, 'digest', 'metadata')), 'unreadable'),
}


@pytest.mark.parametrize('damage', sorted(_DAMAGE))
def test_damaged_newest_is_set_aside_and_the_previous_restored(workdir, damage, caplog, capfd):
  newest = _step_dir(workdir, 3)
  damage, reason = _DAMAGE[damage]
  damage(newest)
  files = _file_count(workdir)
  ckpt = _checkpointer(workdir)
  ckpt.check_compatible(_abstract(_make_state(0)))
  state, data_state, step = ckpt.restore_latest(_abstract(_make_state(0)))
  assert step == 2 and data_state == _data_state(2)
  _assert_bit_identical(state, _make_state(2))
  # Set aside, not deleted, and named in one warning line.
  assert _set_aside(workdir) == [f'3-{reason}'] and not os.path.exists(newest)
  assert _file_count(workdir) == files
  messages = _warnings_naming(caplog, newest)
  assert len(messages) == 1 and '\n' not in messages[0], messages
  assert f'checkpoints_set_aside/3-{reason}' in messages[0]
  assert 'Traceback' not in capfd.readouterr().err
  assert not [r for r in caplog.records if r.name == 'asyncio']
  # Orbax no longer lists it; a new step 3 can be saved and rotation spares the set-aside one.
  assert ckpt.manager.all_steps() == [1, 2]
  _save(ckpt, (3, 4, 5))
  assert ckpt.manager.all_steps() == [3, 4, 5]
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['3', '4', '5']
  assert _set_aside(workdir) == [f'3-{reason}']
  ckpt.close()
  ckpt = _checkpointer(workdir)
  assert ckpt.restore_latest(_abstract(_make_state(0)))[2] == 5
  ckpt.close()


def _write(path, text):
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)


# Damage raising errors of other kinds than _DAMAGE's: a file missing inside the checkpoint
# (FileNotFoundError, TensorStore's FAILED_PRECONDITION) and metadata that is valid JSON of
# the wrong shape (KeyError, AttributeError, TypeError in Orbax's parsing).
_MORE_DAMAGE = {
    'iterator JSON missing': lambda d: os.remove(os.path.join(d, 'data', 'metadata')),
    'array data file missing': lambda d: os.remove(_array_data_file(d)),
    'state _METADATA an empty object': lambda d: _write(os.path.join(d, 'state', '_METADATA'), '{}'),
    'state _METADATA a list': lambda d: _write(os.path.join(d, 'state', '_METADATA'), '[]'),
    'state _METADATA of wrong types': lambda d: _write(
        os.path.join(d, 'state', '_METADATA'), '{"tree_metadata": {"x": 3}}'),
}


@pytest.mark.parametrize('damage', sorted(_MORE_DAMAGE))
def test_missing_files_and_malformed_metadata_are_damage(workdir, damage):
  _MORE_DAMAGE[damage](_step_dir(workdir, 3))
  ckpt = _checkpointer(workdir)
  ckpt.check_compatible(_abstract(_make_state(0)))
  state, _, step = ckpt.restore_latest(_abstract(_make_state(0)))
  ckpt.close()
  assert step == 2 and _set_aside(workdir) == ['3-unreadable']
  _assert_bit_identical(state, _make_state(2))


def _caused_by(error, cause):
  error.__cause__ = cause
  return error


def _eio_under_orbax():
  """An OSError as Orbax reports it from a failed array read: the cause of a plain Exception."""
  return _caused_by(Exception('Encountered error while reading array index: (slice(0, 48, 1),).'),
                    OSError(errno.EIO, os.strerror(errno.EIO)))


def _emfile():
  return OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def _raised_while_handling(error, first):
  """`error` as raised in an `except` block handling `first` (its __context__, no __cause__)."""
  try:
    try:
      raise first
    except OSError:
      raise error  # pylint: disable=raise-missing-from
  except Exception as e:  # pylint: disable=broad-exception-caught
    return e


# Read failures that say nothing about the checkpoint's content -> how the message names them.
_MACHINE_ERRORS = {
    'EMFILE': (_emfile, 'OSError: [Errno 24] Too many open files'),
    'EACCES': (lambda: PermissionError(errno.EACCES, os.strerror(errno.EACCES)),
               'PermissionError: [Errno 13] Permission denied'),
    'EIO under Orbax': (_eio_under_orbax, 'OSError: [Errno 5] Input/output error'),
    'EMFILE under a ValueError': (
        lambda: _caused_by(ValueError('Failed to read the metadata.'), _emfile()),
        'OSError: [Errno 24] Too many open files'),
    'EMFILE while handling another error': (
        lambda: _raised_while_handling(KeyError('tree_metadata'), _emfile()),
        'OSError: [Errno 24] Too many open files'),
    'MemoryError': (MemoryError, 'MemoryError'),
    'MemoryError under a ValueError': (
        lambda: _caused_by(ValueError('Failed to restore the array.'), MemoryError()),
        'MemoryError'),
    # Neither the data's fault nor the machine's as far as can be told: not damage either.
    'an unexpected error': (lambda: RuntimeError('Event loop is closed'),
                            'RuntimeError: Event loop is closed'),
    'TensorStore RESOURCE_EXHAUSTED': (
        lambda: ValueError('RESOURCE_EXHAUSTED: Error reading "manifest.ocdbt": Too many open files'),
        'ValueError: RESOURCE_EXHAUSTED: Error reading "manifest.ocdbt": Too many open files'),
    'TensorStore PERMISSION_DENIED': (
        lambda: ValueError('PERMISSION_DENIED: Error opening "d/1": Permission denied See full '
                           'TensorStore details: {"driver": "ocdbt"}'),
        'ValueError: PERMISSION_DENIED: Error opening "d/1": Permission denied'),
}


def _contents(root, names=None) -> dict[str, bytes]:
  """{path relative to `root`: bytes} of every file under `root` (or its entries `names`)."""
  found = {}
  for name in names or os.listdir(root):
    top = os.path.join(root, name)
    for folder, _, files in [(root, [], [name])] if os.path.isfile(top) else os.walk(top):
      for file in files:
        path = os.path.join(folder, file)
        with open(path, 'rb') as f:
          found[os.path.relpath(path, root)] = f.read()
  return found


@pytest.mark.parametrize('where', ['metadata', 'arrays'])
@pytest.mark.parametrize('error', sorted(_MACHINE_ERRORS))
def test_a_read_failing_outside_the_checkpoint_sets_nothing_aside(workdir, monkeypatch, where,
                                                                   error):
  # Would set every good checkpoint aside in turn, and the rerun start from scratch, if any
  # failure to read counted as damage.
  make_error, shown = _MACHINE_ERRORS[error]
  if where == 'metadata':  # as a real EMFILE strikes: opening state/_METADATA
    async def fail(*_):
      raise make_error()
    monkeypatch.setattr(base_pytree_checkpoint_handler.BasePyTreeCheckpointHandler,
                        '_read_metadata_file', fail)
  else:
    def fail(*_):
      raise make_error()
    monkeypatch.setattr(checkpoint, '_read_items', fail)
  before = _contents(workdir)
  abstract = _abstract(_make_state(0))
  parts = (f"Reading the checkpoint '{_step_dir(workdir, 3)}' failed ({shown}),",
           'nothing was set aside')
  ckpt = _checkpointer(workdir)
  if where == 'metadata':
    one_sentence(lambda: ckpt.check_compatible(abstract), *parts)
    one_sentence(lambda: checkpoint.restore_arrays(str(workdir)), *parts)
  one_sentence(lambda: ckpt.restore_latest(abstract), *parts)
  ckpt.close()
  assert not _set_aside(workdir) and _contents(workdir) == before
  monkeypatch.undo()  # the cause fixed, the rerun resumes from the newest checkpoint
  ckpt = _checkpointer(workdir)
  state, data_state, step = ckpt.restore_latest(abstract)
  ckpt.close()
  assert step == 3 and data_state == _data_state(3)
  _assert_bit_identical(state, _make_state(3))


def test_tensorstore_statuses_of_the_machine_are_not_damage():
  # EMFILE and ENOSPC come as RESOURCE_EXHAUSTED, EACCES as PERMISSION_DENIED, EIO as UNKNOWN.
  machine_fault = checkpoint._machine_fault  # pylint: disable=protected-access
  for status in ('RESOURCE_EXHAUSTED', 'PERMISSION_DENIED', 'UNAVAILABLE', 'UNKNOWN',
                 'DEADLINE_EXCEEDED', 'ABORTED', 'CANCELLED', 'UNAUTHENTICATED'):
    assert machine_fault(ValueError(f'{status}: Error reading "manifest.ocdbt"')), status
  for status in ('DATA_LOSS', 'NOT_FOUND', 'INVALID_ARGUMENT', 'FAILED_PRECONDITION',
                 'OUT_OF_RANGE'):
    assert not machine_fault(ValueError(f'{status}: Error reading "manifest.ocdbt"')), status


_OUT_OF_FILE_DESCRIPTORS = '''
import json, os, resource
from tests.train.test_checkpoint import _abstract, _checkpointer, _make_state
abstract = _abstract(_make_state(0))
ckpt = _checkpointer({workdir!r})
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
in_use = len(os.listdir('/proc/self/fd')) - 1  # less the one listdir used
resource.setrlimit(resource.RLIMIT_NOFILE, (in_use, hard))  # the next open fails with EMFILE
try:
  ckpt.restore_latest(abstract)
  error = None
except ValueError as e:
  error = str(e)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print(json.dumps({{'error': error}}))
'''


def test_running_out_of_file_descriptors_sets_nothing_aside(workdir):
  before = _contents(workdir)
  error = run_python(_OUT_OF_FILE_DESCRIPTORS.format(workdir=str(workdir)))['error']
  assert error is not None
  assert_one_sentence(error, f"'{workdir}/checkpoints", 'Too many open files',
                      'nothing was set aside')
  assert not _set_aside(workdir) and _contents(workdir) == before
  ckpt = _checkpointer(workdir)
  assert ckpt.restore_latest(_abstract(_make_state(0)))[2] == 3
  ckpt.close()


def test_overwritten_array_bytes_are_caught_every_time(template, tmp_path):
  expected = jax.tree.map(np.asarray, _make_state(3))
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), expected)
  rng = np.random.default_rng(0)
  outcomes = []
  for trial in range(12):
    workdir = tmp_path / f'trial{trial}'
    shutil.copytree(template, workdir)
    path = _array_data_file(_step_dir(workdir, 3))
    with open(path, 'rb') as f:
      data = bytearray(f.read())
    for position in rng.choice(len(data), size=4, replace=False):
      data[position] = (data[position] + int(rng.integers(1, 256))) % 256
    with open(path, 'wb') as f:
      f.write(data)
    # What plain Orbax makes of it: an error, or (mostly) silently different values.
    try:
      # (Silenced as the project's own reads: a failed read leaves pages of asyncio reports.)
      with checkpoint._quiet_orbax_tasks():  # pylint: disable=protected-access
        raw = ocp.PyTreeCheckpointer().restore(
            os.path.join(_step_dir(workdir, 3), 'state'),
            args=ocp.args.PyTreeRestore(item=expected, restore_args=as_numpy))
      same = all(np.asarray(x).tobytes() == y.tobytes()
                 for x, y in zip(jax.tree.leaves(raw), jax.tree.leaves(expected)))
      outcome = 'unchanged' if same else 'changed'
    except Exception:  # pylint: disable=broad-exception-caught
      outcome = 'unreadable'
    ckpt = _checkpointer(workdir)
    state, _, step = ckpt.restore_latest(_abstract(_make_state(0)))
    ckpt.close()
    if outcome == 'unchanged':  # the bytes hit were not used: the checkpoint is still good
      assert step == 3 and not _set_aside(workdir)
      _assert_bit_identical(state, _make_state(3))
    else:
      assert step == 2, outcome
      _assert_bit_identical(state, _make_state(2))
      slug = 'digest-mismatch' if outcome == 'changed' else 'unreadable'
      assert _set_aside(workdir) == [f'3-{slug}']
    outcomes.append(outcome)
  # The damage landed where the data lives, and mostly went unnoticed by Orbax itself.
  assert outcomes.count('changed') >= 8, outcomes


def test_half_written_newer_step_is_ignored_and_cleaned_up(workdir, caplog):
  partial = os.path.join(workdir, 'checkpoints', '4.orbax-checkpoint-tmp-1700000000000000')
  shutil.copytree(_step_dir(workdir, 3), partial)
  shutil.rmtree(os.path.join(partial, 'digest'))
  _truncate_array_data(partial)
  ckpt = _checkpointer(workdir)
  assert ckpt.latest_step() == 3
  state, _, step = ckpt.restore_latest(_abstract(_make_state(0)))
  assert step == 3
  _assert_bit_identical(state, _make_state(3))
  _save(ckpt, (4,))
  ckpt.close()
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '3', '4']
  assert not _set_aside(workdir) and not [r for r in caplog.records if r.levelname == 'WARNING']


def test_unfinished_saves_are_removed_before_the_checkpointer_is_returned(tmp_path):
  # Orbax removes them in a background thread; had the constructor not waited for it, the
  # thread could still list the folder while it is read, set aside or removed.
  for attempt in range(10):
    workdir = tmp_path / str(attempt)
    partials = [workdir / 'checkpoints' / f'{step}.orbax-checkpoint-tmp-1700000000000000'
                for step in range(8)]
    for partial in partials:
      os.makedirs(partial / 'state')
    ckpt = _checkpointer(workdir)
    assert os.listdir(workdir / 'checkpoints') == []
    ckpt.close()


@pytest.mark.parametrize('check_first,damage', [(False, 'array data truncated'),
                                                 (True, 'state _METADATA garbled')])
def test_all_damaged_raises_one_sentence(workdir, check_first, damage):
  for step in _STEPS:
    _DAMAGE[damage][0](_step_dir(workdir, step))
  ckpt = _checkpointer(workdir)
  if check_first:  # as the loop does: this sets them all aside before restore_latest runs
    ckpt.check_compatible(_abstract(_make_state(0)))
  # Would return None, and the run silently start over, if only the steps left were counted.
  with pytest.raises(ValueError) as raised:
    ckpt.restore_latest(_abstract(_make_state(0)))
  ckpt.close()
  message = str(raised.value)
  assert message.startswith(f"None of the checkpoints in '{workdir}/checkpoints' could be restored")
  assert message.endswith('a rerun starts from scratch.') and '\n' not in message
  assert message.count('. ') == 0
  assert _set_aside(workdir) == ['1-unreadable', '2-unreadable', '3-unreadable']
  ckpt = _checkpointer(workdir)
  assert ckpt.restore_latest(_abstract(_make_state(0))) is None  # as the message says
  ckpt.close()


def test_all_damaged_sets_the_records_aside_and_the_rerun_keeps_them(workdir):
  writer = metrics.MetricWriter(str(workdir), total_steps=4)  # the run that saved steps 1-3
  for step in _STEPS:
    writer.write(step, 'train', {'loss': float(step)})
  writer.write_outputs(3, {'text': 'a sample'})
  writer.close()
  records = _contents(workdir, metrics.RECORDS)
  assert {path.split(os.sep)[0] for path in records} == set(metrics.RECORDS)
  for step in _STEPS:
    _truncate_array_data(_step_dir(workdir, step))
  ckpt = _checkpointer(workdir)
  aside = os.path.join(workdir, 'checkpoints_set_aside')
  one_sentence(lambda: ckpt.restore_latest(_abstract(_make_state(0))),
               f"with the run's records in '{aside}/records-3', and a rerun starts from scratch")
  ckpt.close()
  assert _set_aside(workdir) == ['1-unreadable', '2-unreadable', '3-unreadable', 'records-3']
  # The rerun starts from scratch and writes its own records; the old ones stay as they were.
  ckpt = _checkpointer(workdir)
  assert ckpt.restore_latest(_abstract(_make_state(0))) is None
  ckpt.close()
  writer = metrics.MetricWriter(str(workdir), total_steps=4, start_step=0)
  writer.write(1, 'train', {'loss': 9.0})
  writer.close()
  assert _contents(os.path.join(aside, 'records-3')) == records
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    assert [json.loads(line) for line in f] == [{'step': 1, 'split': 'train', 'loss': 9.0}]


def test_check_compatible_judges_the_newest_readable_metadata(workdir, caplog):
  _garble(os.path.join(_step_dir(workdir, 3), 'state', '_METADATA'))
  ckpt = _checkpointer(workdir)
  wider = _make_state(0).replace(params={**_make_state(0).params, 'extra': jnp.zeros(3)})
  # Would fail with a raw UnicodeDecodeError if the garbled metadata were read unguarded.
  with pytest.raises(ValueError, match=r"checkpoint '.*/checkpoints/2' does not fit"):
    ckpt.check_compatible(_abstract(wider))
  assert _set_aside(workdir) == ['3-unreadable']
  assert len(_warnings_naming(caplog, _step_dir(workdir, 3))) == 1
  ckpt.check_compatible(_abstract(_make_state(0)))
  ckpt.close()


def test_check_compatible_reads_only_the_newest_readable_metadata(workdir):
  # An older checkpoint's damage is left for restore_latest, which never reaches it.
  _garble(os.path.join(_step_dir(workdir, 1), 'state', '_METADATA'))
  ckpt = _checkpointer(workdir)
  ckpt.check_compatible(_abstract(_make_state(0)))
  ckpt.close()
  assert not _set_aside(workdir)


def test_the_same_step_set_aside_twice_keeps_both(workdir):
  for _ in range(2):
    _truncate_array_data(_step_dir(workdir, 3))
    ckpt = _checkpointer(workdir)
    assert ckpt.restore_latest(_abstract(_make_state(0)))[2] == 2
    _save(ckpt, (3,))
    ckpt.close()
  assert _set_aside(workdir) == ['3-unreadable', '3-unreadable-2']


def test_restore_arrays_and_restore_refuse_damaged_checkpoints_without_moving_them(workdir, caplog):
  newest = _step_dir(workdir, 3)
  data = bytearray(open(_array_data_file(newest), 'rb').read())
  data[len(data) // 2] ^= 0xFF
  with open(_array_data_file(newest), 'wb') as f:
    f.write(data)
  arrays = checkpoint.restore_arrays(str(workdir))
  _assert_bit_identical(arrays['params'], _make_state(2).params)
  assert len(_warnings_naming(caplog, newest)) == 1
  with pytest.raises(ValueError, match=rf"^The checkpoint '{newest}' does not match its digest: "
                                       r'array params/\w+/\w+ differs from what was saved\.$'):
    checkpoint.restore_arrays(str(workdir), step=3)
  ckpt = _checkpointer(workdir)
  with pytest.raises(ValueError, match=rf"^The checkpoint '{newest}' does not match its digest"):
    ckpt.restore(_abstract(_make_state(0)))
  ckpt.close()
  assert os.path.isdir(newest) and not _set_aside(workdir)


# Other layouts and processes ---------------------------------------------------------------

_SAVE_ON_8_DEVICES = '''
import json
import jax, numpy as np
from tests.train.test_checkpoint import _make_state, _data_state
from train import checkpoint, parallel
par = parallel.Parallel('fsdp', parallel.make_mesh(), fsdp_min_size=0)
state = _make_state(7)
state = jax.device_put(state, par.state_shardings(state))
ckpt = checkpoint.Checkpointer({workdir!r}, every_steps=1, keep=3)
ckpt.save(7, state, _data_state(7))
ckpt.close()
print(json.dumps({{'devices': jax.device_count(), 'digest': checkpoint.array_digest(state),
                  'specs': sorted({{str(x.sharding.spec) for x in jax.tree.leaves(state)}})}}))
'''


def test_digest_of_an_8_device_fsdp_checkpoint_verifies_on_1_device(tmp_path, caplog):
  # Would fail if the digest depended on the shards (e.g. summed per shard in another order
  # with a non-associative operation, or indexed within the shard instead of globally).
  saved = run_python(_SAVE_ON_8_DEVICES.format(workdir=str(tmp_path)), devices=8)
  assert saved['devices'] == 8 and "P('data',)" in saved['specs']
  assert jax.device_count() == 1
  ckpt = _checkpointer(tmp_path)
  state, data_state, step = ckpt.restore_latest(_abstract(_make_state(0)))
  ckpt.close()
  assert step == 7 and data_state == _data_state(7) and not _set_aside(tmp_path)
  _assert_bit_identical(state, _make_state(7))
  assert checkpoint.array_digest(state) == saved['digest']
  assert not _warnings_naming(caplog, str(tmp_path))


_TWO_PROCESSES = '''
import json, os, sys
import jax, numpy as np
from jax.experimental import multihost_utils
from train import checkpoint, distributed, parallel
from tests.train.test_checkpoint import _make_state, _data_state, _array_data_file, _abstract
distributed.initialize({address!r}, 2, int(sys.argv[1]))
par = parallel.Parallel('fsdp', parallel.make_mesh(), fsdp_min_size=0)
def place(step):
  state = _make_state(step)
  return jax.tree.map(
      lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
      state, par.state_shardings(state))
ckpt = checkpoint.Checkpointer({workdir!r}, every_steps=1, keep=3)
for step in (1, 2, 3):
  ckpt.save(step, place(step), _data_state(step))
ckpt.wait()
multihost_utils.sync_global_devices('saved')
if jax.process_index() == 0:  # damages what only process 1 wrote and reads
  path = _array_data_file(os.path.join({workdir!r}, 'checkpoints', '3'), process=1)
  os.truncate(path, os.path.getsize(path) // 2)
multihost_utils.sync_global_devices('damaged')
ckpt.check_compatible(par.abstract_state(lambda _: _make_state(0), None))
state, data_state, step = ckpt.restore_latest(par.abstract_state(lambda _: _make_state(0), None))
expected = place(2)
equal = all(np.array_equal(np.asarray(a.addressable_data(0)), np.asarray(b.addressable_data(0)))
            for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(expected)))
ckpt.save(4, place(4), _data_state(4))
ckpt.close()
print(json.dumps({{'process': jax.process_index(), 'step': step, 'equal': equal,
                  'data': data_state}}))
'''


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _run_two_processes(source):
  """The outputs (stdout, stderr) of `source` run as processes 0 and 1 of one run."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': REPO_ROOT,
         'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}
  processes = [subprocess.Popen([sys.executable, '-c', source, str(i)], env=env, cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
  try:
    outputs = [p.communicate(timeout=300) for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:  # a hang: do not leave it running
        p.kill()
  for p, (_, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  return outputs


def test_two_processes_take_the_same_decision(tmp_path):
  # Would hang or diverge if one process fell back while the other restored: only process 1
  # reads the damaged shard file.
  workdir = str(tmp_path / 'run')
  outputs = _run_two_processes(_TWO_PROCESSES.format(address=f'127.0.0.1:{_free_port()}',
                                                     workdir=workdir))
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
  assert [r['process'] for r in results] == [0, 1]
  assert all(r['step'] == 2 and r['equal'] and r['data'] == _data_state(2) for r in results)
  assert _set_aside(workdir) == ['3-unreadable']
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['1', '2', '4']
  warned = [line for _, err in outputs for line in err.splitlines() if 'set it aside' in line]
  assert len(warned) == 1, warned  # process 0 renames and says so, once
  assert 'cannot be read (on process 1: ' in warned[0]  # process 0 read its shards fine


_TWO_PROCESSES_ONE_FAILING = '''
import errno, json, os, sys
import jax, numpy as np
from jax.experimental import multihost_utils
from train import checkpoint, distributed, parallel
from tests.train.test_checkpoint import _make_state, _data_state, _array_data_file
distributed.initialize({address!r}, 2, int(sys.argv[1]))
par = parallel.Parallel('fsdp', parallel.make_mesh(), fsdp_min_size=0)
def place(step):
  state = _make_state(step)
  return jax.tree.map(
      lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
      state, par.state_shardings(state))
ckpt = checkpoint.Checkpointer({workdir!r}, every_steps=1, keep=3)
for step in (1, 2, 3):
  ckpt.save(step, place(step), _data_state(step))
ckpt.wait()
multihost_utils.sync_global_devices('saved')
if jax.process_index() == 0:  # process 0 reads damage, process 1 runs out of file descriptors
  path = _array_data_file(os.path.join({workdir!r}, 'checkpoints', '3'), process=0)
  os.truncate(path, os.path.getsize(path) // 2)
else:
  def fail(*_):
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
  checkpoint._read_items = fail
multihost_utils.sync_global_devices('damaged')
try:
  ckpt.restore_latest(par.abstract_state(lambda _: _make_state(0), None))
  error = None
except ValueError as e:
  error = str(e)
ckpt.close()
print(json.dumps({{'process': jax.process_index(), 'error': error}}))
'''


def test_a_read_failing_outside_the_checkpoint_on_one_process_sets_nothing_aside(tmp_path):
  # Would set the checkpoint aside on both if process 0's damage, reported first, decided.
  workdir = str(tmp_path / 'run')
  outputs = _run_two_processes(_TWO_PROCESSES_ONE_FAILING.format(
      address=f'127.0.0.1:{_free_port()}', workdir=workdir))
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
  assert [r['process'] for r in results] == [0, 1]
  for result in results:
    assert result['error'].startswith(
        f"Reading the checkpoint '{workdir}/checkpoints/3' failed (on process 1: OSError: "
        '[Errno 24] Too many open files)'), result['error']
    assert 'nothing was set aside' in result['error']
  assert not _set_aside(workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['1', '2', '3']


def test_eval_variables_are_the_ema_when_the_run_kept_one():
  params, ema, stats = {'w': np.zeros(2)}, {'w': np.ones(2)}, {'batch_stats': {'mean': np.ones(3)}}
  saved = {'step': np.int32(4), 'params': params, 'ema_params': ema, 'model_state': stats}
  assert checkpoint.eval_variables(saved) == {'params': ema, 'batch_stats': stats['batch_stats']}
  # A run without an EMA saves none (or None) and no model state: its parameters alone.
  for without in ({'params': params}, {'params': params, 'ema_params': None, 'model_state': None}):
    assert checkpoint.eval_variables(without) == {'params': params}


def test_variables_mismatch_names_the_first_difference_parameters_first():
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  saved = {'params': {'dense': {'kernel': np.zeros((4, 3), np.float32)}},
           'model_state': {'batch_stats': {'mean': np.zeros(3, np.float32)}}}
  params, stats = {'dense': {'kernel': f32(4, 3)}}, {'batch_stats': {'mean': f32(3)}}
  mismatch = checkpoint.variables_mismatch
  assert mismatch(saved, (params, stats)) is None
  assert mismatch(saved, (params, {})) == (
      'the model has no batch_stats/mean (float32 (3,) in the checkpoint)')
  assert mismatch({'params': saved['params']}, (params, stats)) == (
      'the checkpoint has no batch_stats/mean (float32 (3,) in the model)')
  # The same shape in another dtype differs; the parameters are named before the statistics.
  bf16 = {'dense': {'kernel': jax.ShapeDtypeStruct((4, 3), jnp.bfloat16)}}
  assert mismatch(saved, (bf16, {'batch_stats': {'mean': f32(4)}})) == (
      'params/dense/kernel is float32 (4, 3) in the checkpoint but bfloat16 (4, 3) in the model')


# Inputs, listing and what restore_arrays reads -----------------------------------------------


@pytest.mark.parametrize('every_steps,keep', [(0, 3), (-2, 3), (2, 0), (2, -1)])
def test_a_non_positive_interval_or_keep_is_one_sentence_and_creates_nothing(tmp_path, every_steps,
                                                                             keep):
  one_sentence(lambda: checkpoint.Checkpointer(str(tmp_path / 'run'), every_steps, keep),
               f'checkpoint_every_steps ({every_steps}) and checkpoints_to_keep ({keep}) must be '
               'positive.')
  assert not os.path.exists(tmp_path / 'run')


def test_restoring_a_step_that_was_not_saved_names_the_saved_ones(workdir):
  ckpt = _checkpointer(workdir)
  directory = os.path.join(str(workdir), 'checkpoints')
  assert one_sentence(lambda: ckpt.restore(_abstract(_make_state(0)), step=7),
                      error=FileNotFoundError) == (
      f'No checkpoint of step 7 in {directory!r}; found steps [1, 2, 3].')
  ckpt.close()
  assert one_sentence(lambda: checkpoint.restore_arrays(str(workdir), 7),
                      error=FileNotFoundError) == (
      f'No checkpoint of step 7 in {directory!r}; found steps [1, 2, 3].')


def test_a_checkpoint_written_by_another_checkpointer_since_is_the_one_restored(workdir):
  # The loop builds its Checkpointer in setup and restores in train: steps saved in between
  # (e.g. by a run that held the directory until then) must be seen, not Orbax's old listing.
  ckpt = _checkpointer(workdir)
  assert ckpt.latest_step() == 3
  other = _checkpointer(workdir)
  _save(other, (4,))
  other.close()
  state, data_state, step = ckpt.restore_latest(_abstract(_make_state(0)))
  ckpt.close()
  assert step == 4 and data_state == _data_state(4)
  _assert_bit_identical(state, _make_state(4))


def test_a_listing_that_fails_is_one_sentence_and_sets_nothing_aside(workdir, monkeypatch):
  before = _contents(workdir)
  ckpt = _checkpointer(workdir)
  def fail():
    raise OSError(errno.EIO, os.strerror(errno.EIO))
  monkeypatch.setattr(ckpt.manager, 'reload', fail)
  for call in (ckpt.check_compatible, ckpt.restore_latest):
    one_sentence(lambda call=call: call(_abstract(_make_state(0))),
                 f"Listing the checkpoints in '{workdir}/checkpoints' failed (OSError: [Errno 5] "
                 'Input/output error): nothing was set aside')
  monkeypatch.undo()
  ckpt.close()
  assert _contents(workdir) == before and not _set_aside(workdir)


@pytest.mark.parametrize('change,named', [
    # Parameters are named first, though 'a_first' sorts before them.
    (lambda s: {'a_first': jnp.zeros(2), **s, 'params': {**s['params'], 'norm': {
        'scale': jnp.zeros(17, jnp.bfloat16)}}},
     "params/norm/scale is bfloat16 (16,) there but bfloat16 (17,) here"),
    # The same shape in another dtype does not fit either.
    (lambda s: {**s, 'params': {**s['params'], 'dense': {
        **s['params']['dense'], 'kernel': jnp.zeros((48, 40), jnp.bfloat16)}}},
     'params/dense/kernel is float32 (48, 40) there but bfloat16 (48, 40) here'),
    (lambda s: {**s, 'step': jnp.zeros((), jnp.int8)}, 'step is int32 () there but int8 () here'),
])
def test_a_mismatch_names_the_parameters_first_and_sees_dtypes(workdir, change, named):
  state = _make_state(0)
  as_dict = {'params': state.params, 'rng': state.rng, 'step': state.step}
  ckpt = _checkpointer(workdir)
  for call in (ckpt.check_compatible, ckpt.restore_latest):
    one_sentence(lambda call=call: call(_abstract(change(as_dict))),
                 f"The checkpoint '{_step_dir(workdir, 3)}' does not fit this config: {named}; ")
  ckpt.close()
  assert not _set_aside(workdir)


def test_a_digest_without_arrays_is_a_mismatch(workdir):
  _write(os.path.join(_step_dir(workdir, 3), 'digest', 'metadata'), '{"data_sha256": "00"}')
  with pytest.raises(ValueError, match=rf"^The checkpoint '{_step_dir(workdir, 3)}' has a "
                                       r'malformed digest\.$'):
    checkpoint.restore_arrays(str(workdir), step=3)
  ckpt = _checkpointer(workdir)
  assert ckpt.restore_latest(_abstract(_make_state(0)))[2] == 2
  ckpt.close()
  assert _set_aside(workdir) == ['3-digest-mismatch']


def test_restore_arrays_reads_the_newest_good_one_and_says_when_none_is(workdir, caplog):
  # A half-written newer step is no checkpoint, and one written before digests existed reads.
  partial = os.path.join(workdir, 'checkpoints', '4.orbax-checkpoint-tmp-1700000000000000')
  shutil.copytree(_step_dir(workdir, 3), partial)
  shutil.rmtree(os.path.join(_step_dir(workdir, 3), 'digest'))
  arrays = checkpoint.restore_arrays(str(workdir))
  assert int(arrays['step']) == 3 and not [r for r in caplog.records if r.levelname == 'WARNING']
  _assert_bit_identical(arrays['params'], _make_state(3).params)
  for step in _STEPS:
    _truncate_array_data(_step_dir(workdir, step))
  directory = os.path.join(str(workdir), 'checkpoints')
  assert one_sentence(lambda: checkpoint.restore_arrays(str(workdir))) == (
      f'None of the checkpoints [1, 2, 3] in {directory!r} could be read.')
  assert len([r for r in caplog.records if r.levelname == 'WARNING']) == 3
  assert not _set_aside(workdir)


def test_the_same_step_set_aside_three_times_keeps_all_three(workdir):
  for _ in range(3):
    _truncate_array_data(_step_dir(workdir, 3))
    ckpt = _checkpointer(workdir)
    assert ckpt.restore_latest(_abstract(_make_state(0)))[2] == 2
    _save(ckpt, (3,))
    ckpt.close()
  assert _set_aside(workdir) == ['3-unreadable', '3-unreadable-2', '3-unreadable-3']


def test_records_set_aside_twice_keep_both(workdir):
  # A rerun from scratch that saved steps 1-3 again, all damaged again: the first rerun's
  # records are not overwritten by the second's.
  aside = os.path.join(workdir, 'checkpoints_set_aside')
  for attempt in (1, 2):
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
      f.write(json.dumps({'step': 3, 'split': 'train', 'attempt': attempt}) + '\n')
    for step in _STEPS:
      _truncate_array_data(_step_dir(workdir, step))
    ckpt = _checkpointer(workdir)
    with pytest.raises(ValueError):
      ckpt.restore_latest(_abstract(_make_state(0)))
    ckpt.close()
    ckpt = _checkpointer(workdir)  # the rerun, from scratch
    assert ckpt.restore_latest(_abstract(_make_state(0))) is None
    _save(ckpt, _STEPS)
    ckpt.close()
  for folder, attempt in (('records-3', 1), ('records-3-2', 2)):
    with open(os.path.join(aside, folder, 'metrics.jsonl'), encoding='utf-8') as f:
      assert json.load(f)['attempt'] == attempt


def _refuse_renames_across_devices(monkeypatch, refused):
  """os.rename fails with EXDEV (as across file systems) where `refused(source, target)`."""
  rename = os.rename

  def refuse(source, target):
    if refused(str(source), str(target)):
      raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
    return rename(source, target)
  monkeypatch.setattr(os, 'rename', refuse)


def test_a_damaged_checkpoint_that_cannot_be_moved_is_one_sentence(workdir, monkeypatch):
  _truncate_array_data(_step_dir(workdir, 3))
  _refuse_renames_across_devices(
      monkeypatch, lambda source, target: 'checkpoints_set_aside' in target)
  ckpt = _checkpointer(workdir)
  one_sentence(lambda: ckpt.restore_latest(_abstract(_make_state(0))),
               f"The damaged checkpoint '{_step_dir(workdir, 3)}' could not be moved to "
               f"'{workdir}/checkpoints_set_aside/3-unreadable' (Invalid cross-device link); "
               'move or delete it by hand.')
  ckpt.close()
  assert os.path.isdir(_step_dir(workdir, 3))


def test_a_file_where_the_set_aside_folder_goes_is_one_sentence(workdir):
  _truncate_array_data(_step_dir(workdir, 3))
  aside = os.path.join(workdir, 'checkpoints_set_aside')
  with open(aside, 'w', encoding='utf-8') as f:
    f.write('notes\n')
  ckpt = _checkpointer(workdir)
  one_sentence(lambda: ckpt.restore_latest(_abstract(_make_state(0))),
               f"The damaged checkpoint '{_step_dir(workdir, 3)}' could not be set aside: the "
               f"folder '{aside}' could not be made (File exists); move what is in its place, "
               'or the checkpoint, by hand.')
  ckpt.close()
  assert os.path.isdir(_step_dir(workdir, 3))
  with open(aside, encoding='utf-8') as f:
    assert f.read() == 'notes\n'


def test_records_that_cannot_be_moved_are_one_sentence(workdir, monkeypatch):
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
    f.write('{"step": 1, "split": "train"}\n')
  for step in _STEPS:
    _truncate_array_data(_step_dir(workdir, step))
  _refuse_renames_across_devices(
      monkeypatch, lambda source, target: source.endswith('metrics.jsonl'))
  ckpt = _checkpointer(workdir)
  one_sentence(lambda: ckpt.restore_latest(_abstract(_make_state(0))),
               f"The records of the run in '{workdir}' could not be moved to "
               f"'{workdir}/checkpoints_set_aside/records-3' (Invalid cross-device link); move "
               'them by hand, or the rerun from scratch replaces them.')
  ckpt.close()
  assert os.path.isfile(os.path.join(workdir, 'metrics.jsonl'))


def test_reads_silence_asyncio_and_unraisable_reports_only_while_they_run(workdir, monkeypatch,
                                                                         caplog):
  # A failed concurrent read leaves tasks nobody awaits: their reports (pages of tracebacks
  # naming no checkpoint) are silenced while Orbax reads, and only then.
  import logging  # pylint: disable=g-import-not-at-top
  asyncio_log, hook = logging.getLogger('asyncio'), sys.unraisablehook
  read_items, during = checkpoint._read_items, []  # pylint: disable=protected-access

  def noisy_read(path, *args):
    asyncio_log.error('Task exception was never retrieved')
    during.append(sys.unraisablehook is hook)
    if path.endswith('/3'):
      raise ValueError('Failed to read the array data.')
    return read_items(path, *args)

  monkeypatch.setattr(checkpoint, '_read_items', noisy_read)
  ckpt = _checkpointer(workdir)
  assert ckpt.restore_latest(_abstract(_make_state(0)))[2] == 2  # one failed read, one good
  ckpt.close()
  assert during == [False, False]
  assert not [r for r in caplog.records if r.name == 'asyncio']
  assert not asyncio_log.disabled and sys.unraisablehook is hook


def test_one_line_drops_tensorstores_spec_dump_and_caps_the_length():
  one_line = checkpoint._one_line  # pylint: disable=protected-access
  error = ValueError('NOT_FOUND: Error opening "x" See full TensorStore details: {"driver": 1}\n'
                     'more')
  assert one_line(error) == 'ValueError: NOT_FOUND: Error opening "x"'
  assert one_line(OSError('y' * 400)) == 'OSError: ' + 'y' * 291 + '...'
  assert one_line(MemoryError()) == 'MemoryError'
