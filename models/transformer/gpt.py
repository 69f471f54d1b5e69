"""GPT: a decoder-only Transformer language model (Radford et al. 2018, 2019).

  h⁰ = E[x_t] + P[t]                    (token and position embeddings)
  hˡ = Block_l(hˡ⁻¹),  l = 1 … L         (causal self-attention and MLP, pre-LN)
  logits_t = LayerNorm(hᴸ_t) Eᵀ         (output tied to the embedding), or W_out

Position t sees tokens ≤ t, so logits_t parameterises p(x_{t+1} | x_≤t). With
`decode=True` every attention layer keeps its keys and values in the 'cache'
collection (train/sampling.py's protocol): generation reads one token per step.
"""

import numbers
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.attention import kinds
from models.attention import positions as positions_lib
from models.attention.core import IN_ATTENTION
from models.transformer.blocks import TokenEmbedding, TransformerBlock, layer_norm, output_logits


def check_transformer_options(name: str, module, vocab_size: int | None = None,
                              causal: bool = False) -> None:
  """One sentence per option of a Transformer config that cannot work (`causal`: whether the
  model's self-attention is, which some attention kinds cannot be)."""
  for option in ('num_layers', 'features', 'num_heads', 'mlp_dim', 'max_length'):
    value = getattr(module, option, 1)
    if option == 'mlp_dim' and value is None:  # the default 4·D
      continue
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} {option} must be a positive integer, got {value!r}.')
  if module.features % module.num_heads:
    raise ValueError(f'{name} features={module.features} must be divisible by num_heads='
                     f'{module.num_heads}.')
  if module.positions not in positions_lib.SCHEMES:
    raise ValueError(f'{name} positions={module.positions!r}; allowed: '
                     f'{", ".join(positions_lib.SCHEMES)}.')
  if module.positions == 'rotary' and (module.features // module.num_heads) % 2:
    raise ValueError(f'{name} rotary positions need an even head width, got '
                     f'{module.features // module.num_heads}.')
  if not (isinstance(module.dropout_rate, numbers.Real) and 0 <= module.dropout_rate < 1):
    raise ValueError(f'{name} dropout_rate must lie in [0, 1), got {module.dropout_rate!r}.')
  if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
    raise ValueError(f'{name} vocab_size must be a positive integer, got {vocab_size!r}.')
  kinds.check(name, getattr(module, 'attention', 'exact'), getattr(module, 'attention_options', ()),
              causal=causal, positions=module.positions)


def embed_positions(x_BxTxD, positions: str, max_length: int, start=0):
  """x plus the additive position embedding (scheme `positions`) of positions
  start … start+T−1, if the scheme adds one; call it inside a compact method (a learned
  table becomes the caller's submodule 'position_embed').

  Only the learned table stops at max_length; sinusoidal positions are a formula
  and extend to any length (an evaluation on windows longer than the training's).
  """
  steps, width = x_BxTxD.shape[1:]
  if positions == 'learned' and steps > max_length:
    raise ValueError(f'{steps} positions exceed max_length={max_length} of the learned '
                     f'position embedding; give at most {max_length} or raise max_length.')
  positions_T = start + jnp.arange(steps)
  if positions == 'sinusoidal':
    return x_BxTxD + positions_lib.sinusoidal(positions_T, width).astype(x_BxTxD.dtype)
  if positions == 'learned':
    table = positions_lib.LearnedPositions(max_length, width, name='position_embed')
    return x_BxTxD + table(positions_T).astype(x_BxTxD.dtype)
  return x_BxTxD


def decode_start(module: nn.Module, steps: int):
  """The position of this decoding call's first token: 0 at the cache's first call, which
  creates the counter ('cache', 'position'), else its value, which then moves on by `steps`.
  Call it inside the compact method of the module whose additive embeddings it places."""
  is_initialized = module.has_variable('cache', 'position')
  position = module.variable('cache', 'position', lambda: jnp.zeros((), jnp.int32))
  if not is_initialized:
    return 0
  start = position.value
  position.value = start + steps
  return start


class GPT(nn.Module):
  """Decoder-only Transformer (see module doc).

  Attributes:
    vocab_size: V.
    num_layers, features, num_heads: L blocks of width D with N heads.
    mlp_dim: the MLP's hidden width (default 4·D).
    max_length: the longest context (the learned table's size; sinusoidal,
      ALiBi and rotary positions extrapolate beyond it).
    positions: 'learned', 'sinusoidal', 'alibi', 'rotary' or 'none'.
    attention: the self-attention's kind (models/attention/kinds.py), default 'exact'.
    attention_options: that kind's options, e.g. {'num_features': 128} for 'performer'.
    dropout_rate: dropout on the embeddings and after every sub-layer.
    pre_norm: pre-LN blocks and a final LayerNorm (GPT-2); False: post-LN.
    tie_embeddings: logits = h Eᵀ; else a separate output layer.
    scale_embeddings: multiply the token embeddings by √D (Vaswani et al. 2017, §3.4), so
      that sinusoidal positions of amplitude 1 do not drown tokens initialised at std 0.02.
    use_bias: biases in the projections and LayerNorms.
    dtype: compute dtype; parameters, LayerNorms and logits are float32.
  """
  vocab_size: int
  num_layers: int = 4
  features: int = 256
  num_heads: int = 4
  mlp_dim: int | None = None
  max_length: int = 256
  positions: str = 'learned'
  attention: str = 'exact'
  attention_options: Any = ()
  dropout_rate: float = 0.0
  pre_norm: bool = True
  tie_embeddings: bool = True
  scale_embeddings: bool = False
  use_bias: bool = True
  dtype: Any = jnp.float32

  def __post_init__(self):
    check_transformer_options('GPT', self, self.vocab_size, causal=True)
    super().__post_init__()

  @property
  def max_context(self) -> int:
    """Generation reads at most the last `max_length` tokens (train/sampling.py), the
    context the model was trained on, whatever its position scheme."""
    return self.max_length

  @property
  def has_cache(self) -> bool:
    """Whether `decode=True` works: the key/value cache serves exact and chunked attention."""
    return self.attention in kinds.CACHED

  @property
  def rng_streams(self) -> tuple[str, ...]:
    """Random streams the model draws from while training, besides dropout."""
    return kinds.stream_names(self.attention)

  @nn.compact
  def __call__(self, tokens_BxT, *, train: bool = False, decode: bool = False):
    embed = TokenEmbedding(self.vocab_size, self.features, self.dtype, name='token_embed')
    x_BxTxD = embed(tokens_BxT)
    if self.scale_embeddings:
      x_BxTxD = x_BxTxD * jnp.sqrt(self.features).astype(x_BxTxD.dtype)
    start = decode_start(self, tokens_BxT.shape[1]) if decode else 0
    x_BxTxD = embed_positions(x_BxTxD, self.positions, self.max_length, start)
    x_BxTxD = nn.Dropout(self.dropout_rate, deterministic=not train)(x_BxTxD)
    x_BxTxD = nn.with_logical_constraint(x_BxTxD, ('batch', 'length', 'embed'))
    positions = self.positions if self.positions in IN_ATTENTION else 'none'
    for layer in range(self.num_layers):
      x_BxTxD = TransformerBlock(self.num_heads, self.mlp_dim or 4 * self.features,
                                 self.dropout_rate, self.pre_norm, causal=True, positions=positions,
                                 attention=self.attention,
                                 attention_options=self.attention_options,
                                 max_length=self.max_length, use_bias=self.use_bias,
                                 dtype=self.dtype,
                                 name=f'block{layer}')(x_BxTxD, train=train, decode=decode)
    if self.pre_norm:
      x_BxTxD = layer_norm(self.use_bias, 'final_norm')(x_BxTxD)
    return output_logits(x_BxTxD, embed, self.tie_embeddings, self.vocab_size, self.dtype)
