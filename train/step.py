"""The pure train and eval steps, generic over model, task and optimiser.

Both are written for one device's view of the batch. Under `jit` that view is
the global batch (XLA inserts the collectives); under `shard_map` and `pmap` it
is the local shard and `axis_name` names the mapped device axis.

Every metric is a weighted sum (see `train/tasks/base.py`): the step sums each
(total, weight) pair over its batch, `psum`s the sums over devices and divides
once. The gradient is that of Σ loss totals / Σ loss weights over the *global*
batch, so a token-weighted loss with uneven padding gives the same parameters
in every parallel mode and with any number of gradient-accumulation steps.
"""

import jax
import jax.numpy as jnp
import optax

from train.state import TrainState
from train.tasks import base

# Folded into the state's key for evaluation, so eval streams never repeat a step's.
_EVAL_STREAM = 0x7E57


def _psum(tree, axis_name):
  return tree if axis_name is None else jax.lax.psum(tree, axis_name)


def _batch_size(batch: dict) -> int:
  return jax.tree.leaves(batch)[0].shape[0]


def sum_metrics(metrics: base.Metrics, batch_size: int, mask_B=None) -> dict:
  """{name: (total, weight)} with a leading batch axis → {name: (Σ total, Σ weight)} scalars.

  Examples whose `mask_B` is 0 count in neither sum. Raises ValueError (at trace
  time, so setup catches it) for a pair of the wrong shape.
  """
  sums = {}
  for name, pair in metrics.items():
    if not (isinstance(pair, tuple) and len(pair) == 2):
      raise ValueError(f'Metric {name!r} must be a (total, weight) pair, got {type(pair).__name__}.')
    total, weight = (jnp.asarray(x, jnp.float32) for x in pair)
    if total.shape != weight.shape or total.ndim == 0 or total.shape[0] != batch_size:
      raise ValueError(f'Metric {name!r} has a total of shape {total.shape} and a weight of shape '
                       f'{weight.shape}; both need the same shape, batch axis ({batch_size}) first.')
    if mask_B is not None:
      mask = mask_B.astype(jnp.float32).reshape((batch_size,) + (1,) * (total.ndim - 1))
      total, weight = total * mask, weight * mask
    sums[name] = (jnp.sum(total), jnp.sum(weight))
  return sums


def _device_key(key: jax.Array, axis_name: str | None) -> jax.Array:
  # Under shard_map/pmap each device draws its own masks and augmentations.
  return key if axis_name is None else jax.random.fold_in(key, jax.lax.axis_index(axis_name))


def ema_decay_at(ema_decay: float, num_updates) -> jax.Array:
  """The average's decay after `num_updates` updates, min(ema_decay, (1 + n)/(10 + n)): the
  warm-up of TensorFlow's ExponentialMovingAverage (its `num_updates`), without which the
  average of a short run keeps a large share of the initial parameters (0.999^1,500 = 22%,
  enough to spoil a network whose output layer starts at zero)."""
  n = jnp.asarray(num_updates, jnp.float32)
  return jnp.minimum(ema_decay, (1 + n) / (10 + n))


