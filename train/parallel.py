"""Parallel execution of the train/eval steps on a `jax.sharding.Mesh`, chosen by config.

Modes (`config.parallel.mode`):
  'jit'        data parallel with `jit` and shardings: batch split over the
               'data' axis, params and optimiser state replicated;
  'fsdp'       `jit`, with params and optimiser state also split over 'data'
               (each array along its largest dimension divisible by the axis);
  'shard_map'  `shard_map` with an explicit `psum` of the gradient and metric
               sums, divided once by the global weight, and `pmean` of batch
               statistics (per-device view of the batch);
  'pmap'       `pmap` over the mesh's devices (each process feeds its own), same
               explicit collectives;
  'tensor'     Megatron-style tensor parallelism (Shoeybi et al. 2019): `jit` on a
               2-D mesh ('data', 'model') of data × `model_parallelism` devices.
               The batch is split over 'data'; each parameter is split by the
               logical axis names its module declares (`nn.with_logical_partitioning`)
               through `logical_axis_rules`. The default, `MEGATRON_RULES`, maps
               batch → data and heads, mlp → model and replicates embed, kv,
               length and vocab, so in a Transformer block

                 Q, K, V = x W^{Q,K,V}   W [D, N, H]  split over heads (by output)
                 h = GELU(x W_1)         W_1 [D, F]   split over mlp   (by output)
                 y = [head_i] W^O        W^O [N, H, D] split over heads (by input)
                 y = h W_2               W_2 [F, D]   split over mlp   (by input)

               each device computes its own heads and hidden units and one
               all-reduce per sub-layer sums the partial outputs. The optimiser
               state that mirrors the parameters and their EMA are split alike;
               leaves without names (e.g. every leaf of a model that declares
               none) are replicated, so any model runs. The steps trace inside
               the mesh and the rules (`Parallel.context`), so the activations'
               `nn.with_logical_constraint`s take effect. A split axis must
               divide its dimension: `abstract_state` stops with one sentence
               naming the parameter otherwise (no fallback).
All modes see the same global batch, so they compute the same parameters up to
floating-point reassociation, for a model and task without random streams. Under
'shard_map' and 'pmap' each device folds its index into the step's keys
(`step._device_key`), so dropout masks and augmentations, and with them the
parameters, depend on the mode and the number of devices (a run resumed in another
mode or on another device count goes on from the same state along another path).

The state has one canonical layout for checkpoints, a global `jax.Array` per
leaf with the mode's sharding (replicated for 'pmap'), so a checkpoint saved in
any mode and on any number or mesh of devices restores in any other (e.g.
'tensor' on 4 × 2 devices into 'tensor' on 2 × 4, or 'jit' on one).
"""

import contextlib
import functools
from typing import Callable

import flax.jax_utils
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MODES = ('jit', 'fsdp', 'shard_map', 'pmap', 'tensor')
AXIS = 'data'
MODEL_AXIS = 'model'
# The logical axis names the models declare on parameters and activations
# (models/attention/core.py, models/transformer/); a model that introduces a
# new name adds it here, so a misspelt rule stops with one sentence.
LOGICAL_AXES = ('batch', 'length', 'embed', 'heads', 'kv', 'mlp', 'vocab')
# Megatron-LM's split (Shoeybi et al. 2019): attention heads and MLP hidden units
# over 'model', examples over 'data', everything else replicated.
MEGATRON_RULES = (('batch', AXIS), ('heads', MODEL_AXIS), ('mlp', MODEL_AXIS), ('embed', None),
                  ('kv', None), ('length', None), ('vocab', None))


