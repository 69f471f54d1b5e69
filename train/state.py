"""The train state: one pytree holding everything a step reads and writes."""

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from train.tasks import base


@flax.struct.dataclass
class TrainState:
  """params, optimiser state, mutable model collections, RNG, step and parameter EMA.

  `model_state` holds the task's state collections of the model (e.g.
  `{'batch_stats': ...}`); `rng` is a raw uint32 key from which each step draws
  `fold_in(rng, step)`, so a resumed run draws the same randomness.
  `ema_params` is the exponential moving average of `params` when the run keeps
  one (`config.ema_decay > 0`), else None; evaluation and sampling use it.
  """
  step: jnp.ndarray
  params: Any
  opt_state: Any
  model_state: Any
  rng: jnp.ndarray
  ema_params: Any = None

  @property
  def eval_params(self):
    """The parameters evaluation and sampling use: the EMA when kept."""
    return self.params if self.ema_params is None else self.ema_params


def init_variables(model: nn.Module, task: base.Task, rng: jnp.ndarray, example_batch: dict, *,
                   unbox: bool = True):
  """`model.init` on the task's inputs for `example_batch`; returns (params, model_state).

  Only the task's `state_collections` are kept: per-call collections such as a
  decoding 'cache' never enter the train state. Parameters declared with logical
  axis names (`nn.with_logical_partitioning`) are unboxed to plain arrays, or,
  with `unbox=False`, stay in their `nn.LogicallyPartitioned` boxes.
  """
  init_rng, stream_rng = jax.random.split(rng)
  rngs = {'params': init_rng, **base.stream_keys(stream_rng, task, model)}
  variables = model.init(rngs, *task.model_inputs(example_batch), train=False, method=task.method)
  if unbox:
    variables = nn.unbox(variables)
  model_state = {name: variables[name] for name in task.state_collections if name in variables}
  return variables['params'], model_state


def init_train_state(model: nn.Module, task: base.Task, tx: optax.GradientTransformation,
                     rng: jnp.ndarray, example_batch: dict, *, ema: bool = False,
                     logical_axes: bool = False) -> TrainState:
  """Initialises the model on `example_batch` (any batch size) and the optimiser.

  With `logical_axes`, the leaves the model declared with logical axis names
  stay boxed (`nn.LogicallyPartitioned`) for `train/parallel.py` to shard and
  unbox: the parameters, their EMA and every optimiser-state subtree that
  mirrors them (same tree and shapes, e.g. Adam's first and second moments).
  The optimiser itself always sees plain arrays.
  """
  init_rng, state_rng = jax.random.split(rng)
  boxed_params, boxed_model_state = init_variables(model, task, init_rng, example_batch, unbox=False)
  params, model_state = nn.unbox(boxed_params), nn.unbox(boxed_model_state)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     model_state=model_state, rng=state_rng,
                     ema_params=jax.tree.map(jnp.copy, params) if ema else None)
  if not logical_axes:
    return state
  return state.replace(params=boxed_params, model_state=boxed_model_state,
                       opt_state=_mirror_boxes(state.opt_state, boxed_params),
                       ema_params=_mirror_boxes(state.ema_params, boxed_params))


def _is_box(x) -> bool:
  return isinstance(x, nn.Partitioned)


def _mirror_boxes(tree, boxed_params):
  """`tree` with each subtree shaped like the parameters boxed like them."""
  params = nn.unbox(boxed_params)
  structure, shapes = jax.tree.structure(params), [p.shape for p in jax.tree.leaves(params)]

  def like_params(node) -> bool:
    return (jax.tree.structure(node) == structure and
            [getattr(x, 'shape', None) for x in jax.tree.leaves(node)] == shapes)

  def rebox(node):
    if not like_params(node):
      return node
    return jax.tree.map(lambda box, x: box.replace_boxed(x) if _is_box(box) else x,
                        boxed_params, node, is_leaf=_is_box)

  return jax.tree.map(rebox, tree, is_leaf=like_params)


def from_saved_arrays(saved: dict) -> TrainState:
  """The evaluation view of a checkpoint read by `checkpoint.restore_arrays`: its
  parameters, EMA, model state, key and step on the device, without optimiser state."""
  return jax.device_put(TrainState(
      step=saved['step'], params=saved['params'], opt_state=None,
      model_state=saved.get('model_state') or {}, rng=saved['rng'],
      ema_params=saved.get('ema_params')))
