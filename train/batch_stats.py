"""Post-training batch-norm statistics: every BatchNorm layer's exact population mean and
variance over a data set, written in place of the running averages kept in training.

Batch normalisation (Ioffe & Szegedy 2015, "Batch Normalization: Accelerating Deep
Network Training by Reducing Internal Covariate Shift", §3.1) normalises in training
by the mini-batch's per-channel statistics, x̂ = (x − μ_B) / √(σ²_B + ε), and at
inference by population statistics instead. Flax keeps an exponential moving average
of the mini-batch statistics for that (`ra ← momentum·ra + (1 − momentum)·stat`); the
alternative is to compute them after training by running the trained model on the
whole data set and fixing them to the result. That is what this module does.

Definition. The exact population statistics are those each BN layer would compute in
training mode if the entire data set were one batch: layer ℓ's per-channel mean and
biased variance of its input (over batch, height and width for a convolution), where
that input is computed with every earlier BN layer normalising by its own exact
population statistics (inference mode).

Layer ℓ's input depends on the statistics of the BN layers before it, so the
computation takes sequential passes. Pass k runs the model in inference mode over all
the data with the current statistics and pools, per layer and channel, the count, mean
and centred sum of squares of the layer's input; after pass k every layer whose BN
ancestors were all exact is exact. Layers that do not depend on each other become
exact in the same pass; a pass that changes no statistic ends the loop, and after as
many passes as there are BN layers all are exact.

Precision: each batch's moments are computed two-pass in float32 (mean, then
Σ w (x − mean)², no E[x²] − E[x]² cancellation), and batches are pooled with the
pairwise update of Chan, Golub & LeVeque 1979 ("Updating formulae and a pairwise
algorithm for computing sample variances"), also in float32 on the device:

  n = n_a + n_b,  δ = μ_b − μ_a,  μ = μ_a + δ·n_b/n,  M2 = M2_a + M2_b + δ²·n_a·n_b/n.

Both are stable: no difference of large sums, so a batch's moments carry float32's
rounding ε times a slowly growing factor of its size, and merging K batches adds at
most ~K·ε relative error in the worst case (√K·ε typically). Measured against a
float64 brute force in the tests, the error is a few 1e-7 on the normalised scale
(|Δμ| / σ, |Δσ²| / σ²), as small as that of Flax's own float32 statistics of the
same data as one batch. The accumulation never leaves the device: no host round trip
per batch.

Not the estimate of Ioffe & Szegedy's Algorithm 2 (the average of the mini-batch
means and unbiased variances), which on a fixed data set misses the variance between
batch means.
"""

import dataclasses
import functools
from typing import Any, Callable, Iterable, Mapping

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

COLLECTION = 'batch_stats'


def default_model_inputs(batch) -> tuple:
  """The model's positional inputs: `batch['input']`, or the batch itself if it is an array."""
  return (batch['input'],) if isinstance(batch, Mapping) else (batch,)


