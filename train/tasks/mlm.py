"""Masked language modelling (Devlin et al. 2019, "BERT", §3.1 "Task #1: Masked LM").

Each text window (`data.text`) becomes one BERT input on the host,

  [CLS] x_1 … x_n [SEP] [PAD] …        (`use_cls_sep`; else x_1 … x_n [PAD] …)

with the special ids after the tokenizer's V ids: [PAD] = V, [CLS] = V + 1,
[SEP] = V + 2, [MASK] = V + 3 (`models/transformer/bert.py`, whose
`num_special_tokens` must be 4). On the device, with the task's own 'masking'
stream, every non-special position is chosen independently with probability
`mask_rate` (15%); a chosen position's input becomes

  [MASK]             with probability p_mask   (80%)
  a random token     with probability p_random (10%; uniform over the V tokenizer ids)
  itself, unchanged  with probability p_keep   (10%)

and the model predicts the original token there. The loss is the
cross-entropy −log p(x_t | masked input) averaged over every chosen position
of the global batch (unchanged ones included), whatever their number per
window. Training draws fresh masks every step; evaluation draws them from the
eval stream of the batch's index, so every evaluation masks the same positions.

Metrics, all over the chosen positions: `loss`, `perplexity` = exp(loss),
`accuracy` (argmax = original token), and two unigram baselines from the
train split's token counts c_v (meta 'token_counts', counted on the host by
`data.text`): `unigram_accuracy`, the accuracy of always predicting the most
frequent training token argmax_v c_v, and `unigram_loss`, the cross-entropy
of the add-one-smoothed unigram p(v) = (c_v + 1) / (Σ c + V), which a model
must beat to use the context at all. `masked_fraction` is chosen / candidate
positions (≈ mask_rate).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from models import losses
from models.transformer.bert import SPECIAL_TOKENS, special_token_id
from train.tasks import base


@dataclasses.dataclass(frozen=True)
class MaskedLanguageModel(base.Task):
  """`model(tokens [B, S]) → logits [B, S, V + 4]`; cross-entropy at the masked positions.

  Options:
    mask_rate: the probability that a non-special position is chosen for prediction.
    replace_probabilities: (p_mask, p_random, p_keep), what a chosen input becomes.
    use_cls_sep: frame each window as [CLS] … [SEP] (S = T + 2); else S = T.
  """
  rng_streams = ('dropout', 'masking')

  mask_rate: float = 0.15
  replace_probabilities: tuple = (0.8, 0.1, 0.1)
  use_cls_sep: bool = True

  def validate(self):
    if 'tokenizer' not in self.meta:
      raise ValueError('The masked_language_model task needs text data: set '
                       "config.data.tokenizer ('char' or 'byte_bpe') and config.data.window.")
    if self.meta.get('unit') == 'token':
      # Such records weight only the positions they score (e.g. associative_recall's answers),
      # so their text is not a prefix of each window, which `preprocess` needs.
      raise ValueError("The masked_language_model task needs windows of text (config.data."
                       "tokenizer 'char' or 'byte_bpe'), not a data set's token records "
                       "(tokenizer='dataset').")
    vocab_size = self.vocab_size
    counts = np.asarray(self.meta.get('token_counts', ()))
    if counts.shape != (vocab_size,):
      raise ValueError(f'The masked_language_model task needs the train split\'s count of each of '
                       f'the {vocab_size} token ids (meta "token_counts"), got shape {counts.shape}.')
    if not (isinstance(self.mask_rate, (int, float)) and 0 < self.mask_rate <= 1):
      raise ValueError(f'task.mask_rate must lie in (0, 1], got {self.mask_rate!r}.')
    try:
      probabilities = tuple(self.replace_probabilities)
    except TypeError:
      probabilities = ()
    if (len(probabilities) != 3 or not all(isinstance(p, (int, float)) and p >= 0
                                           for p in probabilities)
        or not math.isclose(sum(probabilities), 1.0, abs_tol=1e-6)):
      raise ValueError(f'task.replace_probabilities must be three probabilities (mask, random, '
                       f'keep) summing to 1, got {self.replace_probabilities!r}.')
    if not isinstance(self.use_cls_sep, bool):
      raise ValueError(f'task.use_cls_sep must be True or False, got {self.use_cls_sep!r}.')
    object.__setattr__(self, 'replace_probabilities', tuple(float(p) for p in probabilities))
    # Host-side constants of the unigram baselines.
    object.__setattr__(self, '_most_frequent', int(np.argmax(counts)))
    object.__setattr__(self, '_unigram_log_probs', np.log(
        (counts + 1.0) / (counts.sum() + vocab_size)).astype(np.float32))

  @property
  def vocab_size(self) -> int:
    """V, the tokenizer's ids; the special tokens follow them."""
    return self.meta['tokenizer'].vocab_size

  def special_id(self, token: str) -> int:
    """The id of '[PAD]', '[CLS]', '[SEP]' or '[MASK]'."""
    return special_token_id(self.vocab_size, token)

  # Host side ------------------------------------------------------------------

  def preprocess(self, records):
    """Windows {'tokens' [B, T + 1], 'weights' [B, T]} → {'tokens' [B, S]} BERT inputs.

    The first T tokens of each window are its text; token j ≥ 1 is real where
    weight j − 1 is (weight j − 1 scores token j for a language model), token 0
    always, so an evaluation split's text is covered once. The rest is [PAD].
    """
    tokens_BxT = np.asarray(records['tokens'], np.int32)[:, :-1]
    weights_BxT = np.asarray(records['weights'], np.float32)
    valid_BxT = np.concatenate([np.ones_like(weights_BxT[:, :1]), weights_BxT[:, :-1]], 1) > 0
    # The real tokens are a prefix of each window (only the split's end is padded).
    if np.any(valid_BxT != (np.arange(valid_BxT.shape[1]) < valid_BxT.sum(1, keepdims=True))):
      raise ValueError('The masked_language_model task needs windows whose weighted positions '
                       'are a prefix of the window, as text windows are; these records weight '
                       'others.')
    text_BxT = np.where(valid_BxT, tokens_BxT, self.special_id('[PAD]')).astype(np.int32)
    if not self.use_cls_sep:
      return {'tokens': text_BxT}
    batch, steps = text_BxT.shape
    out_BxS = np.full((batch, steps + 2), self.special_id('[PAD]'), np.int32)
    out_BxS[:, 0] = self.special_id('[CLS]')
    out_BxS[:, 1:-1] = text_BxT
    out_BxS[np.arange(batch), 1 + valid_BxT.sum(1)] = self.special_id('[SEP]')
    return {'tokens': out_BxS}

  # Device side ----------------------------------------------------------------

  def model_inputs(self, batch):
    return (batch['tokens'],)

  def transform(self, rngs, batch, train):
    """Chooses and corrupts the positions to predict (the 15% / 80-10-10 rule).

    Returns the batch with 'tokens' the corrupted input, 'targets' the original
    tokens, 'weights' 1 at the chosen positions and 'candidates' 1 at every
    position that could be chosen (not a special token).
    """
    del train  # evaluation masks as well, from the eval stream
    tokens_BxS = batch['tokens']
    shape, vocab_size = tokens_BxS.shape, self.vocab_size
    choose_key, kind_key, random_key = jax.random.split(rngs['masking'], 3)
    candidates_BxS = tokens_BxS < vocab_size
    chosen_BxS = candidates_BxS & (jax.random.uniform(choose_key, shape) < self.mask_rate)
    p_mask, p_random, _ = self.replace_probabilities
    u_BxS = jax.random.uniform(kind_key, shape)
    to_mask_BxS = chosen_BxS & (u_BxS < p_mask)
    to_random_BxS = chosen_BxS & (u_BxS >= p_mask) & (u_BxS < p_mask + p_random)
    random_BxS = jax.random.randint(random_key, shape, 0, vocab_size, tokens_BxS.dtype)
    inputs_BxS = jnp.where(to_mask_BxS, self.special_id('[MASK]'),
                           jnp.where(to_random_BxS, random_BxS, tokens_BxS))
    return {**batch, 'tokens': inputs_BxS, 'targets': tokens_BxS,
            'weights': chosen_BxS.astype(jnp.float32),
            'candidates': candidates_BxS.astype(jnp.float32)}

  def loss(self, model, batch):
    logits_BxSxV = model(*self.model_inputs(batch)).astype(jnp.float32)
    expected = self.vocab_size + len(SPECIAL_TOKENS)
    if logits_BxSxV.shape[-1] != expected:
      raise ValueError(f'The masked_language_model task needs logits over the {self.vocab_size} '
                       f'token ids and {len(SPECIAL_TOKENS)} special tokens ({expected}), but the '
                       f'model gives {logits_BxSxV.shape[-1]}; set model.num_special_tokens='
                       f'{len(SPECIAL_TOKENS)}.')
    targets_BxS, weights_BxS = batch['targets'], batch['weights']
    nll_BxS = losses.cross_entropy(logits_BxSxV, targets_BxS)
    correct_BxS = jnp.argmax(logits_BxSxV, -1) == targets_BxS
    # Targets at unchosen positions may be special ids (weight 0): clip to stay in the table.
    unigram_nll_BxS = -jnp.take(jnp.asarray(self._unigram_log_probs), targets_BxS, mode='clip')
    return {'loss': base.mean_over(nll_BxS, weights_BxS),
            'accuracy': base.mean_over(correct_BxS, weights_BxS),
            'unigram_accuracy': base.mean_over(targets_BxS == self._most_frequent, weights_BxS),
            'unigram_loss': base.mean_over(unigram_nll_BxS, weights_BxS),
            'masked_fraction': (weights_BxS, batch['candidates'])}

  # Host side, after aggregation -------------------------------------------------

  def finalize(self, totals):
    out = super().finalize(totals)
    out['perplexity'] = float(np.exp(out['loss']))
    return out
