"""Autoregressive generation shared by every causal model: logit filters, one sampled token, a loop.

A model follows the protocol of flax/examples/lm1b: `model.apply(variables, tokens_BxT,
train=False)` returns logits_BxTxV where position t predicts token t+1; a model with a
cache also takes `decode=True`, sizes its 'cache' collection at `init` from the input
length, and then consumes one token per `apply(..., mutable=['cache'])`.

Sampling arguments are Python numbers, checked when traced and static under `jit`.
"""

import functools
import inspect
import numbers

import jax
import jax.numpy as jnp
import numpy as np


def check_options(temperature, top_k, top_p):
  if (not isinstance(temperature, numbers.Real) or isinstance(temperature, bool)
      or not 0 <= temperature < float('inf')):
    raise ValueError(f'temperature must be a finite Python number >= 0 (0 is greedy), got '
                     f'{temperature!r}.')
  if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool)
                            or top_k < 0):
    raise ValueError(f'top_k must be None or an integer >= 0 (0 keeps every token), got {top_k!r}.')
  if top_p is not None and (not isinstance(top_p, numbers.Real) or isinstance(top_p, bool)
                            or not 0 < top_p <= 1):
    raise ValueError(f'top_p must be None or a number in (0, 1] (1 keeps every token), got {top_p!r}.')


def filter_logits(logits_BxV, *, temperature=1.0, top_k=None, top_p=None):
  """Tempered logits with the tokens outside the top-k and the nucleus set to -inf.

  Temperature: (z − max z) / T, so softmax(z / T) sharpens as T → 0; T = 0 (or below
  float32's smallest normal number) keeps the argmax only. Shifted by each row's largest logit first, a tiny T cannot overflow z / T to +inf
  (which would tie every large logit at +inf and lose the argmax).
  Top-k: the k largest logits. Nucleus (Holtzman et al. 2020, "The Curious Case of
  Neural Text Degeneration"): with the survivors sorted so that p_(1) ≥ p_(2) ≥ …
  (renormalised over the top-k), keep the smallest prefix whose mass Σ_{j≤i} p_(j) ≥ p,
  i.e. token i is kept iff Σ_{j<i} p_(j) < p; the most probable token is always kept.

  Both sets hold exactly k and exactly that prefix: among equal logits the lower
  vocabulary index ranks first (the order of `jax.lax.top_k`, which also ranks 0.0
  above -0.0). top_k None or 0 and top_p None or 1 disable the filter; top_k ≥ V
  keeps every token.
  """
  check_options(temperature, top_k, top_p)
  logits_BxV = jnp.asarray(logits_BxV, jnp.float32)
  vocab_size = logits_BxV.shape[-1]
  if temperature < np.finfo(np.float32).tiny:
    # The T → 0 limit of softmax(z / T) is a point mass on the argmax; dividing by 0 (or by a
    # T that float32 flushes to 0) would give nan.
    top_k, top_p = 1, None
  else:
    row_max_Bx1 = jnp.max(logits_BxV, axis=-1, keepdims=True)
    row_max_Bx1 = jnp.where(jnp.isfinite(row_max_Bx1), row_max_Bx1, 0)  # a row of only -inf
    logits_BxV = (logits_BxV - row_max_Bx1) / temperature
  k = min(top_k or vocab_size, vocab_size)
  p = 1.0 if top_p is None else float(top_p)
  if k == vocab_size and p == 1.0:
    return logits_BxV
  # The nucleus is a prefix of the top-k in sorted order, so one top_k serves both filters.
  sorted_BxK, order_BxK = jax.lax.top_k(logits_BxV, k)
  keep_BxK = jnp.ones(sorted_BxK.shape, bool)
  if p < 1.0:
    probs_BxK = jax.nn.softmax(sorted_BxK, axis=-1)
    cumulative_BxK = jnp.cumsum(probs_BxK, axis=-1)
    # Mass strictly before each token, by shifting: cumsum - probs would round, and a
    # p equal to a cumulative sum must stop exactly at that token.
    mass_before_BxK = jnp.concatenate(
        [jnp.zeros_like(cumulative_BxK[..., :1]), cumulative_BxK[..., :-1]], axis=-1)
    keep_BxK = mass_before_BxK < p
  keep_BxV = jnp.put_along_axis(jnp.zeros(logits_BxV.shape, bool), order_BxK, keep_BxK,
                                axis=-1, inplace=False)
  return jnp.where(keep_BxV, logits_BxV, -jnp.inf)


