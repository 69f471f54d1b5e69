"""Orbax checkpoints of the train state and the input iterator's position, verified on restore.

Each checkpoint `<workdir>/checkpoints/<step>/` holds three items written by one
atomic Orbax save: 'state' (the `TrainState` in its canonical global layout,
RNG included), 'data' (the iterator state as JSON) and 'digest' (JSON: a
checksum, shape and dtype of every state array and the sha256 of the iterator
state). Saves are asynchronous and atomic: a run killed while saving leaves the
previous checkpoints intact, and Orbax ignores the partial
`<step>.orbax-checkpoint-tmp-*` folder and removes it when the next run starts.

`Checkpointer.restore_latest` tries the checkpoints from the newest: one whose
content cannot be decoded (malformed JSON or metadata, corrupt, truncated or
missing files) or whose arrays or iterator state differ from its digest is
moved to `<workdir>/checkpoints_set_aside/<step>-<reason>` (never deleted;
Orbax neither lists nor rotates folders there) with one warning line, and the
next older one is tried. A read that fails for a reason outside the checkpoint
(an OSError other than a missing file, e.g. too many open files or an I/O
error, a MemoryError, or a TensorStore error of resources, permissions or
availability) sets nothing aside and raises one sentence.
"""

import contextlib
import gc
import hashlib
import json
import logging as stdlib_logging
import os
import sys
import time

from absl import logging
from etils import epath
import jax
from jax import lax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from train import metrics

_ITEMS = ('state', 'data', 'digest')


