"""Back-propagation by hand for the MLP, with the δ recursion of Rumelhart et al. 1986.

For a batch, the row vector of example n is x_n(l)ᵀ, so the column-vector
formulas z(l) = W(l)ᵀ x(l-1) + b(l) and δ(l) = (W(l+1) δ(l+1)) ⊙ φ'(z(l))
become, with every quantity stacked over the batch:

  forward   z(l) = x(l-1) W(l) + b(l),  x(l) = φ(z(l)), the last layer linear,
  backward  δ(L+1) = ∂C/∂z(L+1),  δ(l) = (δ(l+1) W(l+1)ᵀ) ⊙ φ'(z(l)),
  gradients ∂C/∂W(l) = x(l-1)ᵀ δ(l) = Σ_n x_n(l-1) δ_n(l)ᵀ,  ∂C/∂b(l) = Σ_n δ_n(l).

With `residual=True` (as in `models.mlp.MLP(residual=True)`), a hidden layer whose
input and output widths agree gives x(l) = x(l-1) + φ(z(l)), and its skip adds
∂C/∂x(l) to ∂C/∂x(l-1):  δ(l) = (δ(l+1) W(l+1)ᵀ + s(l+1) ∂C/∂x(l+1)) ⊙ φ'(z(l)),
with s(l+1) = 1 where layer l+1 has a skip and 0 elsewhere.

The gates at the end show the modular forward/backward API of reverse-mode
automatic differentiation (as `jax.custom_vjp` exposes it): a forward
that caches what the backward needs, and a hand-written backward that
multiplies the upstream gradient by the local one.
"""

import re
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from models import activations
from models import losses

Layers = list[tuple[jnp.ndarray, jnp.ndarray]]

LOSSES = ('squared_error', 'cross_entropy')

_DENSE = re.compile(r'Dense_(\d+)')


def layers_from_mlp_params(variables: Mapping[str, Any]) -> Layers:
  """Returns [(W(1), b(1)), …] from `models.mlp.MLP` variables or their 'params' entry."""
  params = variables.get('params', variables)
  names = [name for name in params if _DENSE.fullmatch(name)]
  if not names or len(names) != len(params):
    raise ValueError(f'Expected only Dense_<l> layers of a plain MLP, got {sorted(params)}.')
  # Numeric order: Dense_10 follows Dense_9.
  names.sort(key=lambda name: int(_DENSE.fullmatch(name).group(1)))
  return [(params[name]['kernel'], params[name]['bias']) for name in names]


def layers_to_mlp_params(layers: Sequence[tuple[jnp.ndarray, jnp.ndarray]]) -> dict[str, Any]:
  """Inverse of `layers_from_mlp_params`: {'params': {'Dense_l': {'kernel', 'bias'}}}."""
  return {'params': {f'Dense_{l}': {'kernel': w, 'bias': b} for l, (w, b) in enumerate(layers)}}


def _has_skip(layers: Layers, l: int, residual: bool) -> bool:
  """Whether layer l adds its input, as `MLP(residual=True)` does: a hidden layer of equal widths."""
  w_DxH = layers[l][0]
  return residual and l < len(layers) - 1 and w_DxH.shape[0] == w_DxH.shape[1]


def forward(layers: Layers, x_BxD: jnp.ndarray, activation: str | Callable = 'relu', residual: bool = False
            ) -> tuple[list[jnp.ndarray], list[jnp.ndarray]]:
  """Forward pass z(l) = x(l-1) W(l) + b(l): returns the pre-activations z(l) and activations x(l).

  `xs[0]` is the (flattened) input and `xs[-1] = zs[-1]` the linear output. With
  `residual`, a hidden layer of equal input and output widths gives x(l) = x(l-1) + φ(z(l)).
  """
  phi = activations.get(activation)
  xs = [x_BxD.reshape(x_BxD.shape[0], -1)]
  _check_widths_chain(layers, xs[0].shape[-1])
  zs = []
  for l, (w_DxH, b_H) in enumerate(layers):
    z_BxH = xs[-1] @ w_DxH + b_H
    zs.append(z_BxH)
    if l == len(layers) - 1:
      xs.append(z_BxH)
    elif _has_skip(layers, l, residual):
      xs.append(xs[-1] + phi(z_BxH))
    else:
      xs.append(phi(z_BxH))
  return zs, xs


def _check_widths_chain(layers: Layers, width: int) -> None:
  """One sentence unless every W(l) is (inputs, outputs), reading the previous layer's outputs
  (the input's `width` for W(1)), with a bias b(l) of its outputs."""
  for l, (w, b) in enumerate(layers):
    if jnp.ndim(w) != 2 or jnp.shape(w)[0] != width or jnp.shape(b) != jnp.shape(w)[1:]:
      shapes = [tuple(jnp.shape(w)) for w, _ in layers]
      raise ValueError(f'Layer {l} (kernel {tuple(jnp.shape(w))}, bias {tuple(jnp.shape(b))}) '
                       f'does not read the {width} features before it (kernels {shapes}); '
                       f'back-propagation takes plain MLP layers, each kernel (inputs, outputs), '
                       f'not maxout ones.')
    width = jnp.shape(w)[1]