def recompute_batch_stats(module: nn.Module, variables: Mapping[str, Any],
                          batches: Callable[[], Iterable], *,
                          model_inputs: Callable[[Any], tuple] = default_model_inputs,
                          method: str | None = None, apply_kwargs: Mapping[str, Any] | None = None,
                          mask_key: str = 'mask', max_passes: int | None = None,
                          max_examples: int | None = None,
                          tolerance: float = 1e-6) -> tuple[dict, dict]:
  """The exact population statistics of every BatchNorm layer of `module` over `batches()`.

  See the module docstring for the definition. Each pass runs
  `module.apply(variables, *model_inputs(batch), method=method, **apply_kwargs)`
  (inference mode: `apply_kwargs` defaults to `{'train': False}`) over a fresh
  `batches()`, records the input of every `nn.BatchNorm.__call__` with
  `nn.intercept_methods` (so any model structure works) and pools its
  per-channel moments; the statistics replace `variables['batch_stats']` for the
  next pass.

  Args:
    module: the Flax module; its BatchNorm layers must normalise by the running
      statistics under `apply_kwargs` and take the batch as their leading axis.
    variables: its variables, with the 'batch_stats' collection the passes start from.
    batches: returns a fresh iterable of batches (a dict of arrays with a leading
      batch axis, or one array) for every pass. A batch smaller than the first is
      padded to the first's size (one compilation); a `batch[mask_key]` of 0
      leaves that example out of the statistics, as for the padded eval batches
      of `data.pipeline.eval_batches`.
    model_inputs: batch → the model's positional inputs; it runs inside `jit`,
      so it may transform the batch on the device (e.g. a task's normalisation).
    method: the module method to apply (None: `__call__`).
    apply_kwargs: keyword arguments of every apply (default `{'train': False}`).
    mask_key: the batch key of the per-example 0/1 mask, if the batch has it.
    max_passes: at most this many passes (default and upper bound: the number of
      BN layers, after which every layer is exact).
    max_examples: use only the first this many (unmasked) examples.
    tolerance: a pass ends the loop when it changes no statistic by more than this,
      measured on the normalised scale: |Δμ| / √(σ² + ε) and |Δσ²| / (σ² + ε).

  Returns:
    (new_batch_stats, info): the new 'batch_stats' collection (same tree as the
    given one; float32) and {'passes', 'changes' (the largest change of each
    pass), 'converged' (the last pass changed nothing, or every layer is exact
    by the pass count), 'examples', 'layers' (the BN layers, by path),
    'unused_layers' (BN statistics no layer read in these applies; kept as they
    were)}.

  Raises:
    ValueError: in one sentence, for a model without batch statistics, no
      examples, a non-positive `max_passes` or `max_examples`, or a BN layer this
      cannot handle (called twice per apply, batch axis not first).
  """
  if COLLECTION not in variables or not jax.tree.leaves(variables[COLLECTION]):
    raise ValueError('The model has no batch statistics to recompute: its variables have no '
                     f'{COLLECTION!r} collection.')
  for name, value in (('max_passes', max_passes), ('max_examples', max_examples)):
    if value is not None and (not isinstance(value, int) or value < 1):
      raise ValueError(f'{name} must be a positive integer or None, got {value!r}.')
  forward = _Forward(module, model_inputs, method,
                     tuple(sorted((apply_kwargs or {'train': False}).items())))
  # {(*layer path, 'mean' | 'var'): array}
  initial = {path: np.asarray(v) for path, v in traverse_util.flatten_dict(variables[COLLECTION]).items()}
  current, changes, layers, epsilons = dict(initial), [], None, None
  while not changes or (changes[-1] > tolerance and len(changes) < max_passes):
    variables_now = {**variables, COLLECTION: traverse_util.unflatten_dict(current)}
    totals, examples = None, 0
    for batch, weights_B in _weighted_batches(batches(), mask_key, max_examples):
      if layers is None:  # traced on the first batch; nothing compiles
        layers, epsilons = _discover(forward, variables_now, batch, weights_B, current)
        max_passes = min(max_passes or len(layers), len(layers))
      if totals is None:
        totals = {path: _Moments.zeros(shape) for path, shape in layers.items()}
      totals = _accumulate(totals, variables_now, batch, weights_B, forward=forward)
      examples += int(np.sum(weights_B > 0))
    if not examples:
      raise ValueError('The batches hold no example (every batch was empty or masked out).')
    updated = dict(current)
    for path, moments in jax.device_get(totals).items():
      updated[path + ('mean',)] = np.asarray(moments.mean, current[path + ('mean',)].dtype)
      updated[path + ('var',)] = np.asarray(moments.m2 / np.maximum(moments.count, 1),
                                            current[path + ('var',)].dtype)
    changes.append(_largest_change(current, updated, epsilons))
    current = updated
  used = {path + (stat,) for path in layers for stat in ('mean', 'var')}
  info = {'passes': len(changes), 'changes': changes,
          'converged': changes[-1] <= tolerance or len(changes) >= len(layers),
          'examples': examples, 'layers': sorted('/'.join(path) for path in layers),
          'unused_layers': sorted({'/'.join(path[:-1]) for path in set(initial) - used})}
  return traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in current.items()}), info


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Moments:
  """Pooled moments per channel: weight count n, mean μ and centred sum of squares M2."""
  count: jax.Array
  mean: jax.Array
  m2: jax.Array

  @classmethod
  def zeros(cls, shape) -> '_Moments':
    return cls(*(jnp.zeros(shape, jnp.float32) for _ in range(3)))

  def merge(self, other: '_Moments') -> '_Moments':
    """Chan, Golub & LeVeque 1979: the moments of the union of both sets."""
    count = self.count + other.count
    fraction = jnp.where(count > 0, other.count / jnp.maximum(count, 1e-30), 0.0)
    delta = other.mean - self.mean
    return _Moments(count, self.mean + delta * fraction,
                    self.m2 + other.m2 + jnp.square(delta) * self.count * fraction)


def _batch_moments(x, weights_B, mask, axis) -> _Moments:
  """The weighted moments of `x` per feature (the `axis` of the BN layer), two-pass in float32."""
  x = x.astype(jnp.float32)
  feature_axes = {a % x.ndim for a in (axis if isinstance(axis, tuple) else (axis,))}
  reduction_axes = tuple(a for a in range(x.ndim) if a not in feature_axes)
  w = jnp.reshape(weights_B, (-1,) + (1,) * (x.ndim - 1))
  if mask is not None:
    w = w * jnp.asarray(mask, jnp.float32)
  w = jnp.broadcast_to(w, x.shape)
  count = jnp.sum(w, reduction_axes)
  mean = jnp.where(count > 0, jnp.sum(w * x, reduction_axes) / jnp.maximum(count, 1e-30), 0.0)
  m2 = jnp.sum(w * jnp.square(x - jnp.expand_dims(mean, reduction_axes)), reduction_axes)
  return _Moments(count, mean, m2)