class Checkpointer:
  """Saves every `every_steps` steps and at the end, keeps the last `keep`, restores verified.

  The loop calls `check_compatible(abstract)` before compiling, then
  `restore_latest(abstract)` (None: start from scratch), then
  `save(step, state, {'iterator': ...})` and finally `close()`. Every process
  of a multi-process run makes the same calls and takes the same decisions.
  """

  def __init__(self, workdir: str, every_steps: int, keep: int):
    if every_steps <= 0 or keep <= 0:
      raise ValueError(f'checkpoint_every_steps ({every_steps}) and checkpoints_to_keep ({keep}) '
                       'must be positive.')
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=every_steps, max_to_keep=keep, create=True,
        cleanup_tmp_directories=True)
    workdir = os.path.abspath(workdir)
    self.directory = os.path.join(workdir, 'checkpoints')
    # A sibling of `directory`, so Orbax's step listing, rotation and
    # temporary-folder cleanup never see what was set aside.
    self.set_aside_directory = os.path.join(workdir, 'checkpoints_set_aside')
    self.set_aside: list[str] = []  # the folders this Checkpointer moved there
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)
    # Orbax removes unfinished saves' folders in a background thread that only its next save
    # waits for (not `close`): waited for here, so that thread never lists a folder while
    # this one sets a checkpoint aside or after the work directory is removed.
    self.manager._maybe_await_cleanup_tmp_directory()  # pylint: disable=protected-access

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict | None, *, force: bool = False) -> bool:
    """Starts an asynchronous save of `state` (canonical layout) and its digest if `step` is due."""
    if not (force or self.manager.should_save(step)):
      return False  # spares the digest of a save Orbax would skip
    data_state = data_state or {}
    digest = {'arrays': array_digest(state), 'data_sha256': data_digest(data_state)}
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
        digest=ocp.args.JsonSave(digest)), force=force)

  def check_compatible(self, abstract_state) -> None:
    """Raises one sentence if the newest readable checkpoint cannot restore into `abstract_state`.

    Called before compiling, so a changed model config with an old --workdir
    stops at once and leaves the checkpoints as they are. Reads metadata only;
    checkpoints whose metadata cannot be decoded are set aside.
    """
    for step in self._steps_newest_first():
      try:
        saved = self._read_saved_tree(step)
      except _Damaged as damage:
        self._set_aside(step, damage)
        continue
      _check_fits(self._path(step), saved, abstract_state)
      return

  def restore_latest(self, abstract_state):
    """(state, data_state, step) of the newest good checkpoint, or None if there are none.

    Damaged checkpoints are set aside on the way; raises ValueError if
    checkpoints existed but none could be restored (also when
    `check_compatible` already set them all aside), or if one does not fit
    `abstract_state` (a changed config: nothing is set aside then). When none
    could be restored, the run's records (`metrics.RECORDS`) are moved to
    `checkpoints_set_aside/records-<newest step>` too, so that the rerun,
    which starts from scratch, begins them afresh without losing the old ones.
    """
    for step in self._steps_newest_first():
      try:
        state, data_state = self._restore_verified(step, abstract_state)
      except _Damaged as damage:
        self._set_aside(step, damage)
        continue
      return state, data_state, step
    if not self.set_aside:
      return None
    records = self._set_aside_records()
    moved = f", with the run's records in {records!r}," if records else ''
    raise ValueError(f'None of the checkpoints in {self.directory!r} could be restored; the '
                     f'{len(self.set_aside)} damaged ones were set aside in '
                     f'{self.set_aside_directory!r}{moved} and a rerun starts from scratch.')

  def restore(self, abstract_state, step: int | None = None):
    """(state, data_state) of `step` (the latest by default) laid out as `abstract_state`, verified.

    Unlike `restore_latest` it does not fall back: a damaged checkpoint
    raises one sentence and stays where it is.
    """
    step = self.latest_step() if step is None else step
    if step is None or not os.path.isdir(self._path(step)):
      raise _no_checkpoint(self.directory, step, list(self.manager.all_steps()))
    try:
      return self._restore_verified(step, abstract_state)
    except _Damaged as damage:
      raise ValueError(f'The checkpoint {self._path(step)!r} {damage.reason}.') from None

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()

  # Reading and setting aside ----------------------------------------------

  def _path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _steps_newest_first(self) -> list[int]:
    """The saved steps, newest first; a listing that fails (an OSError) raises one sentence."""
    self.manager.wait_until_finished()
    try:
      self.manager.reload()  # the folders may have changed since the manager listed them
    except OSError as e:
      raise ValueError(f'Listing the checkpoints in {self.directory!r} failed ({_one_line(e)}): '
                       'nothing was set aside; rerun once the cause is fixed.') from e
    return sorted(self.manager.all_steps(), reverse=True)

  def _read_saved_tree(self, step: int):
    return _attempt(lambda: _saved_tree(os.path.join(self._path(step), 'state')),
                    self._path(step), 'has unreadable metadata', collective=True)

  def _restore_verified(self, step: int, abstract_state):
    """(state, data_state) of `step`; raises _Damaged, or ValueError if it does not fit or
    the read failed for a reason outside the checkpoint."""
    path = self._path(step)
    _check_fits(path, self._read_saved_tree(step), abstract_state)
    verified = _agree(os.path.isdir(os.path.join(path, 'digest')))
    restored = _attempt(lambda: _read_items(path, abstract_state, verified), path,
                        'cannot be read', collective=True)
    if not verified:
      logging.warning('Checkpoint %s has no digest (it predates them); restored it unverified.',
                      path)
      return restored['state'], restored['data']
    # The digest is computed on the global arrays, so every process reaches
    # the same verdict without further agreement.
    mismatch = _digest_mismatch(restored['state'], restored['data'], restored['digest'])
    if mismatch:
      raise _Damaged('digest-mismatch', mismatch)
    return restored['state'], restored['data']

  def _set_aside(self, step: int, damage: '_Damaged') -> None:
    """Moves the checkpoint of `step` out of Orbax's sight; process 0 renames, all wait."""
    source = self._path(step)
    _barrier(f'checkpoint_set_aside_{step}_start')  # nobody is still reading it
    if jax.process_index() == 0:
      try:
        os.makedirs(self.set_aside_directory, exist_ok=True)
      except OSError as e:
        raise ValueError(f'The damaged checkpoint {source!r} could not be set aside: the folder '
                         f'{self.set_aside_directory!r} could not be made ({e.strerror}); move '
                         'what is in its place, or the checkpoint, by hand.') from None
      target = os.path.join(self.set_aside_directory, f'{step}-{damage.slug}')
      copies = 1
      while os.path.exists(target):  # the same step may be damaged again after a rerun
        copies += 1
        target = os.path.join(self.set_aside_directory, f'{step}-{damage.slug}-{copies}')
      try:
        os.rename(source, target)
      except OSError as e:
        raise ValueError(f'The damaged checkpoint {source!r} could not be moved to {target!r} '
                         f'({e.strerror}); move or delete it by hand.') from None
      logging.warning('Checkpoint %s %s; set it aside as %s.', source, damage.reason, target)
    self.set_aside.append(source)
    _barrier(f'checkpoint_set_aside_{step}_done')  # the rename is visible to all
    self.manager.reload()

  def _set_aside_records(self) -> str | None:
    """Moves the workdir's `metrics.RECORDS` into a new `records-<newest set-aside step>[-N]`
    beside the set-aside checkpoints; returns that folder, or None if there were none.

    Only process 0, which alone writes the records, moves them and names the folder.
    """
    workdir = os.path.dirname(self.directory)
    present = [name for name in metrics.RECORDS if os.path.exists(os.path.join(workdir, name))]
    if jax.process_index() != 0 or not present:
      return None
    stem = os.path.join(self.set_aside_directory,
                        f'records-{max(int(os.path.basename(p)) for p in self.set_aside)}')
    target, copies = stem, 1
    while os.path.exists(target):
      copies += 1
      target = f'{stem}-{copies}'
    try:
      os.makedirs(target)
      for name in present:
        os.rename(os.path.join(workdir, name), os.path.join(target, name))
    except OSError as e:
      raise ValueError(f'The records of the run in {workdir!r} could not be moved to {target!r} '
                       f'({e.strerror}); move them by hand, or the rerun from scratch replaces '
                       'them.') from None
    return target


