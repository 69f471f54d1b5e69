"""Language modelling: next-token cross-entropy, weighted per token.

Batches are windows of `T + 1` tokens with a weight per target (`data.text`):
the model reads `tokens[:, :-1]` and predicts `tokens[:, 1:]`. Reports the
mean NLL per token (`loss`), `perplexity` = exp(loss), next-token `accuracy`,
and bits per character or per byte (the tokenizer's unit) = total nats /
total units / ln 2, which compares tokenizers on the same text.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from models import losses
from train import sampling
from train.tasks import base


@dataclasses.dataclass(frozen=True)
class LanguageModel(base.Task):
  """`model(tokens [B, T]) → logits [B, T, V]`, causal: position t predicts token t + 1.

  Options (the eval hook samples `num_samples` continuations of `prompt` after
  every evaluation; `sample_length` 0 turns it off):
    prompt, sample_length, temperature, top_k (0: off), top_p (1: off), num_samples.
  """
  prompt: str = '\n'
  sample_length: int = 200
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  num_samples: int = 1

  def validate(self):
    if 'tokenizer' not in self.meta:
      raise ValueError('The language_model task needs token windows: set config.data.tokenizer '
                       "('char' or 'byte_bpe') and config.data.window, or 'dataset' for a data "
                       'set of token records.')
    if not isinstance(self.sample_length, int) or self.sample_length < 0:
      raise ValueError(f'task.sample_length must be an integer >= 0, got {self.sample_length!r}.')
    if not isinstance(self.num_samples, int) or self.num_samples < 1:
      raise ValueError(f'task.num_samples must be a positive integer, got {self.num_samples!r}.')
    sampling.check_options(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
    if self.sample_length:
      if not self.prompt:
        raise ValueError('task.prompt must hold at least one character.')
      try:
        self.meta['tokenizer'].encode(self.prompt)
      except ValueError as e:
        raise ValueError(f'task.prompt={self.prompt!r} cannot be encoded: {e}') from None

  def preprocess(self, records):
    return {'tokens': np.asarray(records['tokens'], np.int32),
            'weights': np.asarray(records['weights'], np.float32)}

  def model_inputs(self, batch):
    return (batch['tokens'][:, :-1],)

  def loss(self, model, batch):
    logits_BxTxV = model(*self.model_inputs(batch)).astype(jnp.float32)
    targets_BxT, weights_BxT = batch['tokens'][:, 1:], batch['weights']
    nll_BxT = losses.cross_entropy(logits_BxTxV, targets_BxT)
    correct_BxT = jnp.argmax(logits_BxTxV, -1) == targets_BxT
    units_BxT = jnp.asarray(self.meta['token_units'], jnp.float32)[targets_BxT]
    return {'loss': base.mean_over(nll_BxT, weights_BxT),
            'accuracy': base.mean_over(correct_BxT, weights_BxT),
            # Σ nats / Σ characters (or bytes): bits per unit once divided by ln 2.
            'nats_per_unit': (nll_BxT * weights_BxT, units_BxT * weights_BxT)}

  def finalize(self, totals):
    nats, tokens = totals['loss']
    out = losses.language_model_summary(nats, tokens, totals['nats_per_unit'][1],
                                        self.meta['unit'])
    out['accuracy'] = base.ratio(*totals['accuracy'])
    return out

  def eval_hooks(self):
    return [self._sample] if self.sample_length else []

  def _sample(self, context: base.HookContext) -> dict:
    """Continuations of the prompt, decoded to text."""
    texts = sampling.generate_text(
        context.module, context.variables, self.meta['tokenizer'], self.prompt, context.rng,
        num_samples=self.num_samples, num_new_tokens=self.sample_length,
        temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
    return {'sample': '\n----\n'.join(texts)}
