"""Activation functions and their derivatives, looked up by name.

The functions delegate to `jax.nn` where it has them, because those versions are
numerically stable for large |x| (e.g. the sigmoid never evaluates exp(-x) for
x << 0); the tests check every one against its defining formula. The derivatives
are derived by hand so that `models.backprop` can apply the δ recursion of
back-propagation (Rumelhart et al. 1986) without automatic differentiation.
"""

import functools
import math
import re
from typing import Callable

import jax
import jax.numpy as jnp

Activation = Callable[[jnp.ndarray], jnp.ndarray]

LEAKY_RELU_ALPHA = 0.01
ELU_ALPHA = 1.0
# Coefficient of the cubic term in the tanh approximation of GELU.
_GELU_CUBIC = 0.044715


def sigmoid(x: jnp.ndarray) -> jnp.ndarray:
  """Logistic sigmoid φ(x) = 1 / (1 + e^{-x})."""
  return jax.nn.sigmoid(x)


def tanh(x: jnp.ndarray) -> jnp.ndarray:
  """tanh(x) = (e^x - e^{-x}) / (e^x + e^{-x}) = 2φ(2x) - 1."""
  return jnp.tanh(x)


def relu(x: jnp.ndarray) -> jnp.ndarray:
  """ReLU (Nair & Hinton 2010; Glorot et al. 2011): (x)_+ = max{0, x}."""
  return jax.nn.relu(x)


def leaky_relu(x: jnp.ndarray, alpha: float = LEAKY_RELU_ALPHA) -> jnp.ndarray:
  """Leaky ReLU (Maas et al. 2013): f(x) = max{αx, x} for a slope 0 ≤ α < 1 on the negative part."""
  return jax.nn.leaky_relu(x, negative_slope=alpha)


def gelu(x: jnp.ndarray) -> jnp.ndarray:
  """GELU (Hendrycks & Gimpel 2016), exact: x · P[X ≤ x] = x · ½(1 + erf(x/√2)) for X ~ N(0, 1)."""
  return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x: jnp.ndarray) -> jnp.ndarray:
  """Tanh approximation of GELU (Hendrycks & Gimpel 2016): ½x(1 + tanh(√(2/π)(x + 0.044715x³)))."""
  return jax.nn.gelu(x, approximate=True)


def elu(x: jnp.ndarray, alpha: float = ELU_ALPHA) -> jnp.ndarray:
  """ELU (Clevert et al. 2016): x for x > 0 and α(exp(x) - 1) for x ≤ 0 (α = 1 by default)."""
  return jax.nn.elu(x, alpha=alpha)


def sigmoid_derivative(x: jnp.ndarray) -> jnp.ndarray:
  """φ'(x) = φ(x)(1 - φ(x)) for the logistic sigmoid φ."""
  s = jax.nn.sigmoid(x)
  return s * (1 - s)


def tanh_derivative(x: jnp.ndarray) -> jnp.ndarray:
  """tanh'(x) = 1 - tanh²(x)."""
  return 1 - jnp.tanh(x) ** 2


def _float_dtype(x: jnp.ndarray):
  """The dtype of x if inexact (bfloat16 stays bfloat16), else float32."""
  dtype = jnp.result_type(x)
  return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.float32


def relu_derivative(x: jnp.ndarray) -> jnp.ndarray:
  """1 for x > 0, else 0 (ReLU); 0 at the kink, as `jax.grad` uses."""
  return (x > 0).astype(_float_dtype(x))


def leaky_relu_derivative(x: jnp.ndarray, alpha: float = LEAKY_RELU_ALPHA) -> jnp.ndarray:
  """1 for x ≥ 0, else α (leaky ReLU); 1 at the kink, as `jax.grad` uses."""
  return jnp.where(x >= 0, 1.0, alpha).astype(_float_dtype(x))


def gelu_derivative(x: jnp.ndarray) -> jnp.ndarray:
  """d/dx x·Φ(x) = Φ(x) + x·ϕ(x), with Φ, ϕ the standard normal cdf and density."""
  cdf = 0.5 * (1 + jax.scipy.special.erf(x / math.sqrt(2)))
  pdf = jnp.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
  return cdf + x * pdf


def gelu_tanh_derivative(x: jnp.ndarray) -> jnp.ndarray:
  """Derivative of ½x(1 + tanh(u)) with u = √(2/π)(x + 0.044715x³)."""
  c = math.sqrt(2 / math.pi)
  t = jnp.tanh(c * (x + _GELU_CUBIC * x**3))
  return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * _GELU_CUBIC * x**2)


def elu_derivative(x: jnp.ndarray, alpha: float = ELU_ALPHA) -> jnp.ndarray:
  """1 for x > 0, else α·exp(x) (ELU); α at the kink, as `jax.grad` uses."""
  return jnp.where(x > 0, 1.0, alpha * jnp.exp(jnp.minimum(x, 0)))