def sample_token(key, logits_BxV, *, temperature=1.0, top_k=None, top_p=None):
  """Draws x ~ softmax(filter_logits(z)) per row; temperature 0 is argmax z (key unused)."""
  check_options(temperature, top_k, top_p)
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = filter_logits(logits_BxV, temperature=temperature, top_k=top_k, top_p=top_p)
  return jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)


def generate(model, variables, prompt_BxP, key, *, num_new_tokens, temperature=1.0, top_k=None,
             top_p=None, use_cache=False, return_logits=False, inputs=()):
  """Extends each prompt by `num_new_tokens` sampled tokens: x_t ~ p(x_t | x_<t), t = P … P+N−1.

  Returns tokens_Bx(P+N) int32 (the prompt unchanged in front) and, with
  `return_logits`, also logits_BxNxV, the unfiltered float32 logits that drew each new
  token. Token t is drawn with key `fold_in(key, t)`, so the same logits give the same
  tokens with and without the cache.

  Without the cache every step reruns the model on a fixed [B, P+N] buffer (causality
  makes the unwritten tail irrelevant): O(N (P+N)) token evaluations, any causal model.
  With the cache the model reads one token per step, the prompt included.

  A model with a fixed context (a `max_context` attribute W, e.g. a Transformer's
  learned position table) sees at most the last W tokens: when P + N > W, each
  step reruns it on the window of W tokens ending at the newest one, as the
  GPT papers' samplers do, and the cache is not used (it cannot hold more than
  W positions).

  Compiled once per (model, shapes, num_new_tokens, sampling args, use_cache); the model
  is a static argument and must be hashable (Flax modules with tuple attributes are).
  Collections other than 'cache' in `variables` (e.g. 'batch_stats') are read, not updated.

  `inputs` are further arrays every model call receives after the tokens, e.g. the
  source sentence and its lengths of an encoder–decoder (`model.apply(variables,
  tokens, *inputs, ...)`); their leading axis is the batch.
  """
  check_options(temperature, top_k, top_p)
  if not isinstance(num_new_tokens, numbers.Integral) or num_new_tokens < 1:
    raise ValueError(f'num_new_tokens must be an integer >= 1, got {num_new_tokens!r}.')
  try:
    hash(model)
  except TypeError:
    raise ValueError(f'model must be hashable to be a static jit argument (give its attributes as '
                     f'tuples, not lists), got {type(model).__name__}.') from None
  prompt_BxP = jnp.asarray(prompt_BxP)
  if prompt_BxP.ndim != 2 or prompt_BxP.shape[1] < 1:
    raise ValueError(f'prompt must have shape [batch, length >= 1], got {prompt_BxP.shape}.')
  if prompt_BxP.shape[1] + num_new_tokens > 2**31:
    # Positions are int32: a longer sequence was an OverflowError traceback inside jit.
    raise ValueError(f'A prompt of length {prompt_BxP.shape[1]} and num_new_tokens='
                     f'{num_new_tokens} exceed the 2**31 positions int32 numbers.')
  if not jnp.issubdtype(prompt_BxP.dtype, jnp.integer):
    raise ValueError(f'prompt must hold integer token ids, got {prompt_BxP.dtype}.')
  check_prompt_ids(model, prompt_BxP)
  tokens_BxL, logits_BxNxV = _generate(
      model, variables, prompt_BxP.astype(jnp.int32), key, num_new_tokens=int(num_new_tokens),
      sampling=(temperature, top_k, top_p), use_cache=use_cache, return_logits=return_logits,
      inputs=tuple(jnp.asarray(x) for x in inputs))
  return (tokens_BxL, logits_BxNxV) if return_logits else tokens_BxL


@functools.partial(jax.jit, static_argnames=('model', 'num_new_tokens', 'sampling', 'use_cache',
                                             'return_logits'))
