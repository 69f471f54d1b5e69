"""The pure train and eval steps, generic over model, task and optimiser.

Both are written for one device's view of the batch. Under `jit` that view is
the global batch (XLA inserts the collectives); under `shard_map` and `pmap` it
is the local shard and `axis_name` names the mapped device axis, over which the
steps average gradients, metrics and batch statistics explicitly.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from train.state import TrainState


def _mean_over_devices(tree, axis_name):
  return tree if axis_name is None else jax.lax.pmean(tree, axis_name)


def train_step(state: TrainState, batch: dict, *, model, task: Callable,
               tx: optax.GradientTransformation, learning_rate_fn: optax.Schedule,
               augment: Callable | None = None,
               axis_name: str | None = None) -> tuple[TrainState, dict]:
  """One optimiser step on `batch`; returns the new state and batch-mean metrics.

  `augment(key, batch) -> batch`, if given, transforms the batch on the device
  first. The step's randomness is `fold_in(state.rng, step)`: the model's
  dropout key, and (folded once more) the augmentation key.
  """
  step_rng = jax.random.fold_in(state.rng, state.step)
  if axis_name is not None:
    # Each device draws its own dropout masks and augmentations.
    step_rng = jax.random.fold_in(step_rng, jax.lax.axis_index(axis_name))
  if augment is not None:
    batch = augment(jax.random.fold_in(step_rng, 1), batch)

  def loss_fn(params):
    per_example, model_state = task(model, {'params': params, **state.model_state}, batch,
                                    step_rng, True)
    means = jax.tree.map(jnp.mean, per_example)
    return means['loss'], (means, model_state)

  (_, (metrics, model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grads = _mean_over_devices(grads, axis_name)
  metrics = _mean_over_devices(metrics, axis_name)
  model_state = _mean_over_devices(model_state, axis_name)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {**metrics, 'grad_norm': optax.tree.norm(grads),
             'learning_rate': learning_rate_fn(state.step)}
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            model_state=model_state)
  return new_state, metrics


def eval_step(state: TrainState, batch: dict, *, model, task: Callable,
              axis_name: str | None = None) -> dict:
  """Sums of per-example metrics over the real (mask == 1) examples, and their count."""
  per_example, _ = task(model, {'params': state.params, **state.model_state}, batch,
                        state.rng, False)
  mask_B = batch['mask'].astype(jnp.float32)
  sums = {name: jnp.sum(values * mask_B) for name, values in per_example.items()}
  sums['count'] = jnp.sum(mask_B)
  return sums if axis_name is None else jax.lax.psum(sums, axis_name)
