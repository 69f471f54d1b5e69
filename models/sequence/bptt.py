"""Back-propagation through time (BPTT) by hand for the Elman RNN (Werbos 1990).

The Elman network (Elman 1990), for one sequence x_1 … x_T with
column vectors x_t ∈ R^C, h_t ∈ R^H, ŷ_t ∈ R^K:

  a_t = W_xh x_t + W_hh h_{t−1} + b_h,   h_t = tanh(a_t),   ŷ_t = W_hy h_t + b_y,

and the loss L = Σ_t 𝓛(y_t, ŷ_t) with the squared error 𝓛 = ‖ŷ_t − y_t‖², averaged over the
B sequences of a batch (each term optionally weighted by w_t, e.g. 0 past a sequence's length).
Without a readout (no W_hy, b_y in the parameters) the loss is on the hidden states: ŷ_t = h_t.

Backward, with ε_t = ∂L/∂ŷ_t = 2 w_t (ŷ_t − y_t) / B and δ_t = ∂L/∂a_t:

  ∂L/∂h_t = W_hyᵀ ε_t + W_hhᵀ δ_{t+1}          (its own loss term and everything after t),
  δ_t     = (W_hyᵀ ε_t + W_hhᵀ δ_{t+1}) ⊙ (1 − h_t²),   δ_{T+1} = 0,

run from t = T down to 1 (a reverse `jax.lax.scan`), since tanh' (a_t) = 1 − h_t². The chain
rule ∂L/∂W_xh = Σ_t ∂L/∂h_t · ∂h_t/∂W_xh then becomes a sum of outer products, and likewise
for every parameter, each shared by all steps:

  ∂L/∂W_xh = Σ_t δ_t x_tᵀ,   ∂L/∂W_hh = Σ_t δ_t h_{t−1}ᵀ,   ∂L/∂b_h = Σ_t δ_t,
  ∂L/∂W_hy = Σ_t ε_t h_tᵀ,   ∂L/∂b_y = Σ_t ε_t,            ∂L/∂h_0 = W_hhᵀ δ_1.

The δ recursion multiplies by W_hhᵀ diag(1 − h_t²) once per step back, which is why the
gradient from far steps vanishes or explodes (Bengio et al. 1994; Pascanu et al. 2013;
experiments/vanishing_gradients.py).

Parameters are a dict in the equations' orientation: W_xh [H, C], W_hh [H, H], b_h [H], and
optionally W_hy [K, H], b_y [K]. Batches are rows (x_BxTxC), so W x_t is computed as x_t Wᵀ.
`to_simple_cell` / `from_simple_cell` convert to and from the variables of
`rnn.Recurrent('elman')` (Flax's `nn.SimpleCell`, whose kernels are [in, out] = Wᵀ).
"""

from typing import Any, Mapping

import jax
import jax.numpy as jnp

Params = dict[str, jnp.ndarray]


def init_params(key, in_features: int, features: int, out_features: int | None = None,
                recurrent_scale: float = 1.0, input_scale: float = 1.0) -> Params:
  """W_hh = recurrent_scale · a random orthogonal matrix (its singular values are all
  `recurrent_scale`), W_xh ~ N(0, input_scale² / C), zero biases; W_hy ~ N(0, 1 / H)."""
  k_xh, k_hh, k_hy = jax.random.split(key, 3)
  params = {
      'W_xh': input_scale * jax.random.normal(k_xh, (features, in_features)) / jnp.sqrt(in_features),
      'W_hh': recurrent_scale * jax.nn.initializers.orthogonal()(k_hh, (features, features)),
      'b_h': jnp.zeros(features),
  }
  if out_features is not None:
    params['W_hy'] = jax.random.normal(k_hy, (out_features, features)) / jnp.sqrt(features)
    params['b_y'] = jnp.zeros(out_features)
  return params