@dataclasses.dataclass(frozen=True)
class _Forward:
  """One inference apply that returns the moments of every BN layer's input; hashable, so
  `_accumulate` compiles once per model and input function, across passes and calls."""
  module: nn.Module
  model_inputs: Callable
  method: str | None
  apply_kwargs: tuple

  def __call__(self, variables, batch, weights_B) -> tuple[dict, dict]:
    """({layer path (tuple): _Moments of this batch}, {layer path: its ε})."""
    recorded, epsilons = {}, {}

    def record(next_fun, args, kwargs, context):
      if context.method_name != '__call__' or not isinstance(context.module, nn.BatchNorm):
        return next_fun(*args, **kwargs)
      path = context.module.path
      name = '/'.join(path)
      if path in recorded:
        raise ValueError(f'The BatchNorm layer {name!r} is called more than once per apply, so '
                         'its population statistics are not defined.')
      x = args[0] if args else kwargs['x']
      if x.ndim == 0 or x.shape[0] != weights_B.shape[0]:
        raise ValueError(f'The BatchNorm layer {name!r} normalises an input of shape {x.shape} '
                         f'whose first axis is not the batch of {weights_B.shape[0]} examples.')
      recorded[path] = _batch_moments(x, weights_B, kwargs.get('mask'), context.module.axis)
      epsilons[path] = context.module.epsilon
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
      self.module.apply(variables, *self.model_inputs(batch), method=self.method,
                        **dict(self.apply_kwargs))
    return recorded, epsilons


@functools.partial(jax.jit, static_argnames='forward')
def _accumulate(totals: dict, variables, batch, weights_B, *, forward: _Forward) -> dict:
  """`totals` with one batch's moments pooled in, per BN layer."""
  recorded, _ = forward(variables, batch, weights_B)
  return {path: totals[path].merge(moments) for path, moments in recorded.items()}


def _discover(forward: _Forward, variables, batch, weights_B, stats: dict) -> tuple[dict, dict]:
  """({layer path: statistics shape}, {layer path: ε}) of the BN layers an apply calls, checked
  against the flattened 'batch_stats' collection `stats`; traced only."""
  epsilons = {}

  def shapes(variables, batch, weights_B):
    recorded, found = forward(variables, batch, weights_B)
    epsilons.update(found)
    return recorded

  recorded = jax.eval_shape(shapes, variables, batch, weights_B)
  if not recorded:
    raise ValueError('The model calls no BatchNorm layer when applied with these arguments, so '
                     'there are no statistics to recompute.')
  layers = {}
  for path, moments in recorded.items():
    stored = stats.get(path + ('mean',))
    if stored is None or stored.shape != moments.mean.shape:
      raise ValueError(f'The BatchNorm layer {"/".join(path)!r} has no {COLLECTION} of shape '
                       f'{moments.mean.shape} in the variables.')
    layers[path] = moments.mean.shape
  return layers, epsilons


def _weighted_batches(batches: Iterable, mask_key: str, max_examples: int | None):
  """(batch, weights_B) pairs: weights from the mask, capped at `max_examples`, every batch
  padded (weight 0) to the size of the first."""
  size, seen = None, 0
  for batch in batches:
    batch = jax.tree.map(np.asarray, batch)
    count = len(jax.tree.leaves(batch)[0])
    mask = batch.get(mask_key) if isinstance(batch, Mapping) else None
    weights_B = (np.ones(count, np.float32) if mask is None
                 else np.asarray(mask, np.float32).reshape(count))
    if max_examples is not None:
      # Only the first examples up to the cap keep their weight.
      weights_B = np.where(np.cumsum(weights_B > 0) <= max_examples - seen, weights_B, 0)
    size = size or count
    if count > size:
      raise ValueError(f'A batch of {count} examples follows a first batch of {size}; the '
                       'batches may shrink (the last one) but not grow.')
    if count < size:
      batch = jax.tree.map(lambda x: np.concatenate([x, np.repeat(x[:1], size - count, 0)]), batch)
      weights_B = np.concatenate([weights_B, np.zeros(size - count, np.float32)])
    seen += int(np.sum(weights_B > 0))
    yield batch, weights_B
    if max_examples is not None and seen >= max_examples:
      return


def _largest_change(old: dict, new: dict, epsilons: dict) -> float:
  """max over BN layers and channels of |Δμ| / √(σ² + ε) and |Δσ²| / (σ² + ε)."""
  largest = 0.0
  for path, epsilon in epsilons.items():
    mean, var = (new[path + (stat,)].astype(np.float64) for stat in ('mean', 'var'))
    scale = var + epsilon
    mean_change = np.abs(mean - old[path + ('mean',)]) / np.sqrt(scale)
    var_change = np.abs(var - old[path + ('var',)]) / scale
    largest = max(largest, float(np.max(mean_change)), float(np.max(var_change)))
  return largest