def _generate(model, variables, prompt_BxP, key, *, num_new_tokens, sampling, use_cache,
              return_logits, inputs):
  temperature, top_k, top_p = sampling
  batch_size, prompt_length = prompt_BxP.shape
  total_length = prompt_length + num_new_tokens
  tokens_BxL = jnp.zeros((batch_size, total_length), jnp.int32).at[:, :prompt_length].set(prompt_BxP)
  variables = {name: tree for name, tree in variables.items() if name != 'cache'}

  def draw(t, logits_BxV):
    return sample_token(jax.random.fold_in(key, t), logits_BxV, temperature=temperature,
                        top_k=top_k, top_p=top_p)

  # Positions 0 … L − 2 are read (each predicts the next); the last is only written.
  read_length = total_length - 1
  window = min(model_context(model) or read_length, read_length)
  if not use_cache or window < read_length:
    def step(tokens_BxL, t):  # t: position written at this step
      # The W tokens up to t − 1 (all of them while t ≤ W; causality makes the rest irrelevant).
      start = jnp.maximum(t - window, 0)
      window_BxW = jax.lax.dynamic_slice_in_dim(tokens_BxL, start, window, axis=1)
      logits_BxWxV = model.apply(variables, window_BxW, *inputs, train=False)
      logits_BxV = jax.lax.dynamic_index_in_dim(logits_BxWxV, t - 1 - start, axis=1,
                                                keepdims=False).astype(jnp.float32)
      tokens_BxL = tokens_BxL.at[:, t].set(draw(t, logits_BxV))
      return tokens_BxL, logits_BxV if return_logits else None

    tokens_BxL, logits_NxBxV = jax.lax.scan(step, tokens_BxL,
                                            jnp.arange(prompt_length, total_length))
  else:
    # Only the cache's initial values are used; XLA drops the parameter initialisation.
    cache = model.init(jax.random.PRNGKey(0), tokens_BxL[:, :read_length], *inputs, train=False,
                       decode=True)['cache']

    def step(carry, t):  # t: position read at this step; it predicts t + 1
      cache, token_B = carry
      logits_Bx1xV, mutated = model.apply({**variables, 'cache': cache}, token_B[:, None], *inputs,
                                          train=False, decode=True, mutable=['cache'])
      logits_BxV = logits_Bx1xV[:, 0].astype(jnp.float32)
      # Inside the prompt the next token is forced; the draw is discarded.
      next_B = jnp.where(t + 1 < prompt_length, tokens_BxL[:, t + 1], draw(t + 1, logits_BxV))
      return (mutated['cache'], next_B), (next_B, logits_BxV if return_logits else None)

    # S = L - 1 steps: every position but the last is read once.
    _, (next_SxB, logits_SxBxV) = jax.lax.scan(step, (cache, tokens_BxL[:, 0]),
                                               jnp.arange(total_length - 1))
    tokens_BxL = jnp.concatenate([tokens_BxL[:, :1], next_SxB.T], axis=1)
    logits_NxBxV = None if logits_SxBxV is None else logits_SxBxV[prompt_length - 1:]
  logits_BxNxV = None if logits_NxBxV is None else logits_NxBxV.transpose(1, 0, 2)
  return tokens_BxL, logits_BxNxV


def check_prompt_ids(model, prompt_BxP) -> None:
  """One sentence for a prompt id outside [0, V) of a model with a `vocab_size` V: the
  embedding lookup would give NaN logits (an id ≥ V) or another token's row (a negative id)
  instead of failing. A traced prompt (generate called inside jit) cannot be read here."""
  vocab_size = getattr(model, 'vocab_size', None)
  if (not isinstance(vocab_size, numbers.Integral) or isinstance(prompt_BxP, jax.core.Tracer)
      or prompt_BxP.size == 0):
    return
  ids = np.asarray(prompt_BxP)
  outside = (ids < 0) | (ids >= vocab_size)
  if outside.any():
    row, column = np.argwhere(outside)[0]
    raise ValueError(f'Prompt token {int(ids[row, column])} (row {row}, position {column}) is '
                     f'not an id in [0, {vocab_size}) of the model\'s vocabulary.')


def model_context(model) -> int | None:
  """The most tokens `model` can read at once (its `max_context` attribute), None if unbounded."""
  return getattr(model, 'max_context', None)


def supports_cache(model) -> bool:
  """Whether `model` takes `decode=True`, the cache protocol `generate` uses (and does not
  say otherwise in a `has_cache` attribute, as a GPT with linear attention does)."""
  return ('decode' in inspect.signature(type(model).__call__).parameters
          and getattr(model, 'has_cache', True))


def generate_text(model, variables, tokenizer, prompt: str, key, *, num_samples: int,
                  num_new_tokens: int, temperature=1.0, top_k=None, top_p=None) -> list[str]:
  """`num_samples` continuations of `prompt`, encoded and decoded with `tokenizer`
  (anything with `encode(str) -> ids` and `decode(ids) -> str`), each `num_new_tokens`
  tokens long; the model's cache is used when it has one."""
  prompt_BxP = np.tile(np.asarray(tokenizer.encode(prompt), np.int32), (num_samples, 1))
  tokens = generate(model, variables, prompt_BxP, key, num_new_tokens=num_new_tokens,
                    temperature=temperature, top_k=top_k, top_p=top_p,
                    use_cache=supports_cache(model))
  return [tokenizer.decode([int(t) for t in row]) for row in jax.device_get(tokens)]