def backward(layers: Layers, zs: Sequence[jnp.ndarray], xs: Sequence[jnp.ndarray], delta_out_BxK: jnp.ndarray,
             activation: str | Callable = 'relu', residual: bool = False) -> Layers:
  """Backward pass (Rumelhart et al. 1986): δ(l) = (W(l+1) δ(l+1)) ⊙ φ'(z(l)).

  Args:
    layers: [(W(l), b(l))] of the forward pass.
    zs, xs: the output of `forward`.
    delta_out_BxK: δ(L+1) = ∂C/∂z(L+1), one row per example.
    activation: the φ of the forward pass.
    residual: the `residual` of the forward pass; a layer with a skip passes
      ∂C/∂x(l) on to ∂C/∂x(l-1) besides δ(l) W(l)ᵀ.

  Returns:
    [(∂C/∂W(l), ∂C/∂b(l))] in the order of `layers`.
  """
  phi_prime = activations.derivative(activation)
  delta = delta_out_BxK
  grad_x = None  # ∂C/∂x(l), the gradient with respect to the output of layer l
  grads = []
  for l in reversed(range(len(layers))):
    grads.append((xs[l].T @ delta, jnp.sum(delta, axis=0)))
    if l > 0:
      w_DxH = layers[l][0]
      grad_input = delta @ w_DxH.T
      if _has_skip(layers, l, residual):
        grad_input = grad_input + grad_x
      grad_x = grad_input
      delta = grad_input * phi_prime(zs[l - 1])
  return grads[::-1]


def output_delta(output_BxK: jnp.ndarray, targets: jnp.ndarray, loss: str) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Returns the batch-mean cost C and δ(L+1) = ∂C/∂z(L+1) for a linear output layer.

  'squared_error': C = mean_n ‖y_n - x_n(L+1)‖², the squared error L_n averaged over
  the batch, so δ(L+1) = -2(y - x(L+1)) / B (φ' = 1 for the linear output).
  'cross_entropy': C = mean_n CE(onehot(y_n), softmax(z_n)) with integer labels,
  so δ(L+1) = (softmax(z) - onehot(y)) / B.
  """
  batch = output_BxK.shape[0]
  if loss == 'squared_error':
    losses._check_same_shape(output_BxK, targets)
    residual_BxK = targets - output_BxK
    return jnp.mean(jnp.sum(residual_BxK**2, axis=-1)), -2 * residual_BxK / batch
  if loss == 'cross_entropy':
    cost = jnp.mean(losses.cross_entropy(output_BxK, targets))
    one_hot_BxK = jax.nn.one_hot(targets, output_BxK.shape[-1], dtype=output_BxK.dtype)
    return cost, (jax.nn.softmax(output_BxK, axis=-1) - one_hot_BxK) / batch
  raise ValueError(f'Unknown loss {loss!r}; allowed: {", ".join(LOSSES)}.')


def value_and_grad(params: Mapping[str, Any] | Layers, x_BxD: jnp.ndarray, targets: jnp.ndarray, *,
                   activation: str | Callable = 'relu', loss: str = 'squared_error',
                   residual: bool = False) -> tuple[jnp.ndarray, Any]:
  """Cost and its gradient by back-propagation, like `jax.value_and_grad` of the MLP loss.

  Args:
    params: `models.mlp.MLP` variables (no normalisation or dropout), their
      'params' entry, or a list of (W, b).
    x_BxD: inputs; trailing axes are flattened as the MLP does.
    targets: regression targets (B, K) for 'squared_error', integer labels (B,)
      for 'cross_entropy'.
    activation: the MLP's hidden activation.
    loss: one of `LOSSES` (see `output_delta`).
    residual: the MLP's `residual` option, which must match it: its parameters
      are named alike either way, so they cannot tell.

  Returns:
    (C, grads) with grads in the structure of `params`.
  """
  is_mapping = isinstance(params, Mapping)
  layers = layers_from_mlp_params(params) if is_mapping else list(params)
  zs, xs = forward(layers, x_BxD, activation, residual)
  cost, delta_out_BxK = output_delta(xs[-1], targets, loss)
  grads = backward(layers, zs, xs, delta_out_BxK, activation, residual)
  if not is_mapping:
    return cost, grads
  tree = layers_to_mlp_params(grads)
  return cost, tree if 'params' in params else tree['params']


# Modular gates: a forward that caches, a hand-written backward.


@jax.custom_vjp
def multiply(x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
  """Multiply gate, z = x·y elementwise, with a hand-written backward."""
  _check_same_shape('multiply', x, y)
  return x * y


def _multiply_forward(x, y):
  _check_same_shape('multiply', x, y)
  # Cache the inputs: the local gradients are ∂z/∂x = y and ∂z/∂y = x.
  return x * y, (x, y)


def _multiply_backward(cache, grad_z):
  x, y = cache
  return y * grad_z, x * grad_z


multiply.defvjp(_multiply_forward, _multiply_backward)


@jax.custom_vjp
def affine(x_BxD: jnp.ndarray, w_DxH: jnp.ndarray, b_H: jnp.ndarray) -> jnp.ndarray:
  """Dense gate z = x W + b, with the backward of the δ recursion."""
  return x_BxD @ w_DxH + b_H


def _affine_forward(x_BxD, w_DxH, b_H):
  return x_BxD @ w_DxH + b_H, (x_BxD, w_DxH)


def _affine_backward(cache, delta_BxH):
  x_BxD, w_DxH = cache
  return delta_BxH @ w_DxH.T, x_BxD.T @ delta_BxH, jnp.sum(delta_BxH, axis=0)


affine.defvjp(_affine_forward, _affine_backward)


def _check_same_shape(gate: str, x: jnp.ndarray, y: jnp.ndarray) -> None:
  if jnp.shape(x) != jnp.shape(y):
    raise ValueError(f'The {gate} gate takes operands of one shape, got {jnp.shape(x)} and {jnp.shape(y)}.')
