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


def init_variables(model: nn.Module, task: base.Task, rng: jnp.ndarray, example_batch: dict):
  """`model.init` on the task's inputs for `example_batch`; returns (params, model_state).

  Only the task's `state_collections` are kept: per-call collections such as a
  decoding 'cache' never enter the train state. Parameters declared with logical
  axis names (`nn.with_logical_partitioning`) are unboxed to plain arrays; the
  names are read from the abstract init by `train/parallel.py`.
  """
  init_rng, stream_rng = jax.random.split(rng)
  rngs = {'params': init_rng, **{name: base.stream_key(stream_rng, name) for name in task.rng_streams}}
  variables = nn.unbox(model.init(rngs, *task.model_inputs(example_batch), train=False,
                                  method=task.method))
  model_state = {name: variables[name] for name in task.state_collections if name in variables}
  return variables['params'], model_state


def init_train_state(model: nn.Module, task: base.Task, tx: optax.GradientTransformation,
                     rng: jnp.ndarray, example_batch: dict, *, ema: bool = False) -> TrainState:
  """Initialises the model on `example_batch` (any batch size) and the optimiser."""
  init_rng, state_rng = jax.random.split(rng)
  params, model_state = init_variables(model, task, init_rng, example_batch)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    model_state=model_state, rng=state_rng,
                    ema_params=jax.tree.map(jnp.copy, params) if ema else None)