ACTIVATIONS: dict[str, Activation] = {
    'sigmoid': sigmoid,
    'tanh': tanh,
    'relu': relu,
    'leaky_relu': leaky_relu,
    'gelu': gelu,
    'gelu_tanh': gelu_tanh,
    'elu': elu,
}

DERIVATIVES: dict[str, Activation] = {
    'sigmoid': sigmoid_derivative,
    'tanh': tanh_derivative,
    'relu': relu_derivative,
    'leaky_relu': leaky_relu_derivative,
    'gelu': gelu_derivative,
    'gelu_tanh': gelu_tanh_derivative,
    'elu': elu_derivative,
}


# Activations with a parameter, written `name(value)` (e.g. 'leaky_relu(0.2)'), and the
# values each allows.
_PARAMETERS: dict[str, tuple[str, Callable[[float], bool], str]] = {
    'leaky_relu': ('alpha', lambda a: 0 <= a < 1, 'a slope α in [0, 1)'),
    'elu': ('alpha', lambda a: a > 0, 'a scale α > 0'),
}
_WITH_PARAMETER = re.compile(r'(\w+)\(([^()]*)\)')
# Maxout is a layer of k affine pieces per unit, not an elementwise function; models.mlp.MLP
# takes 'maxout(k)' as its activation.
MAXOUT = 'maxout'


def _allowed_names() -> str:
  return (f'{", ".join(sorted(ACTIVATIONS))}, {", ".join(f"{n}(α)" for n in sorted(_PARAMETERS))}, '
          f'or {MAXOUT}(k) in an MLP')


def parse(name: str) -> tuple[str, dict[str, float]]:
  """'leaky_relu(0.2)' → ('leaky_relu', {'alpha': 0.2}); 'relu' → ('relu', {}).

  Raises a ValueError naming the activation and what is allowed when it is not a string, the
  name is unknown or its parameter is not allowed.
  """
  if not isinstance(name, str):
    raise ValueError(f'An activation is a name or a callable, got {name!r}; the names: {_allowed_names()}.')
  match = _WITH_PARAMETER.fullmatch(name.replace(' ', ''))
  base, value = match.groups() if match else (name, None)
  if base not in ACTIVATIONS:
    raise ValueError(f'Unknown activation {name!r}; allowed: {_allowed_names()}.')
  if value is None:
    return base, {}
  if base not in _PARAMETERS:
    raise ValueError(f'Activation {name!r}: {base} takes no parameter; only '
                     f'{" and ".join(sorted(_PARAMETERS))} do.')
  key, allowed, allowed_text = _PARAMETERS[base]
  try:
    number = float(value)
  except ValueError:
    number = math.nan
  if not (math.isfinite(number) and allowed(number)):
    raise ValueError(f'Activation {name!r}: its parameter must be {allowed_text}, got {value!r}.')
  return base, {key: number}


def get(name_or_fn: str | Callable) -> Activation:
  """Returns the activation called `name_or_fn` (e.g. 'relu', 'leaky_relu(0.2)', 'elu(0.5)'),
  or `name_or_fn` if callable."""
  if callable(name_or_fn):
    return name_or_fn
  _refuse_maxout(name_or_fn)
  base, options = parse(name_or_fn)
  return functools.partial(ACTIVATIONS[base], **options) if options else ACTIVATIONS[base]


def maxout_pieces(name_or_fn: str | Callable) -> int | None:
  """k for 'maxout(k)' (k ≥ 1), None for any other activation."""
  if not isinstance(name_or_fn, str) or not name_or_fn.replace(' ', '').startswith(MAXOUT):
    return None
  match = _WITH_PARAMETER.fullmatch(name_or_fn.replace(' ', ''))
  if not (match and match.group(1) == MAXOUT and match.group(2).isdigit()
          and int(match.group(2)) >= 1):
    raise ValueError(f'Activation {name_or_fn!r} must read {MAXOUT}(k) with k ≥ 1 affine '
                     f'pieces per unit, e.g. {MAXOUT}(2).')
  return int(match.group(2))


def _refuse_maxout(name: str) -> None:
  if maxout_pieces(name) is not None:
    raise ValueError(f'Activation {name!r} is a layer of affine pieces (models.layers.Maxout), '
                     'not an elementwise function: models.mlp.MLP takes it as its activation.')


def derivative(name_or_fn: str | Callable) -> Activation:
  """Returns φ' for an activation given by name or as an elementwise callable.

  Named activations (and the functions in `ACTIVATIONS` themselves) get their
  hand-derived derivative; any other elementwise callable is differentiated with
  `jax.grad`, which for an elementwise φ is the gradient of Σ φ(x).
  """
  if callable(name_or_fn):
    for name, fn in ACTIVATIONS.items():
      if fn is name_or_fn:
        return DERIVATIVES[name]
    return jax.grad(lambda x: jnp.sum(name_or_fn(x)))
  _refuse_maxout(name_or_fn)
  base, options = parse(name_or_fn)
  return functools.partial(DERIVATIVES[base], **options) if options else DERIVATIVES[base]
