"""BERT: a bidirectional Transformer encoder with a masked-language-model head
(Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", §3 and Fig. 2).

  h⁰ = LayerNorm(E[x_t] + P[t] + S[s_t])      (token, position and segment embeddings)
  hˡ = Block_l(hˡ⁻¹),  l = 1 … L               (self-attention over every non-[PAD]
                                               position, both directions, and MLP)
  z_t = LayerNorm(GELU(W hᴸ_t + b))            (the MLM head's transform)
  logits_t = z_t Eᵀ + c                        (output tied to the token embedding, bias c)

Every position sees the whole sequence, so logits_t parameterises p(x_t | x_{≠t})
when x_t was replaced by [MASK] (the masked-language-model task,
`train/tasks/mlm.py`). The blocks are post-LN as in the paper (`pre_norm=False`),
or pre-LN with a final LayerNorm before the head. There is no next-sentence
head: RoBERTa (Liu et al. 2019) trains as well or better without it.

Vocabulary: ids 0 … V−1 are the tokenizer's and the `num_special_tokens` ids
after them are BERT's special tokens, in the order of `SPECIAL_TOKENS`:
[PAD] = V, [CLS] = V + 1, [SEP] = V + 2, [MASK] = V + 3. Keys holding [PAD] are
masked out of every attention, so padding never changes another position's
output. The embedding and the logits cover all V + `num_special_tokens` ids.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.attention import kinds
from models.attention.core import IN_ATTENTION, key_mask
from models.transformer.blocks import TokenEmbedding, TransformerBlock, layer_norm
from models.transformer.gpt import check_transformer_options, embed_positions

# Special tokens, with ids V, V + 1, … after the tokenizer's V ids.
SPECIAL_TOKENS = ('[PAD]', '[CLS]', '[SEP]', '[MASK]')


def special_token_id(vocab_size: int, token: str) -> int:
  """The id of special `token` ('[PAD]', '[CLS]', '[SEP]' or '[MASK]') after V = `vocab_size` ids."""
  return vocab_size + SPECIAL_TOKENS.index(token)


class BERT(nn.Module):
  """Bidirectional Transformer encoder with the MLM head (see module doc).

  `__call__(tokens_BxT, segments_BxT=None, *, train=False)` → logits
  [B, T, V + num_special_tokens], float32. `segments_BxT` holds segment
  (token-type) ids in [0, num_segments); None means segment 0 everywhere.

  Attributes:
    vocab_size: V, the tokenizer's ids (filled in from the data).
    num_special_tokens: the ids after V (the first S of `SPECIAL_TOKENS`); with
      at least one, id V is [PAD] and is masked out of attention. 0: no
      special tokens and no padding mask.
    num_segments: rows of the segment embedding S (2 in BERT, for sentence A
      and B); 0: no segment embedding.
    num_layers, features, num_heads: L blocks of width D with N heads.
    mlp_dim: the MLP's hidden width (default 4·D).
    max_length: the longest sequence (the learned table's size; sinusoidal,
      ALiBi and rotary positions extrapolate beyond it).
    positions: 'learned' (BERT), 'sinusoidal', 'alibi', 'rotary' or 'none'.
    attention: the self-attention's kind (models/attention/kinds.py), default 'exact'.
    attention_options: that kind's options, e.g. {'num_features': 128} for 'performer'.
    dropout_rate: dropout on the embeddings and after every sub-layer (0.1 in BERT).
    pre_norm: pre-LN blocks and a final LayerNorm; False: post-LN, as BERT.
    use_bias: biases in the projections and LayerNorms (the output bias c is always kept).
    dtype: compute dtype; parameters, LayerNorms and logits are float32.
  """
  vocab_size: int
  num_special_tokens: int = len(SPECIAL_TOKENS)
  num_segments: int = 0
  num_layers: int = 4
  features: int = 256
  num_heads: int = 4
  mlp_dim: int | None = None
  max_length: int = 512
  positions: str = 'learned'
  attention: str = 'exact'
  attention_options: Any = ()
  dropout_rate: float = 0.1
  pre_norm: bool = False
  use_bias: bool = True
  dtype: Any = jnp.float32

  def __post_init__(self):
    check_transformer_options('BERT', self, self.vocab_size)
    for option in ('num_special_tokens', 'num_segments'):
      value = getattr(self, option)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f'BERT {option} must be an integer >= 0, got {value!r}.')
    if self.num_special_tokens > len(SPECIAL_TOKENS):
      raise ValueError(f'BERT num_special_tokens={self.num_special_tokens} exceeds the '
                       f'{len(SPECIAL_TOKENS)} special tokens {", ".join(SPECIAL_TOKENS)}.')
    super().__post_init__()

  @property
  def num_embeddings(self) -> int:
    """V + num_special_tokens: the rows of the token embedding and the width of the logits."""
    return self.vocab_size + self.num_special_tokens

  @property
  def rng_streams(self) -> tuple[str, ...]:
    """Random streams the model draws from while training, besides dropout."""
    return kinds.stream_names(self.attention)

  @nn.compact
  def __call__(self, tokens_BxT, segments_BxT=None, *, train: bool = False):
    if tokens_BxT.ndim != 2:
      raise ValueError(f'BERT needs tokens of shape (B, T), got shape {tokens_BxT.shape}.')
    if segments_BxT is not None:
      if not self.num_segments:
        raise ValueError('BERT got segment ids but has num_segments=0; set num_segments to the '
                         'number of segment kinds (2 in BERT).')
      if segments_BxT.shape != tokens_BxT.shape:
        raise ValueError(f'BERT segment ids of shape {segments_BxT.shape} must match the tokens '
                         f'of shape {tokens_BxT.shape}.')
    embed = TokenEmbedding(self.num_embeddings, self.features, self.dtype, name='token_embed')
    x_BxTxD = embed_positions(embed(tokens_BxT), self.positions, self.max_length)
    if self.num_segments:
      if segments_BxT is None:
        segments_BxT = jnp.zeros_like(tokens_BxT)
      table_SxD = self.param('segment_embed', nn.with_logical_partitioning(
          nn.initializers.normal(0.02), (None, 'embed')), (self.num_segments, self.features))
      x_BxTxD = x_BxTxD + jnp.take(table_SxD, segments_BxT, axis=0).astype(x_BxTxD.dtype)
    x_BxTxD = layer_norm(self.use_bias, 'embed_norm')(x_BxTxD)
    x_BxTxD = nn.Dropout(self.dropout_rate, deterministic=not train)(x_BxTxD)
    x_BxTxD = nn.with_logical_constraint(x_BxTxD, ('batch', 'length', 'embed'))

    mask = None
    if self.num_special_tokens:
      mask = key_mask(tokens_BxT != special_token_id(self.vocab_size, '[PAD]'))
    positions = self.positions if self.positions in IN_ATTENTION else 'none'
    for layer in range(self.num_layers):
      x_BxTxD = TransformerBlock(self.num_heads, self.mlp_dim or 4 * self.features,
                                 self.dropout_rate, self.pre_norm, causal=False, positions=positions,
                                 attention=self.attention,
                                 attention_options=self.attention_options,
                                 max_length=self.max_length, use_bias=self.use_bias,
                                 dtype=self.dtype,
                                 name=f'block{layer}')(x_BxTxD, mask=mask, train=train)
    if self.pre_norm:
      x_BxTxD = layer_norm(self.use_bias, 'final_norm')(x_BxTxD)

    # The MLM head: z = LayerNorm(GELU(W h + b)), logits = z Eᵀ + c.
    z_BxTxD = nn.Dense(self.features, use_bias=self.use_bias, dtype=self.dtype,
                       param_dtype=jnp.float32,
                       kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                ('embed', None)),
                       bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
                       name='head_transform')(x_BxTxD)
    z_BxTxD = layer_norm(self.use_bias, 'head_norm')(nn.gelu(z_BxTxD))
    output_bias_V = self.param('output_bias', nn.with_logical_partitioning(
        nn.initializers.zeros, ('vocab',)), (self.num_embeddings,))
    logits_BxTxV = embed.attend(z_BxTxD.astype(self.dtype)).astype(jnp.float32) + output_bias_V
    return nn.with_logical_constraint(logits_BxTxV, ('batch', 'length', 'vocab'))