def train_step(state: TrainState, batch: dict, *, model, task: base.Task,
               tx: optax.GradientTransformation, learning_rate_fn: optax.Schedule,
               grad_accum_steps: int = 1, ema_decay: float = 0.0,
               axis_name: str | None = None) -> tuple[TrainState, dict]:
  """One optimiser step on `batch`; returns the new state and the step's metrics.

  The batch is split into `grad_accum_steps` micro-batches whose gradients of
  the loss *totals* are summed before the one division by the total weight,
  which equals one step on the whole batch (batch statistics aside: each
  micro-batch, every A-th example, normalises by its own). Step t's random streams derive from
  `fold_in(rng, t)` (then the device index and the micro-batch index).

  A step whose loss, gradients or updated state are not finite leaves the state
  as it was (but for the step counter) and reports `skipped` = 1.

  Metrics: {'totals': {name: (Σ total, Σ weight)} over the global batch,
  'grad_norm', 'learning_rate' (the one this step's update uses: the schedule at the number
  of updates made so far, which skipped steps do not advance), 'skipped'}.
  """
  step_key = _device_key(jax.random.fold_in(state.rng, state.step), axis_name)
  # A multi-process run passes each process's stop request (SIGTERM) with the batch;
  # its maximum over the global batch is the same on every process.
  batch = dict(batch)
  stop_B = batch.pop('stop_requested', None)

  def micro_step(model_state, micro_batch, key):
    rngs = base.stream_keys(key, task, model)
    micro_batch = task.transform(rngs, micro_batch, True)

    def loss_total(params):
      bound = base.BoundModel(model, params, model_state, rngs, train=True, axis_name=axis_name)
      metrics = task.loss(bound, micro_batch)
      if 'loss' not in metrics:
        raise ValueError(f'A task loss must report a "loss" metric; it reported {sorted(metrics)}.')
      sums = sum_metrics(metrics, _batch_size(micro_batch))
      return sums['loss'][0], (sums, bound.model_state)

    (_, (sums, model_state)), grads = jax.value_and_grad(loss_total, has_aux=True)(state.params)
    return model_state, grads, sums

  # Micro-batch k holds the examples k, k + A, k + 2A, … (A = grad_accum_steps): the same
  # examples whether the step sees the global batch (jit) or each device its contiguous share
  # (shard_map, pmap), so batch statistics over a micro-batch agree between the modes.
  micro_batches = jax.tree.map(
      lambda x: x.reshape((x.shape[0] // grad_accum_steps, grad_accum_steps) + x.shape[1:])
      .swapaxes(0, 1), batch)
  first = jax.tree.map(lambda x: x[0], micro_batches)
  key = step_key if grad_accum_steps == 1 else jax.random.fold_in(step_key, 0)
  model_state, grads, sums = micro_step(state.model_state, first, key)
  if grad_accum_steps > 1:
    def accumulate(carry, inputs):
      model_state, grads_acc, sums_acc = carry
      index, micro_batch = inputs
      model_state, grads, sums = micro_step(model_state, micro_batch,
                                            jax.random.fold_in(step_key, index))
      return (model_state, jax.tree.map(jnp.add, grads_acc, grads),
              jax.tree.map(jnp.add, sums_acc, sums)), None

    rest = jax.tree.map(lambda x: x[1:], micro_batches)
    (model_state, grads, sums), _ = jax.lax.scan(
        accumulate, (model_state, grads, sums), (jnp.arange(1, grad_accum_steps), rest))

  grads, sums = _psum((grads, sums), axis_name)
  grads = jax.tree.map(lambda g: g / sums['loss'][1], grads)
  if axis_name is not None:
    # Batch norm already averages its statistics over `axis_name`; this keeps any
    # other state collection identical on every device.
    model_state = jax.lax.pmean(model_state, axis_name)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema_params = state.ema_params
  if ema_params is not None:
    decay = ema_decay_at(ema_decay, state.step + 1)
    ema_params = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema_params, params)
  updated = (params, opt_state, model_state, ema_params)
  # The guard: a step whose loss, gradients or result are not finite changes nothing
  # but the step counter (so the next step draws new data and randomness). Every
  # device computes the same verdict from the same reduced values.
  finite = _all_finite((sums['loss'], grads, updated))
  # One conditional over the whole state, not a select per leaf: the same result, and
  # on a CPU it compiles about 3 times faster for a small Transformer (5 s vs 16 s).
  params, opt_state, model_state, ema_params = jax.lax.cond(
      finite, lambda: updated,
      lambda: (state.params, state.opt_state, state.model_state, state.ema_params))
  metrics = {'totals': sums, 'grad_norm': optax.tree.norm(grads),
             'learning_rate': learning_rate_fn(schedule_count(state.opt_state, state.step)),
             'skipped': jnp.logical_not(finite).astype(jnp.int32)}
  if stop_B is not None:
    stop = jnp.max(stop_B)
    metrics['stop_requested'] = stop if axis_name is None else jax.lax.pmax(stop, axis_name)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            model_state=model_state, ema_params=ema_params)
  return new_state, metrics


def schedule_count(opt_state, default):
  """The number of updates the optimizer's learning-rate schedule has counted (it skips the
  steps the guard skipped, which the train step counts), or `default` if it keeps none."""
  for path, count in optax.tree_utils.tree_get_all_with_path(opt_state, 'count'):
    if getattr(path[-1], 'tuple_name', None) == 'ScaleByScheduleState':
      return count
  return default


def _all_finite(tree) -> jax.Array:
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def eval_step(state: TrainState, batch: dict, index, *, model, task: base.Task,
              axis_name: str | None = None) -> dict:
  """{name: (Σ total, Σ weight)} over the real (`mask` == 1) examples of `batch`.

  `index` (the batch's position in the evaluation) seeds the batch's random
  streams, so every batch draws fresh streams and a rerun draws the same.
  """
  key = jax.random.fold_in(jax.random.fold_in(state.rng, _EVAL_STREAM), index)
  rngs = base.stream_keys(_device_key(key, axis_name), task, model)
  batch = task.transform(rngs, batch, False)
  bound = base.BoundModel(model, state.eval_params, state.model_state, rngs, train=False,
                          axis_name=axis_name)
  sums = sum_metrics(task.eval_metrics(bound, batch), _batch_size(batch), batch['mask'])
  return _psum(sums, axis_name)