def _read_items(path: str, abstract_state, with_digest: bool) -> dict:
  """{'state', 'data'[, 'digest']} of the checkpoint at `path`, read by the items' handlers.

  Not through `CheckpointManager.restore`: it ends in a barrier that a process
  whose read failed never reaches, so the other processes would wait for it
  forever (or pair that barrier with the next collective).
  """
  path = epath.Path(path)
  handler = ocp.StandardCheckpointHandler()
  try:
    items = {'state': handler.restore(path / 'state',
                                      args=ocp.args.StandardRestore(abstract_state))}
  finally:
    handler.close()
  for name in ('data', 'digest') if with_digest else ('data',):
    items[name] = ocp.JsonCheckpointHandler().restore(path / name)
  return items


class _Damaged(Exception):
  """A checkpoint whose content cannot be decoded or does not match its digest."""

  def __init__(self, slug: str, reason: str):
    super().__init__(reason)
    self.slug, self.reason = slug, reason


# What a checkpoint with undecodable, malformed or missing content raises: Orbax's JSON
# and metadata parsing (JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
# AttributeError), TensorStore's corrupt, truncated or missing data (ValueError) and a
# missing file.
_CONTENT_ERRORS = (ValueError, LookupError, TypeError, AttributeError, FileNotFoundError)
# TensorStore (and XLA) statuses of the machine rather than of the data: errno values
# such as EMFILE and ENOSPC (RESOURCE_EXHAUSTED), EACCES (PERMISSION_DENIED) and EIO (UNKNOWN).
_MACHINE_STATUSES = tuple(f'{code}:' for code in (
    'RESOURCE_EXHAUSTED', 'PERMISSION_DENIED', 'UNAVAILABLE', 'UNKNOWN', 'DEADLINE_EXCEEDED',
    'ABORTED', 'CANCELLED', 'UNAUTHENTICATED'))


def _chain(error: BaseException) -> list[BaseException]:
  """`error` and the errors it was raised from or while handling, outermost first."""
  chain = []
  while error is not None and error not in chain:
    chain.append(error)
    error = error.__cause__ or error.__context__
  return chain


def _machine_fault(error: BaseException) -> bool:
  """Whether `error` is a fault of the machine rather than of the data: an OSError other than
  FileNotFoundError, a MemoryError or an error with a `_MACHINE_STATUSES` status."""
  return (isinstance(error, MemoryError) or str(error).startswith(_MACHINE_STATUSES) or
          (isinstance(error, OSError) and not isinstance(error, FileNotFoundError)))


