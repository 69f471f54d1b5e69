"""Tasks by name: what each model family's training and evaluation compute.

See `train/tasks/base.py` for the contract every task follows.
"""

import dataclasses
from typing import Any, Mapping

from train.tasks.autoencoder import Autoencoding, VariationalAutoencoding
from train.tasks.base import BoundModel, HookContext, Metrics, Task, mean_over, ratio, stream_key
from train.tasks.classification import Classification
from train.tasks.diffusion import Diffusion
from train.tasks.forecasting import Forecasting
from train.tasks.lm import LanguageModel
from train.tasks.mlm import MaskedLanguageModel
from train.tasks.seq2seq import Seq2Seq
from train.tasks.tagging import Tagging

TASKS: dict[str, type[Task]] = {
    'classification': Classification,
    'language_model': LanguageModel,
    'masked_language_model': MaskedLanguageModel,
    'seq2seq': Seq2Seq,
    'tagging': Tagging,
    'forecasting': Forecasting,
    'diffusion': Diffusion,
    'autoencoder': Autoencoding,
    'vae': VariationalAutoencoding,
}


def build(name: str, meta: Mapping[str, Any] | None = None, **options) -> Task:
  """Task `name` with `options`, checked by name and value, for data described by `meta`."""
  if name not in TASKS:
    raise ValueError(f'Unknown task {name!r}; allowed: {", ".join(sorted(TASKS))}.')
  cls = TASKS[name]
  allowed = sorted(f.name for f in dataclasses.fields(cls) if f.name != 'meta')
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise ValueError(f'Task {name!r} has no option {unknown[0]!r}; allowed: '
                     f'{", ".join(allowed) or "none"}.')
  return cls(meta=dict(meta or {}), **options)


__all__ = ['BoundModel', 'HookContext', 'Metrics', 'Task', 'TASKS', 'build', 'mean_over', 'ratio',
           'stream_key']