def make_mesh(num_devices: int | None = None, model_parallelism: int | None = None) -> Mesh:
  """The mesh over the first `num_devices` devices (all by default).

  1-D with axis 'data', or, given `model_parallelism` (the 'tensor' mode), 2-D
  ('data', 'model') of shape (num_devices / model_parallelism, model_parallelism);
  the devices of one model group are neighbours in `jax.make_mesh`'s order, and in one process.
  """
  devices = jax.devices()
  if num_devices is not None:
    if jax.process_count() > 1 and num_devices != len(devices):
      raise ValueError(f'parallel.num_devices={num_devices} must be all {len(devices)} devices '
                       'in a multi-process run.')
    if not 1 <= num_devices <= len(devices):
      raise ValueError(f'parallel.num_devices={num_devices} is not between 1 and the '
                       f'{len(devices)} available devices.')
    devices = devices[:num_devices]
  if model_parallelism is None:
    return Mesh(np.array(devices), (AXIS,))
  if not isinstance(model_parallelism, int) or model_parallelism < 1 or (
      len(devices) % model_parallelism):
    raise ValueError(f'parallel.model_parallelism={model_parallelism!r} must be a positive '
                     f'integer that divides the {len(devices)} devices.')
  shape = (len(devices) // model_parallelism, model_parallelism)
  mesh = jax.make_mesh(shape, (AXIS, MODEL_AXIS), axis_types=(AxisType.Auto,) * 2,
                       devices=devices)
  # Each process reads its own examples (data.pipeline), so a model group, which must see the
  # same ones, cannot span processes.
  if any(len({d.process_index for d in row}) > 1 for row in mesh.devices):
    raise ValueError(f'parallel.model_parallelism={model_parallelism} puts the devices of '
                     'several processes in one model group; in a multi-process run it must '
                     f'divide the {jax.local_device_count()} devices of each process.')
  return mesh


def check_rules(rules) -> tuple:
  """`rules` as ((logical axis, mesh axis | (mesh axes) | None), ...); one sentence if malformed."""
  checked = []
  for rule in rules:
    if not isinstance(rule, (list, tuple)) or len(rule) != 2:
      raise ValueError(f'parallel.logical_axis_rules holds {rule!r}; each rule is a pair '
                       '(logical axis, mesh axis or None).')
    name, axes = rule
    if name not in LOGICAL_AXES:
      raise ValueError(f'parallel.logical_axis_rules names the unknown logical axis {name!r}; '
                       f'known: {", ".join(LOGICAL_AXES)}.')
    axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
    if not all(a in (AXIS, MODEL_AXIS) for a in (axes if isinstance(axes, tuple) else (axes,))
               if a is not None):
      raise ValueError(f'parallel.logical_axis_rules maps {name!r} to {axes!r}; allowed: '
                       f"'{AXIS}', '{MODEL_AXIS}', a tuple of them or None.")
    checked.append((name, axes))
  return tuple(checked)


def fsdp_spec(shape: tuple[int, ...], axis_size: int, min_size: int) -> P:
  """Splits the largest dimension divisible by `axis_size`; small arrays stay replicated."""
  if int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  candidates = [d for d in range(len(shape)) if shape[d] % axis_size == 0]
  if not candidates:
    return P()
  dim = max(candidates, key=lambda d: shape[d])
  return P(*([None] * dim + [AXIS]))


def _is_boxed(x) -> bool:
  return isinstance(x, nn.Partitioned)


def unbox(tree):
  """`tree` with every leaf boxed with axis names (`nn.Partitioned`) replaced by its value."""
  return jax.tree.map(lambda x: x.value if _is_boxed(x) else x, tree, is_leaf=_is_boxed)


class Parallel:
  """Places state and batches on the mesh and compiles the steps for one mode.

  The `init_fn` given to `abstract_state` and `init_state` may return leaves
  boxed with logical axis names (`nn.LogicallyPartitioned`, see
  `train.state.init_train_state(logical_axes=True)`): every mode unboxes them,
  'tensor' also shards them by `logical_axis_rules` (default `MEGATRON_RULES`).
  """

  def __init__(self, mode: str, mesh: Mesh, fsdp_min_size: int = 1024,
               logical_axis_rules=None):
    if mode not in MODES:
      raise ValueError(f'Unknown parallel.mode {mode!r}; allowed: {", ".join(MODES)}.')
    if mode == 'tensor' and mesh.axis_names != (AXIS, MODEL_AXIS):
      raise ValueError(f"parallel.mode='tensor' needs a mesh with axes ('{AXIS}', "
                       f"'{MODEL_AXIS}') (make_mesh(..., model_parallelism)), got "
                       f'{mesh.axis_names}.')
    if isinstance(fsdp_min_size, bool) or not isinstance(fsdp_min_size, int) or fsdp_min_size < 0:
      raise ValueError(f'parallel.fsdp_min_size must be a non-negative integer (arrays of fewer '
                       f'elements stay replicated), got {fsdp_min_size!r}.')
    self.mode, self.mesh, self.fsdp_min_size = mode, mesh, fsdp_min_size
    self.rules = check_rules(MEGATRON_RULES if logical_axis_rules is None else logical_axis_rules)
    self.replicated = NamedSharding(mesh, P())
    self.batch_sharding = NamedSharding(mesh, P(AXIS))
    if mode == 'pmap':
      self.local_devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]

  @property
  def num_devices(self) -> int:
    return self.mesh.size

  @property
  def data_size(self) -> int:
    """How many ways the batch is split: the size of the 'data' axis."""
    return self.mesh.shape[AXIS]

  @property
  def axis_name(self) -> str | None:
    """The mapped axis the model must average batch statistics over, if any."""
    return AXIS if self.mode in ('shard_map', 'pmap') else None

  @contextlib.contextmanager
  def context(self):
    """Where the steps trace: in 'tensor' mode the mesh and the logical axis rules, so the
    models' `nn.with_logical_constraint`s take effect (elsewhere they stay no-ops)."""
    if self.mode != 'tensor':
      yield
      return
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  # State placement -------------------------------------------------------

  def state_shardings(self, state):
    """The canonical (checkpoint) sharding of every leaf of `state` (arrays or shapes, maybe
    boxed with logical axis names); the tree it returns is unboxed."""
    if self.mode == 'tensor':
      return jax.tree_util.tree_map_with_path(self._logical_sharding, state, is_leaf=_is_boxed)
    state = unbox(state)
    if self.mode != 'fsdp':
      return jax.tree.map(lambda _: self.replicated, state)
    # Floating-point leaves (parameters, optimiser moments, statistics) are split; the step
    # count and the random key stay whole, as the host reads them between steps.
    return jax.tree.map(
        lambda x: NamedSharding(self.mesh, fsdp_spec(x.shape, self.mesh.size, self.fsdp_min_size)
                                if jnp.issubdtype(x.dtype, jnp.floating) else P()),
        state)

  def _logical_sharding(self, path, x) -> NamedSharding:
    """The 'tensor' sharding of one leaf: its logical names through the rules, else replicated."""
    if isinstance(x, nn.LogicallyPartitioned):
      spec = nn.logical_to_mesh_axes(x.names, self.rules)
    elif _is_boxed(x):
      spec = P(*x.names)
    else:
      return self.replicated
    shape = x.value.shape
    for dim, axes in enumerate(spec):
      size = int(np.prod([self.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else
                                                      axes or ())]))
      if shape[dim] % size:
        name = jax.tree_util.keystr(path, simple=True, separator='/')
        raise ValueError(
            f'The mesh axis {axes!r} of size {size} does not divide dimension {dim} '
            f'({x.names[dim]!r}, size {shape[dim]}) of {name}; choose a '
            'parallel.model_parallelism that divides it or map '
            f'{x.names[dim]!r} to None in parallel.logical_axis_rules.')
    return NamedSharding(self.mesh, spec) if any(spec) else self.replicated

  def _step_shardings(self, abstract_state):
    """The shardings on this mesh that `abstract_state` carries (from `abstract_state`), else
    the canonical shardings of its shapes."""
    def carried(x, canonical):
      sharding = getattr(x, 'sharding', None)
      return sharding if isinstance(sharding, NamedSharding) and sharding.mesh == self.mesh else canonical
    return jax.tree.map(carried, abstract_state, self.state_shardings(abstract_state))

  def abstract_state(self, init_fn: Callable, rng):
    """Shapes, dtypes and canonical shardings of the state, e.g. as a restore target."""
    shapes = jax.eval_shape(init_fn, rng)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        unbox(shapes), self.state_shardings(shapes))

  def init_state(self, init_fn: Callable, rng):
    """Runs `init_fn(rng)` directly into the canonical sharding (no host copy)."""
    shardings = jax.tree.map(lambda x: x.sharding, self.abstract_state(init_fn, rng))
    return jax.jit(lambda r: unbox(init_fn(r)), out_shardings=shardings)(rng)

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

  def per_device_train_step(self, train_step: Callable) -> Callable:
    """`train_step(state, batch)` on global arrays: under 'shard_map' and 'pmap' it runs on each
    device's part of the batch under `shard_map` (pmap's step traces alike), so its
    collectives over 'data' (e.g. batch norm's) are bound; elsewhere `train_step` itself."""
    if self.axis_name is None:
      return train_step
    return jax.shard_map(functools.partial(train_step, axis_name=AXIS), mesh=self.mesh,
                         in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False)

  def per_device_eval_step(self, eval_step: Callable) -> Callable:
    """`eval_step(state, batch, index)` on global arrays, mapped as `per_device_train_step`."""
    if self.axis_name is None:
      return eval_step
    return jax.shard_map(functools.partial(eval_step, axis_name=AXIS), mesh=self.mesh,
                         in_specs=(P(), P(AXIS), P()), out_specs=P(), check_vma=False)

  def compile_train_step(self, train_step: Callable, abstract_state):
    """`train_step(state, batch, axis_name=...)` compiled for this mode, donating the state.

    `abstract_state` is `self.abstract_state(...)`: the step keeps its shardings.
    In 'tensor' mode the step traces, and runs, inside `self.context()`.
    """
    if self.mode == 'pmap':
      # Every device of the mesh, the same list in every process (JAX's rule for `devices`):
      # with only its own, each process would reduce over its own devices and train apart.
      step = jax.pmap(functools.partial(train_step, axis_name=AXIS), axis_name=AXIS,
                      devices=list(self.mesh.devices.flat), donate_argnums=0)
      return lambda state, batch: _first_replica_metrics(*step(state, batch))
    shardings = self._step_shardings(abstract_state)
    if self.mode == 'shard_map':
      train_step = self.per_device_train_step(train_step)
    jitted = jax.jit(train_step, in_shardings=(shardings, self.batch_sharding),
                     out_shardings=(shardings, self.replicated), donate_argnums=0)
    return jitted if self.mode != 'tensor' else _InContext(jitted, self.context)

  def compile_eval_step(self, eval_step: Callable, abstract_state):
    """`eval_step(state, batch, index, axis_name=...)`; it takes the canonical state layout."""
    shardings = self._step_shardings(abstract_state)
    # pmap's eval also runs under shard_map on the canonical layout, so the
    # state need not be converted for every evaluation.
    eval_step = self.per_device_eval_step(eval_step)
    jitted = _InContext(jax.jit(eval_step, in_shardings=(shardings, self.batch_sharding,
                                                         self.replicated),
                                out_shardings=self.replicated), self.context)
    return lambda state, batch, index: jitted(state, self.global_batch(batch), index)


class _InContext:
  """A jitted step that traces, lowers and runs inside `context()`."""

  def __init__(self, jitted, context):
    self.jitted, self.context = jitted, context

  def __call__(self, *args):
    with self.context():
      return self.jitted(*args)

  def lower(self, *args):
    with self.context():
      return self.jitted.lower(*args)


def _first_replica_metrics(state, metrics):
  return state, jax.tree.map(lambda x: x[0], metrics)