def _attempt(read, path: str, what: str, *, collective: bool):
  """`read()` of the checkpoint at `path`.

  A failure is damage, raised as _Damaged('unreadable') naming the error, if its chain
  (`_chain`) holds a `_CONTENT_ERRORS` error and no `_machine_fault`; any other failure
  raises one sentence naming the fault and saying nothing was set aside. `collective`:
  all processes take the same decision, a failure that is not damage on any process
  winning over damage on others.
  """
  result, error, damage = None, None, False
  try:
    with _quiet_orbax_tasks():
      result = read()
  except Exception as e:  # pylint: disable=broad-exception-caught
    chain = _chain(e)
    fault = next((x for x in chain if _machine_fault(x)), None)
    damage = fault is None and any(isinstance(x, _CONTENT_ERRORS) for x in chain)
    error = _one_line(fault or e)
  if collective:
    error, damage = _first_error(error, damage)
  if error is None:
    return result
  if damage:
    raise _Damaged('unreadable', f'{what} ({error})')
  raise ValueError(f'Reading the checkpoint {path!r} failed ({error}), which does not show '
                   'that it is damaged: nothing was set aside; rerun once the cause is fixed '
                   '(if it persists, move that folder out of the checkpoints by hand).')


def _one_line(error: Exception, limit: int = 300) -> str:
  lines = str(error).strip().splitlines()
  # Orbax appends a dump of the TensorStore spec, cut off here anyway.
  first = lines[0].split(' See full TensorStore details')[0] if lines else ''
  text = f'{type(error).__name__}: {first}' if first else type(error).__name__
  return text if len(text) <= limit else text[:limit] + '...'


def _first_error(error: str | None, damage: bool) -> tuple[str | None, bool]:
  """(error, damage) of the first process whose read failed otherwise than by damage, else
  of the first whose read failed ((None, False) if none did), the same on all."""
  if jax.process_count() == 1:
    return error, damage
  encoded = (error or '').encode('utf-8')[:_ERROR_BYTES]
  row = np.zeros(1 + _ERROR_BYTES, np.uint8)
  row[0] = 0 if error is None else 1 if damage else 2
  row[1:1 + len(encoded)] = np.frombuffer(encoded, np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(row))
  if not gathered[:, 0].any():
    return None, False
  process = int(np.argmax(gathered[:, 0] == gathered[:, 0].max()))
  text = bytes(gathered[process, 1:]).rstrip(b'\0').decode('utf-8', errors='ignore')
  return f'on process {process}: {text}', bool(gathered[process, 0] == 1)


_ERROR_BYTES = 400  # a `_one_line` error, in UTF-8


@contextlib.contextmanager
def _quiet_orbax_tasks():
  """Silences the asyncio log and unraisable-exception reports while Orbax reads.

  Orbax reads the leaves concurrently; after the first failure the others end
  in tasks and coroutines nobody awaits, and TensorStore calls back into the
  closed event loop, each printed as pages of tracebacks naming no checkpoint.
  The one warning line of `_set_aside` says what happened instead.
  """
  logger = stdlib_logging.getLogger('asyncio')
  disabled, hook = logger.disabled, sys.unraisablehook
  logger.disabled, sys.unraisablehook = True, lambda _: None
  try:
    yield
  except Exception:
    time.sleep(0.2)  # lets the reads still in flight fail while they are silenced
    # asyncio logs an unretrieved task exception when the task is collected. Only after a
    # failure: a full collection of a large process costs seconds, on every restore.
    gc.collect()
    raise
  finally:
    logger.disabled, sys.unraisablehook = disabled, hook


def _agree(flag: bool) -> bool:
  """True if `flag` is True on any process, so that all take the same decision."""
  if jax.process_count() == 1:
    return flag
  return bool(np.max(multihost_utils.process_allgather(np.int32(flag))))


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


# Metadata and compatibility --------------------------------------------------

def _saved_tree(path: str):
  """The saved state's tree of array metadata (shape, dtype), read without restoring."""
  return ocp.PyTreeCheckpointHandler().metadata(epath.Path(path)).tree


