"""Tasks: how a model's outputs on a batch become per-example losses and metrics.

A task is `task(model, variables, batch, rng, train) -> (per_example, model_state)`
where `per_example` maps metric names to arrays of shape [B] and must contain
'loss', the quantity the optimiser minimises (its mean over the batch).
`model_state` is the updated mutable collections (unchanged when not training).
"""

from typing import Callable

import jax.numpy as jnp

from models import losses


def _apply(model, variables, inputs, rng, train):
  """Runs the model; in training, returns the updated mutable collections too."""
  collections = [name for name in variables if name != 'params']
  if train and collections:
    return model.apply(variables, inputs, train=True, rngs={'dropout': rng}, mutable=collections)
  out = model.apply(variables, inputs, train=train, rngs={'dropout': rng})
  return out, {name: variables[name] for name in collections}


def classification(model, variables, batch, rng, train, label_smoothing: float = 0.0):
  """Softmax cross-entropy; also reports accuracy.

  Labels are integers [B], or distributions [B, C] (e.g. after mixup or cutmix,
  where accuracy counts the most-weighted class).
  """
  logits_BxC, model_state = _apply(model, variables, batch['input'], rng, train)
  labels = batch['label']
  if labels.ndim == logits_BxC.ndim:
    loss_B = losses.softmax_cross_entropy(logits_BxC, labels, label_smoothing=label_smoothing)
    labels = jnp.argmax(labels, -1)
  else:
    loss_B = losses.cross_entropy(logits_BxC, labels, label_smoothing=label_smoothing)
  per_example = {'loss': loss_B,
                 'accuracy': (jnp.argmax(logits_BxC, -1) == labels).astype(jnp.float32)}
  return per_example, model_state


TASKS: dict[str, Callable] = {'classification': classification}


def get(name: str) -> Callable:
  if name not in TASKS:
    raise ValueError(f'Unknown task {name!r}; allowed: {", ".join(sorted(TASKS))}.')
  return TASKS[name]
