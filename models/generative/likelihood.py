"""Log-densities, KL divergences and units shared by the likelihood models.

Images of 8-bit pixels k ∈ {0, …, 255}^D are modelled as densities on [0, 1]^D
after uniform dequantisation (Theis et al. 2016, "A note on the evaluation of
generative models", §3.1): y = (k + u) / 256, u ~ U[0, 1)^D. For any density p
on [0, 1]^D, Jensen's inequality gives the discrete model P(k) = ∫_bin(k) p(y) dy
the bound

  −log₂ P(k) ≤ E_u[−log₂ p(y)] + D log₂ 256,

so −log p(y) in nats becomes bits per dimension as nll / (D ln 2) + 8.

The log-densities are elementwise (they broadcast); callers sum over the
dimensions of one example. The KL divergence sums over the last (latent) axis.
"""

import math

import jax
import jax.numpy as jnp

from models import losses

LOG_2PI = math.log(2 * math.pi)


def dequantize(key: jax.Array, pixels: jax.Array) -> jax.Array:
  """y = (pixels + u) / 256 with u ~ U[0, 1) per pixel, a point of the pixel's bin in [0, 1)."""
  u = jax.random.uniform(key, jnp.shape(pixels), jnp.float32)
  return (jnp.asarray(pixels, jnp.float32) + u) / 256.0


def bits_per_dim(nll_nats, num_dims: int, levels: int = 256):
  """nll / (D ln 2) + log₂(levels): a density's nats on [0, 1]^D as bits per discrete dimension."""
  if not isinstance(num_dims, int) or num_dims < 1:
    raise ValueError(f'bits_per_dim needs a positive number of dimensions, got {num_dims!r}.')
  if not isinstance(levels, int) or levels < 2:
    raise ValueError(f'bits_per_dim needs at least 2 levels per dimension, got {levels!r}.')
  return nll_nats / (num_dims * math.log(2)) + math.log2(levels)


def gaussian_log_prob(x, mean, log_var):
  """log N(x; μ, σ²) = −½ (log 2π + log σ² + (x − μ)² / σ²), elementwise, with log_var = log σ²."""
  return -0.5 * (LOG_2PI + log_var + jnp.square(x - mean) * jnp.exp(-log_var))


def bernoulli_log_prob(logits, x):
  """x log σ(l) + (1 − x) log(1 − σ(l)), elementwise, for x in [0, 1] (soft targets allowed).

  The negative binary cross-entropy, computed without exp overflow for large |l|.
  """
  x = jnp.broadcast_to(jnp.asarray(x, logits.dtype), logits.shape)
  return -losses.binary_cross_entropy_with_logits(logits, x)


def kl_diag_gaussian_to_standard(mean, log_var):
  """KL(N(μ, diag σ²) ‖ N(0, I)) = ½ Σ_j (μ_j² + σ_j² − 1 − log σ_j²), summed over the last axis.

  Kingma & Welling 2014, Appendix B (the negative of their −KL term).
  """
  return 0.5 * jnp.sum(jnp.square(mean) + jnp.exp(log_var) - 1.0 - log_var, axis=-1)


def log_mean_exp(log_values, axis: int = 0):
  """log (1/K) Σ_k exp(a_k) along `axis`, stable for any magnitude of the a_k (K = its size)."""
  return jax.nn.logsumexp(log_values, axis=axis) - math.log(log_values.shape[axis])
