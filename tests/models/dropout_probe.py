"""What the first block of a Transformer stack reads and sums, and the inverted-dropout check on
it."""

import flax.linen as nn
import numpy as np


def first_block_inputs(apply_fn) -> dict:
  """Calls `apply_fn()` and returns what each stack's first block (`block0`) reads, keyed by the
  name of the module holding it: one entry for GPT, BERT or ViT (the model, whose name is
  None), two for an encoder–decoder ('encoder' and 'decoder')."""
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    if context.module.name == 'block0' and context.method_name == '__call__':
      seen[context.module.parent.name] = args[0]
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    apply_fn()
  return seen


def first_residual_sums(apply_fn, pre_norm: bool) -> dict:
  """Calls `apply_fn()` and returns, for each stack's first block (`block0`, keyed by the name of
  the module holding it: None for GPT and BERT, 'encoder' and 'decoder' for an encoder–decoder),
  (x, a, s): the block's input x, its self-attention's output a and the residual sum
  s = x + drop(a), which the next LayerNorm reads (post-LN: the self-attention's own norm;
  pre-LN: the next sub-layer's norm). A model whose blocks drop nothing has s − x = a."""
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    module, out = context.module, next_fun(*args, **kwargs)
    if context.method_name == '__call__' and module.name == 'block0':
      seen.setdefault(module.parent.name, {})['x'] = args[0]
    elif (context.method_name == '__call__' and module.parent is not None
          and module.parent.name == 'block0'):
      stack = seen.setdefault(module.parent.parent.name, {})
      if module.name == 'self_attention':
        stack['a'] = out
      elif module.name.endswith('_norm'):
        stack.setdefault('norm_inputs', []).append(args[0])
    return out

  with nn.intercept_methods(interceptor):
    apply_fn()
  return {name: (stack['x'], stack['a'], stack['norm_inputs'][1 if pre_norm else 0])
          for name, stack in seen.items()}


def assert_inverted_dropout(dropped, expected, rate: float, **tolerance) -> None:
  """Each entry of `dropped` is 0 or the entry of `expected` scaled by 1/(1 − rate), and the
  share of entries kept is within 0.2 of 1 − rate."""
  dropped, expected = np.asarray(dropped, np.float64), np.asarray(expected, np.float64)
  kept = dropped != 0
  assert abs(kept.mean() - (1 - rate)) < 0.2, kept.mean()
  np.testing.assert_allclose(dropped[kept], expected[kept] / (1 - rate), **tolerance)


def first_mlp_hidden_units(apply_fn) -> tuple:
  """Calls `apply_fn()` and returns, for the MLP of the first block (`block0`), GELU of its
  hidden layer's output and what its output layer reads: equal unless the hidden units are
  dropped."""
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    in_first_mlp = (module.parent is not None and module.parent.name == 'mlp'
                    and module.parent.parent is not None and module.parent.parent.name == 'block0')
    out = next_fun(*args, **kwargs)
    if in_first_mlp and context.method_name == '__call__' and module.name in ('hidden', 'output'):
      seen[module.name] = nn.gelu(out) if module.name == 'hidden' else args[0]
    return out

  with nn.intercept_methods(interceptor):
    apply_fn()
  return seen['hidden'], seen['output']
