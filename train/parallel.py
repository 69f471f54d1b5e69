"""Parallel execution of the train/eval steps on a `jax.sharding.Mesh`, chosen by config.

Modes (`config.parallel.mode`):
  'jit'        data parallel with `jit` and shardings: batch split over the
               'data' axis, params and optimiser state replicated;
  'fsdp'       `jit`, with params and optimiser state also split over 'data'
               (each array along its largest dimension divisible by the axis);
  'shard_map'  `shard_map` with explicit `pmean` of gradients, metrics and
               batch statistics (per-device view of the batch);
  'pmap'       `pmap` over the local devices, same explicit collectives.
All modes see the same global batch, so they compute the same parameters up to
floating-point reassociation.

The state has one canonical layout for checkpoints, a global `jax.Array` per
leaf with the mode's sharding (replicated for 'pmap'), so a checkpoint saved in
any mode and on any number of devices restores in any other.
"""

import functools
from typing import Callable

import flax.jax_utils
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MODES = ('jit', 'fsdp', 'shard_map', 'pmap')
AXIS = 'data'


def make_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh with axis 'data' over the first `num_devices` devices (all by default)."""
  devices = jax.devices()
  if num_devices is not None:
    if jax.process_count() > 1 and num_devices != len(devices):
      raise ValueError(f'parallel.num_devices={num_devices} must be all {len(devices)} devices '
                       'in a multi-process run.')
    if not 1 <= num_devices <= len(devices):
      raise ValueError(f'parallel.num_devices={num_devices} is not between 1 and the '
                       f'{len(devices)} available devices.')
    devices = devices[:num_devices]
  return Mesh(np.array(devices), (AXIS,))


def fsdp_spec(shape: tuple[int, ...], axis_size: int, min_size: int) -> P:
  """Splits the largest dimension divisible by `axis_size`; small arrays stay replicated."""
  if int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  candidates = [d for d in range(len(shape)) if shape[d] % axis_size == 0]
  if not candidates:
    return P()
  dim = max(candidates, key=lambda d: shape[d])
  return P(*([None] * dim + [AXIS]))


class Parallel:
  """Places state and batches on the mesh and compiles the steps for one mode."""

  def __init__(self, mode: str, mesh: Mesh, fsdp_min_size: int = 1024):
    if mode not in MODES:
      raise ValueError(f'Unknown parallel.mode {mode!r}; allowed: {", ".join(MODES)}.')
    self.mode, self.mesh, self.fsdp_min_size = mode, mesh, fsdp_min_size
    self.replicated = NamedSharding(mesh, P())
    self.batch_sharding = NamedSharding(mesh, P(AXIS))
    if mode == 'pmap':
      self.local_devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]

  @property
  def num_devices(self) -> int:
    return self.mesh.size

  @property
  def axis_name(self) -> str | None:
    """The mapped axis the model must average batch statistics over, if any."""
    return AXIS if self.mode in ('shard_map', 'pmap') else None

  # State placement -------------------------------------------------------

  def state_shardings(self, abstract_state):
    """The canonical (checkpoint) sharding of every state leaf."""
    if self.mode != 'fsdp':
      return jax.tree.map(lambda _: self.replicated, abstract_state)
    return jax.tree.map(
        lambda x: NamedSharding(self.mesh, fsdp_spec(x.shape, self.mesh.size, self.fsdp_min_size)),
        abstract_state)

  def abstract_state(self, init_fn: Callable, rng):
    """Shapes, dtypes and canonical shardings of the state, e.g. as a restore target."""
    shapes = jax.eval_shape(init_fn, rng)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, self.state_shardings(shapes))

  def init_state(self, init_fn: Callable, rng):
    """Runs `init_fn(rng)` directly into the canonical sharding (no host copy)."""
    shardings = self.state_shardings(jax.eval_shape(init_fn, rng))
    return jax.jit(init_fn, out_shardings=shardings)(rng)

  def to_run_layout(self, state):
    """Canonical layout -> the layout the compiled step takes."""
    if self.mode != 'pmap':
      return state
    return flax.jax_utils.replicate(jax.tree.map(np.asarray, state), self.local_devices)

  def to_canonical(self, state):
    """The compiled step's layout -> canonical layout (for checkpoints and eval)."""
    if self.mode != 'pmap':
      return state
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(self.replicated, np.asarray(x[0])), state)

  # Batches ----------------------------------------------------------------

  def shard_batch(self, local_batch: dict):
    """This process's slice of the global batch -> the train step's batch layout."""
    if self.mode == 'pmap':
      n = len(self.local_devices)
      return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), local_batch)
    return self.global_batch(local_batch)

  def global_batch(self, local_batch: dict):
    """This process's slice of the global batch -> global arrays split over 'data'."""
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(self.batch_sharding, x), local_batch)

  # Compiled steps ---------------------------------------------------------

  def compile_train_step(self, train_step: Callable, abstract_state):
    """`train_step(state, batch, axis_name=...)` compiled for this mode, donating the state."""
    if self.mode == 'pmap':
      step = jax.pmap(functools.partial(train_step, axis_name=AXIS), axis_name=AXIS,
                      devices=self.local_devices, donate_argnums=0)
      return lambda state, batch: _first_replica_metrics(*step(state, batch))
    shardings = self.state_shardings(abstract_state)
    if self.mode == 'shard_map':
      train_step = jax.shard_map(functools.partial(train_step, axis_name=AXIS), mesh=self.mesh,
                                 in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False)
    return jax.jit(train_step, in_shardings=(shardings, self.batch_sharding),
                   out_shardings=(shardings, self.replicated), donate_argnums=0)

  def compile_eval_step(self, eval_step: Callable, abstract_state):
    """`eval_step(state, batch, index, axis_name=...)`; it takes the canonical state layout."""
    shardings = self.state_shardings(abstract_state)
    if self.mode in ('shard_map', 'pmap'):
      # pmap's eval also runs under shard_map on the canonical layout, so the
      # state need not be converted for every evaluation.
      eval_step = jax.shard_map(functools.partial(eval_step, axis_name=AXIS), mesh=self.mesh,
                                in_specs=(P(), P(AXIS), P()), out_specs=P(), check_vma=False)
    jitted = jax.jit(eval_step, in_shardings=(shardings, self.batch_sharding, self.replicated),
                     out_shardings=self.replicated)
    return lambda state, batch, index: jitted(state, self.global_batch(batch), index)


def _first_replica_metrics(state, metrics):
  return state, jax.tree.map(lambda x: x[0], metrics)
