"""The train state: one pytree holding everything a step reads and writes."""

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """params, optimiser state, mutable model collections, RNG and step.

  `model_state` holds every non-parameter collection of the model (e.g.
  `{'batch_stats': ...}`); `rng` is a raw uint32 key from which each step draws
  `fold_in(rng, step)`, so a resumed run draws the same randomness.
  """
  step: jnp.ndarray
  params: Any
  opt_state: Any
  model_state: Any
  rng: jnp.ndarray


def init_train_state(model: nn.Module, tx: optax.GradientTransformation, rng: jnp.ndarray,
                     example_input: jnp.ndarray) -> TrainState:
  """Initialises the model on `example_input` (shape of one batch) and the optimiser."""
  init_rng, dropout_rng, state_rng = jax.random.split(rng, 3)
  variables = model.init({'params': init_rng, 'dropout': dropout_rng}, example_input, train=False)
  variables = dict(variables)
  params = variables.pop('params')
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    model_state=variables, rng=state_rng)
