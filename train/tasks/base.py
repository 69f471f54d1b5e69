"""The Task contract: everything that differs between model families.

A run is config → data source → `Task.preprocess` (host) → `Task.transform`
(device, its own random streams) → `Task.loss` (the model on the batch) →
weighted sums → `Task.finalize`. `train/step.py` and `train/loop.py` call only
these methods, so a new family adds a task here (if its objective is new) and
never a branch in the loop.

Metrics are **weighted sums**. `loss` returns `{name: (total, weight)}` where
`total` and `weight` are arrays of the same shape whose leading axis is the
batch axis (e.g. `[B]` for per-example values, `[B, T]` for per-token ones);
the metric's value is Σ total / Σ weight over the whole global batch (and, in
evaluation, over the whole split). The step sums both over the batch, `psum`s
them over devices and divides once, so a token-weighted loss is the exact
global token average in every parallel mode, whatever the padding on each
device. Examples whose eval `mask` is 0 are removed from both sums.
"""

import dataclasses
import math
import numbers
import zlib
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Metrics = dict[str, tuple[jax.Array, jax.Array]]


def mean_over(values: jax.Array, weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """The (total, weight) pair whose ratio is the (weighted) mean of `values`."""
  values = values.astype(jnp.float32)
  if weights is None:
    return values, jnp.ones_like(values)
  weights = weights.astype(jnp.float32)
  return values * weights, weights


def check_input_scale(scale) -> None:
  """One sentence unless `scale` (a task's `input_scale`, the factor its inputs are multiplied
  by on the host) is a finite positive real number; a bool, NaN or 0 would train silently on
  wrong inputs."""
  if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
    raise ValueError(f'task.input_scale must be a finite positive number, got {scale!r}.')


def stream_key(step_key: jax.Array, name: str) -> jax.Array:
  """The key of random stream `name`, independent of every other stream's."""
  return jax.random.fold_in(step_key, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def stream_keys(step_key: jax.Array, task: 'Task', model) -> dict[str, jax.Array]:
  """The keys of a step's random streams: the task's, and those the model declares in an
  `rng_streams` attribute (e.g. Performer attention's random features)."""
  names = dict.fromkeys(task.rng_streams + tuple(getattr(model, 'rng_streams', ())))
  return {name: stream_key(step_key, name) for name in names}


class HookContext(NamedTuple):
  """What an eval hook sees: the module, the evaluated variables, a key and the step."""
  module: Any
  variables: dict
  rng: jax.Array
  step: int


class BoundModel:
  """The model bound to one step's variables, random streams and mode.

  `model(*inputs, method=None, **kwargs)` runs `module.apply`; in training it
  updates the state collections (e.g. batch statistics) as it goes, so a task
  that calls the model twice sees the first call's update.
  """

  def __init__(self, module, params, model_state: dict, rngs: dict, *, train: bool,
               axis_name: str | None):
    self.module, self.params, self.model_state = module, params, dict(model_state)
    self.rngs, self.train, self.axis_name = rngs, train, axis_name

  def __call__(self, *inputs, method=None, **kwargs):
    variables = {'params': self.params, **self.model_state}
    # Every collection is mutable so that per-call ones (a 'cache', sown
    # 'intermediates') can be written; only the state collections are kept.
    out, updates = self.module.apply(variables, *inputs, train=self.train, rngs=self.rngs,
                                     method=method, mutable=True, **kwargs)
    if self.train:
      self.model_state = {name: updates.get(name, value) for name, value in self.model_state.items()}
    return out


@dataclasses.dataclass(frozen=True)
class Task:
  """Base task. A subclass is a frozen dataclass whose fields are its config options.

  Class attributes a subclass may set:
    rng_streams: the named random streams of a step (each `fold_in`-derived
      from the step's key and independent of the others); all are passed to
      the model, and `transform` reads its own from the same dict.
    state_collections: the model's non-parameter collections kept in the train
      state and checkpoints (e.g. 'batch_stats'); every other collection a
      model creates (a decoding 'cache', 'intermediates') is per call.
    method: the module method `loss` calls by default (None: `__call__`).
  """
  rng_streams: ClassVar[tuple[str, ...]] = ('dropout',)
  state_collections: ClassVar[tuple[str, ...]] = ('batch_stats',)
  method: ClassVar[str | None] = None

  # What the data source reports (vocabulary, classes, ...), set by `tasks.build`.
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

  def __post_init__(self):
    self.validate()

  def validate(self) -> None:
    """Raises ValueError, in one sentence, for options that cannot work."""

  # Host side ------------------------------------------------------------------

  def preprocess(self, records: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch of records (dict of stacked arrays) → the batch the step takes."""
    return records

  # Device side ----------------------------------------------------------------

  def model_inputs(self, batch: dict) -> tuple:
    """The positional inputs of the model for `batch` (used by `init` and `loss`)."""
    raise NotImplementedError

  def transform(self, rngs: dict[str, jax.Array], batch: dict, train: bool) -> dict:
    """On-device batch transform (augmentation, masking, noising); identity by default."""
    del rngs, train
    return batch

  def loss(self, model: BoundModel, batch: dict) -> Metrics:
    """Training metrics as weighted sums; must contain 'loss', the minimised quantity."""
    raise NotImplementedError

  def eval_metrics(self, model: BoundModel, batch: dict) -> Metrics:
    """Evaluation metrics as weighted sums; the training ones by default."""
    return self.loss(model, batch)

  # Host side, after aggregation -------------------------------------------------

  def finalize(self, totals: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Aggregated (total, weight) pairs → reported values; Σ total / Σ weight by default."""
    return {name: ratio(total, weight) for name, (total, weight) in totals.items()}

  def eval_hooks(self) -> list[Callable[[HookContext], dict]]:
    """Callables run after each evaluation; each returns {name: scalar | text | image}."""
    return []


def ratio(total: float, weight: float) -> float:
  """Σ total / Σ weight, NaN when nothing was weighted (e.g. an empty split)."""
  return float(total) / float(weight) if weight else float('nan')