def forward(params: Mapping[str, jnp.ndarray], x_BxTxC: jnp.ndarray, h0_BxH: jnp.ndarray | None = None
            ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Hidden states h_1 … h_T [B, T, H] and outputs ŷ_1 … ŷ_T [B, T, K] (ŷ = h without a readout)."""
  features = params['W_hh'].shape[0]
  if h0_BxH is None:
    h0_BxH = jnp.zeros((x_BxTxC.shape[0], features), x_BxTxC.dtype)
  # W_xh x_t for every step at once; only W_hh h_{t−1} is sequential.
  wx_TxBxH = jnp.einsum('btc,hc->tbh', x_BxTxC, params['W_xh']) + params['b_h']

  def step(h_BxH, wx_BxH):
    h_BxH = jnp.tanh(wx_BxH + h_BxH @ params['W_hh'].T)
    return h_BxH, h_BxH

  _, h_TxBxH = jax.lax.scan(step, h0_BxH, wx_TxBxH)
  h_BxTxH = jnp.swapaxes(h_TxBxH, 0, 1)
  return h_BxTxH, _readout(params, h_BxTxH)


def _readout(params, h_BxTxH):
  if 'W_hy' not in params:
    return h_BxTxH
  return h_BxTxH @ params['W_hy'].T + params['b_y']


def loss(params: Mapping[str, jnp.ndarray], x_BxTxC: jnp.ndarray, targets_BxTxK: jnp.ndarray,
         h0_BxH: jnp.ndarray | None = None, weights_BxT: jnp.ndarray | None = None) -> jnp.ndarray:
  """L = (1/B) Σ_n Σ_t w_{n,t} ‖ŷ_{n,t} − y_{n,t}‖² (w = 1 if `weights_BxT` is None)."""
  _, y_BxTxK = forward(params, x_BxTxC, h0_BxH)
  per_step_BxT = jnp.sum((y_BxTxK - targets_BxTxK) ** 2, axis=-1)
  if weights_BxT is not None:
    per_step_BxT = per_step_BxT * weights_BxT
  return jnp.sum(per_step_BxT) / x_BxTxC.shape[0]


def value_and_grad(params: Mapping[str, jnp.ndarray], x_BxTxC: jnp.ndarray, targets_BxTxK: jnp.ndarray,
                   h0_BxH: jnp.ndarray | None = None, weights_BxT: jnp.ndarray | None = None
                   ) -> tuple[jnp.ndarray, Params]:
  """`loss` and its gradient by the δ recursion of the module docstring, like
  `jax.value_and_grad(loss, argnums=(0, 3))`.

  Returns:
    (L, grads): grads has a key per parameter (∂L/∂W_xh, …, in the parameters' shapes) and
    'h0', ∂L/∂h_0 [B, H] (for the zero initial state when `h0_BxH` is None).
  """
  batch = x_BxTxC.shape[0]
  features = params['W_hh'].shape[0]
  if h0_BxH is None:
    h0_BxH = jnp.zeros((batch, features), x_BxTxC.dtype)
  h_BxTxH, y_BxTxK = forward(params, x_BxTxC, h0_BxH)
  residual_BxTxK = y_BxTxK - targets_BxTxK
  per_step_BxT = jnp.sum(residual_BxTxK ** 2, axis=-1)
  eps_BxTxK = 2 * residual_BxTxK / batch  # ε_t = ∂L/∂ŷ_t
  if weights_BxT is not None:
    per_step_BxT = per_step_BxT * weights_BxT
    eps_BxTxK = eps_BxTxK * weights_BxT[..., None]
  value = jnp.sum(per_step_BxT) / batch
  # The direct term of ∂L/∂h_t: W_hyᵀ ε_t (or ε_t itself when ŷ_t = h_t).
  direct_BxTxH = eps_BxTxK @ params['W_hy'] if 'W_hy' in params else eps_BxTxK

  def back_step(from_next_BxH, inputs):
    """δ_t = (W_hyᵀ ε_t + W_hhᵀ δ_{t+1}) ⊙ (1 − h_t²); carries W_hhᵀ δ_t to step t − 1."""
    direct_BxH, h_BxH = inputs
    delta_BxH = (direct_BxH + from_next_BxH) * (1 - h_BxH ** 2)
    return delta_BxH @ params['W_hh'], delta_BxH

  to_h0_BxH, delta_TxBxH = jax.lax.scan(
      back_step, jnp.zeros_like(h0_BxH),
      (jnp.swapaxes(direct_BxTxH, 0, 1), jnp.swapaxes(h_BxTxH, 0, 1)), reverse=True)
  delta_BxTxH = jnp.swapaxes(delta_TxBxH, 0, 1)
  h_prev_BxTxH = jnp.concatenate([h0_BxH[:, None], h_BxTxH[:, :-1]], axis=1)  # h_{t−1}
  grads = {
      'W_xh': jnp.einsum('bth,btc->hc', delta_BxTxH, x_BxTxC),  # Σ_t δ_t x_tᵀ
      'W_hh': jnp.einsum('bth,btg->hg', delta_BxTxH, h_prev_BxTxH),  # Σ_t δ_t h_{t−1}ᵀ
      'b_h': jnp.sum(delta_BxTxH, axis=(0, 1)),  # Σ_t δ_t
      'h0': to_h0_BxH,  # W_hhᵀ δ_1
  }
  if 'W_hy' in params:
    grads['W_hy'] = jnp.einsum('btk,bth->kh', eps_BxTxK, h_BxTxH)  # Σ_t ε_t h_tᵀ
    grads['b_y'] = jnp.sum(eps_BxTxK, axis=(0, 1))  # Σ_t ε_t
  return value, grads


def to_simple_cell(params: Mapping[str, jnp.ndarray]) -> dict[str, Any]:
  """Variables of `rnn.Recurrent('elman', H)` computing the same h_t (the readout is not part of it)."""
  return {'params': {'SimpleCell_0': {'i': {'kernel': params['W_xh'].T, 'bias': params['b_h']},
                                      'h': {'kernel': params['W_hh'].T}}}}


def from_simple_cell(variables: Mapping[str, Any]) -> Params:
  """Inverse of `to_simple_cell`: W_xh, W_hh, b_h from `rnn.Recurrent('elman')` variables."""
  cell = variables.get('params', variables)['SimpleCell_0']
  return {'W_xh': cell['i']['kernel'].T, 'W_hh': cell['h']['kernel'].T, 'b_h': cell['i']['bias']}