def _leaf_names(tree) -> list[tuple[str, object]]:
  """(name, leaf) pairs, e.g. ('params/dense/kernel', x); alike for a state and its saved dicts."""
  return [(jax.tree_util.keystr(path, simple=True, separator='/'), x)
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _shapes(tree) -> dict[str, tuple]:
  return {name: (tuple(x.shape), np.dtype(x.dtype)) for name, x in _leaf_names(tree)}


def _describe(shape_dtype) -> str:
  if shape_dtype is None:
    return 'absent'
  shape, dtype = shape_dtype
  return f'{dtype} {shape}'


def _check_fits(path: str, saved_tree, abstract_state) -> None:
  """Raises one sentence if the checkpoint at `path` does not fit `abstract_state`."""
  saved, wanted = _shapes(saved_tree), _shapes(abstract_state)
  # Parameters first: their mismatch is the one a person recognises.
  for name in sorted(set(saved) | set(wanted), key=lambda n: (not n.startswith('params'), n)):
    if saved.get(name) != wanted.get(name):
      raise ValueError(
          f'The checkpoint {path!r} does not fit this config: {name} is '
          f'{_describe(saved.get(name))} there but {_describe(wanted.get(name))} here; use a new '
          '--workdir or the config that wrote it.')


# Digest ------------------------------------------------------------------------

# Fixed forever (hex digits of pi): changing them invalidates every recorded digest.
_SEEDS = (0x243F6A88, 0x85A308D3)


def _mix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's finaliser (Appleby 2011): a bijection of uint32 in which every output bit
  depends on every input bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
  """The bits of `x` as uint32: one word per element, or a trailing axis of words when wider."""
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if x.dtype.itemsize >= 4:
    return lax.bitcast_convert_type(x, jnp.uint32)
  narrow = {1: jnp.uint8, 2: jnp.uint16}[x.dtype.itemsize]
  return lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)


def _checksums(x: jax.Array) -> jax.Array:
  """uint32[2]: c_k = Σ_i m_ki · mix(w_i) mod 2^32 over the words w_i of `x` (flat index i).

  The multipliers m_ki = mix(i ⊕ seed_k) | 1 are odd and depend on the
  position, so any single changed word changes both sums (mix is a bijection
  and an odd number is invertible mod 2^32) and moved values change them too.
  Mixing the word first makes high bits count as much as low ones (Σ m_i w_i
  alone misses two flipped sign bits). Addition mod 2^32 is associative and
  commutative: the sharding and the reduction order cannot change the result.
  """
  words = _words(x)
  # The flat index from per-axis iotas: reshaping a sharded array would move data.
  index, stride = jnp.zeros(words.shape, jnp.uint32), 1
  for axis in reversed(range(words.ndim)):
    position = lax.broadcasted_iota(jnp.uint32, words.shape, axis)
    index = index + position * jnp.uint32(stride % 2**32)  # wraps past 2^32 words, harmlessly
    stride *= words.shape[axis]
  mixed = _mix32(words)
  return jnp.stack([jnp.sum(mixed * (_mix32(index ^ jnp.uint32(seed)) | jnp.uint32(1)),
                            dtype=jnp.uint32) for seed in _SEEDS])


@jax.jit
def _all_checksums(leaves: list) -> jax.Array:
  if not leaves:
    return jnp.zeros((0, len(_SEEDS)), jnp.uint32)
  return jnp.stack([_checksums(x) for x in leaves])


def _host_words(x):
  """NumPy arrays wider than 32 bits as uint32 words, so jit need not canonicalise them."""
  if isinstance(x, np.ndarray) and x.dtype.itemsize >= 8:
    return np.ascontiguousarray(x).view(np.uint32).reshape(x.shape + (-1,))
  return x


def array_digest(state) -> dict[str, dict]:
  """{leaf name: {'shape', 'dtype', 'checksum': [c_1, c_2]}} of a pytree of global arrays.

  The same for any sharding or device count; in a multi-process run every
  process must call it (it is one jitted computation on the global arrays).
  """
  named = _leaf_names(state)
  checksums = np.asarray(jax.device_get(_all_checksums([_host_words(x) for _, x in named])))
  return {name: {'shape': list(np.shape(x)), 'dtype': np.dtype(x.dtype).name,
                 'checksum': [int(c) for c in sums]}
          for (name, x), sums in zip(named, checksums)}


def data_digest(data_state) -> str:
  """sha256 of the canonical JSON of `data_state` as it reads back (tuples as lists, str keys)."""
  as_read = json.loads(json.dumps(data_state))
  canonical = json.dumps(as_read, sort_keys=True, separators=(',', ':'))
  return hashlib.sha256(canonical.encode('utf-8')).hexdigest()


