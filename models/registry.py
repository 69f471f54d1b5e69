"""Models by name, so configs (not code edits) select the architecture."""

import dataclasses

import flax.linen as nn

from models.mlp import MLP

MODELS: dict[str, type[nn.Module]] = {'mlp': MLP}


def build(name: str, batch_norm_axis_name: str | None = None, **options) -> nn.Module:
  """Builds model `name` with `options`; the train library passes the BN axis name."""
  if name not in MODELS:
    raise ValueError(f'Unknown model {name!r}; allowed: {", ".join(sorted(MODELS))}.')
  cls = MODELS[name]
  fields = {f.name for f in dataclasses.fields(cls)} - {'parent', 'name'}
  unknown = sorted(set(options) - fields)
  if unknown:
    raise ValueError(f'Model {name!r} has no option {unknown[0]!r}; allowed: {", ".join(sorted(fields))}.')
  if 'batch_norm_axis_name' in fields:
    options['batch_norm_axis_name'] = batch_norm_axis_name
  return cls(**options)