def _digest_mismatch(state, data_state, digest) -> str | None:
  """Why `state` and `data_state` differ from the recorded `digest`, or None if they match."""
  recorded = digest.get('arrays') if isinstance(digest, dict) else None
  if not isinstance(recorded, dict):
    return 'has a malformed digest'
  actual = array_digest(state)
  for name in sorted(set(actual) | set(recorded)):
    if actual.get(name) != recorded.get(name):
      return f'does not match its digest: array {name} differs from what was saved'
  if data_state is not None and data_digest(data_state) != digest.get('data_sha256'):
    return 'does not match its digest: the iterator state differs from what was saved'
  return None


# Reading without a Checkpointer ---------------------------------------------

def variables_mismatch(saved: dict, abstract_variables: tuple) -> str | None:
  """Where the checkpoint's parameters and model state (`saved`) and the model's
  (`abstract_variables`: params, model state) first differ, parameters first: a leaf only one
  of them has, or one of another shape or dtype; None if they agree."""
  params, model_state = abstract_variables
  there = _shapes({'params': saved['params'], **(saved.get('model_state') or {})})
  here = _shapes({'params': params, **model_state})
  for name in sorted(set(there) | set(here), key=lambda n: (not n.startswith('params'), n)):
    if name not in here:
      return f'the model has no {name} ({_describe(there[name])} in the checkpoint)'
    if name not in there:
      return f'the checkpoint has no {name} ({_describe(here[name])} in the model)'
    if there[name] != here[name]:
      return (f'{name} is {_describe(there[name])} in the checkpoint but '
              f'{_describe(here[name])} in the model')
  return None


def eval_variables(saved: dict) -> dict:
  """The variables the run of `saved` (from `restore_arrays`) evaluates with: the parameter
  EMA when the run kept one, else the parameters, beside the model state (batch statistics)."""
  params = saved['params'] if saved.get('ema_params') is None else saved['ema_params']
  return {'params': params, **(saved.get('model_state') or {})}


def _no_checkpoint(directory: str, step: int | None, steps: list[int]) -> FileNotFoundError:
  if step is None:
    return FileNotFoundError(f'No checkpoint in {directory!r}: the run has saved none.')
  return FileNotFoundError(f'No checkpoint of step {step} in {directory!r}; found steps {steps}.')


def restore_arrays(workdir: str, step: int | None = None) -> dict:
  """The saved train state of `step` (the newest good one by default) as dicts of NumPy arrays.

  Needs no model, config or devices matching the run that wrote it, e.g. to
  compare two runs or to inspect parameters in a notebook. The arrays are
  verified against the checkpoint's digest; by default a damaged checkpoint is
  skipped with a warning (and left where it is), an explicit `step` raises
  one sentence, as does a read that fails for a reason outside the checkpoint.
  """
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  steps = (sorted(int(d) for d in os.listdir(directory) if d.isdigit())
           if os.path.isdir(directory) else [])
  if not steps or (step is not None and step not in steps):
    raise _no_checkpoint(directory, step, steps)
  for candidate in ([step] if step is not None else steps[::-1]):
    path = os.path.join(directory, str(candidate))
    try:
      return _read_arrays(path)
    except _Damaged as damage:
      if step is not None:
        raise ValueError(f'The checkpoint {path!r} {damage.reason}.') from None
      logging.warning('Checkpoint %s %s; skipped it.', path, damage.reason)
  raise ValueError(f'None of the checkpoints {steps} in {directory!r} could be read.')


def _read_arrays(path: str) -> dict:
  """The verified state arrays of the checkpoint at `path`; raises _Damaged, or ValueError
  for a read that fails for a reason outside the checkpoint."""
  state_path = os.path.join(path, 'state')
  saved = _attempt(lambda: _saved_tree(state_path), path, 'has unreadable metadata',
                   collective=False)
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
  arrays = _attempt(lambda: ocp.PyTreeCheckpointer().restore(
      state_path, args=ocp.args.PyTreeRestore(restore_args=as_numpy)), path, 'cannot be read',
                    collective=False)
  digest_path = os.path.join(path, 'digest')
  if os.path.isdir(digest_path):
    digest = _attempt(lambda: ocp.JsonCheckpointHandler().restore(epath.Path(digest_path)),
                      path, 'has an unreadable digest', collective=False)
    mismatch = _digest_mismatch(arrays, None, digest)
    if mismatch:
      raise _Damaged('digest-mismatch', mismatch)
  return arrays
