"""Autoencoders and the variational autoencoder, on images flattened to D pixels.

Autoencoder: an encoder h = f(x) to a code of K units and a decoder to per-pixel
logits, x̂ = σ(g(h)). The denoising, sparse and contractive autoencoders share
this module; what makes them different is their objective, an option of the
'autoencoder' task (`train/tasks/autoencoder.py`), and the presets below only
change the defaults.

VAE (Kingma & Welling 2014, "Auto-encoding variational Bayes"): the encoder
gives q(z|x) = N(μ(x), diag σ²(x)), a sample is z = μ + σ ⊙ ε with ε ~ N(0, I)
(the reparameterisation, §2.4), the prior is p(z) = N(0, I) and the decoder
p(x|z) is Bernoulli (logits) or Gaussian (mean σ(g(z)) ∈ [0, 1], learned log σ²).
The ELBO and the importance-weighted bound of Burda et al. 2016 are computed by
the 'vae' task from the distributions the module returns.
"""

import math
import numbers
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import activations

DECODERS = ('bernoulli', 'gaussian')
DECODER_SCALES = ('per_pixel', 'global')
# The code activation may be any named activation, or none.
LINEAR = 'linear'


def _check_common(name: str, module) -> None:
  if not isinstance(module.latent_dim, int) or module.latent_dim < 1:
    raise ValueError(f'{name} latent_dim must be a positive integer, got {module.latent_dim!r}.')
  if not all(isinstance(w, int) and w > 0 for w in module.hidden_sizes):
    raise ValueError(f'{name} hidden_sizes must be positive integers, got '
                     f'{tuple(module.hidden_sizes)!r}.')
  if not (module.image_shape and all(isinstance(s, int) and s > 0 for s in module.image_shape)):
    raise ValueError(f'{name} image_shape must be positive integers, got '
                     f'{tuple(module.image_shape)!r}.')
  activations.get(module.activation)


def _check_input(name: str, module, x) -> None:
  if tuple(x.shape[1:]) != tuple(module.image_shape):
    raise ValueError(f'{name} image_shape={tuple(module.image_shape)} does not match inputs of '
                     f'shape {tuple(x.shape)}; set model.image_shape={tuple(x.shape[1:])}.')


def _check_code(name: str, module, z) -> None:
  if jnp.ndim(z) < 1 or jnp.shape(z)[-1] != module.latent_dim:
    raise ValueError(f'{name} decodes codes [..., latent_dim] = [..., {module.latent_dim}], got '
                     f'shape {jnp.shape(z)}.')


def _flatten(x) -> jax.Array:
  return x.reshape(x.shape[0], -1)


class Autoencoder(nn.Module):
  """h = c(W_L φ(… φ(W_1 x + b_1) …) + b_L), logits = g(h) with a mirrored MLP decoder.

  Attributes:
    latent_dim: K, the code size.
    hidden_sizes: widths of the encoder's hidden layers (the decoder's, reversed);
      () for the one-layer encoder h = c(W x + b).
    activation: φ of the hidden layers (a name in `models.activations`).
    code_activation: c, 'sigmoid' (codes in (0, 1), as the sparsity and
      contraction penalties need), another named activation, or 'linear'.
    image_shape: the shape of one input (the output of `decode`).
    dtype: the compute dtype; parameters stay float32.

  Parameters are named `encoder_0 … encoder_L` (the last one gives the code) and
  `decoder_0 … decoder_L` (the last one gives the D logits).
  """
  latent_dim: int = 32
  hidden_sizes: Sequence[int] = (256,)
  activation: str = 'relu'
  code_activation: str = 'sigmoid'
  image_shape: Sequence[int] = (28, 28, 1)
  dtype: Any = jnp.float32

  def setup(self):
    name = type(self).__name__
    _check_common(name, self)
    if self.code_activation != LINEAR:
      activations.get(self.code_activation)
    num_dims = math.prod(self.image_shape)
    self.encoder = [nn.Dense(w, dtype=self.dtype)
                    for w in tuple(self.hidden_sizes) + (self.latent_dim,)]
    self.decoder = [nn.Dense(w, dtype=self.dtype)
                    for w in tuple(reversed(self.hidden_sizes)) + (num_dims,)]

  @property
  def has_one_sigmoid_layer_encoder(self) -> bool:
    """Whether h = σ(W x + b), whose Jacobian has a closed form (the contraction penalty)."""
    return not tuple(self.hidden_sizes) and self.code_activation == 'sigmoid'

  def encode(self, x, *, train: bool = False) -> jax.Array:
    """The code h [B, K] of images x [B, *image_shape]."""
    del train
    _check_input(type(self).__name__, self, x)
    phi = activations.get(self.activation)
    h = _flatten(x)
    for layer in self.encoder[:-1]:
      h = phi(layer(h))
    h_BxK = self.encoder[-1](h)
    return h_BxK if self.code_activation == LINEAR else activations.get(self.code_activation)(h_BxK)

  def decode(self, h_BxK, *, train: bool = False) -> jax.Array:
    """Per-pixel logits [B, *image_shape] of the reconstruction σ(logits) of codes h [B, K]."""
    del train
    _check_code(type(self).__name__, self, h_BxK)
    phi = activations.get(self.activation)
    y = h_BxK
    for layer in self.decoder[:-1]:
      y = phi(layer(y))
    return self.decoder[-1](y).reshape((h_BxK.shape[0],) + tuple(self.image_shape))

  def __call__(self, x, *, train: bool = False) -> tuple[jax.Array, jax.Array]:
    """(logits with x's shape, code h [B, K])."""
    h_BxK = self.encode(x, train=train)
    return self.decode(h_BxK, train=train), h_BxK


class DenoisingAutoencoder(Autoencoder):
  """Denoising autoencoder (Vincent et al. 2008, "Extracting and composing robust features
  with denoising autoencoders"): trained to reconstruct the clean x from a corrupted x̃,
  min E L(x, g(f(x̃))) (task option `corruption`); one sigmoid layer each way, as in the paper
  (the decoder's sigmoid is the reconstruction σ(logits))."""
  latent_dim: int = 256
  hidden_sizes: Sequence[int] = ()


class SparseAutoencoder(Autoencoder):
  """Sparse autoencoder (Ng 2011, "Sparse autoencoder", CS294A; the KL form of the
  sparsity target from Lee et al. 2008, "Sparse deep belief net model for visual area V2"):
  reconstruction + β Σ_j KL(ρ ‖ ρ̂_j), ρ̂_j the mean activation of code unit j over the
  batch (task options `sparsity_target` ρ, `sparsity_weight` β). Sigmoid code units."""
  latent_dim: int = 196
  hidden_sizes: Sequence[int] = ()


class ContractiveAutoencoder(Autoencoder):
  """Contractive autoencoder (Rifai et al. 2011, "Contractive auto-encoders: explicit
  invariance during feature extraction"): reconstruction + λ ‖J_f(x)‖²_F (task option
  `contraction_weight`). The encoder is one sigmoid layer h = σ(W x + b), for which
  ‖J_f(x)‖²_F = Σ_j (h_j (1 − h_j))² Σ_i W_ji²."""
  latent_dim: int = 256
  hidden_sizes: Sequence[int] = ()


def sigmoid_encoder_jacobian_sq_norm(h_BxK, kernel_DxK) -> jax.Array:
  """‖J_f(x)‖²_F = Σ_j (h_j (1 − h_j))² Σ_i W_ji² per example [B], for h = σ(W x + b) with the
  Dense kernel [D, K] = Wᵀ (Rifai et al. 2011): ∂h_j/∂x_i = h_j (1 − h_j) W_ji, so J is never
  formed. float32."""
  h_BxK = h_BxK.astype(jnp.float32)
  column_sq_norms_K = jnp.sum(jnp.square(kernel_DxK.astype(jnp.float32)), axis=0)
  return jnp.sum(jnp.square(h_BxK * (1 - h_BxK)) * column_sq_norms_K, axis=-1)


class VAEOutput(NamedTuple):
  """What `VAE.__call__` returns for images x [B, …] and S samples per image.

  posterior_mean, posterior_log_var: μ and log σ² of q(z|x), [B, K].
  z: the samples z_s = μ + σ ⊙ ε_s, [S, B, K].
  decoder_mean: Bernoulli logits, or the Gaussian mean in [0, 1], [S, B, …].
  decoder_log_var: the Gaussian log σ² broadcast to [S, B, …]; None for Bernoulli.
  """
  posterior_mean: jax.Array
  posterior_log_var: jax.Array
  z: jax.Array
  decoder_mean: jax.Array
  decoder_log_var: jax.Array | None


class VAE(nn.Module):
  """Variational autoencoder (Kingma & Welling 2014) with a Gaussian encoder and a Bernoulli
  or Gaussian decoder; its importance-weighted bound (Burda et al. 2016) is the task's.

    q(z|x) = N(μ(x), diag σ²(x)),  z = μ + σ ⊙ ε,  ε ~ N(0, I)  (ε from the 'latent' stream)
    p(z) = N(0, I),  p(x|z) = Bernoulli(σ(g(z))) or N(σ(g(z)), σ_x²)

  Attributes:
    latent_dim: K, the size of z.
    hidden_sizes: widths of the encoder's hidden layers (the decoder's, reversed).
    activation: φ of the hidden layers.
    decoder: 'bernoulli' (logits) or 'gaussian'.
    decoder_scale: the Gaussian decoder's learned log σ_x²: one per pixel
      ('per_pixel') or one for all ('global'); initialised to 0.
    image_shape: the shape of one input.
    dtype: the compute dtype; parameters and the returned distributions are float32.

  Parameters: `encoder_layers_i`, `posterior_mean`, `posterior_log_var`,
  `decoder_layers_i` (the last gives the D outputs) and, Gaussian, `decoder_log_var`.
  """
  latent_dim: int = 16
  hidden_sizes: Sequence[int] = (256,)
  activation: str = 'relu'
  decoder: str = 'bernoulli'
  decoder_scale: str = 'per_pixel'
  image_shape: Sequence[int] = (28, 28, 1)
  dtype: Any = jnp.float32

  @property
  def rng_streams(self) -> tuple[str, ...]:
    """The stream of the samples ε."""
    return ('latent',)

  def setup(self):
    _check_common('VAE', self)
    if self.decoder not in DECODERS:
      raise ValueError(f'VAE decoder={self.decoder!r}; allowed: {", ".join(DECODERS)}.')
    if self.decoder_scale not in DECODER_SCALES:
      raise ValueError(f'VAE decoder_scale={self.decoder_scale!r}; allowed: '
                       f'{", ".join(DECODER_SCALES)}.')
    self.encoder_layers = [nn.Dense(w, dtype=self.dtype) for w in self.hidden_sizes]
    self.posterior_mean = nn.Dense(self.latent_dim, dtype=self.dtype)
    self.posterior_log_var = nn.Dense(self.latent_dim, dtype=self.dtype)
    self.decoder_layers = [nn.Dense(w, dtype=self.dtype) for w in tuple(
        reversed(self.hidden_sizes)) + (math.prod(self.image_shape),)]
    if self.decoder == 'gaussian':
      shape = tuple(self.image_shape) if self.decoder_scale == 'per_pixel' else ()
      self.decoder_log_var = self.param('decoder_log_var', nn.initializers.zeros, shape,
                                        jnp.float32)

  def encode(self, x, *, train: bool = False) -> tuple[jax.Array, jax.Array]:
    """(μ, log σ²) of q(z|x), each [B, K] float32."""
    del train
    _check_input('VAE', self, x)
    phi = activations.get(self.activation)
    h = _flatten(x)
    for layer in self.encoder_layers:
      h = phi(layer(h))
    return (self.posterior_mean(h).astype(jnp.float32),
            self.posterior_log_var(h).astype(jnp.float32))

  def decode(self, z_xK, *, train: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """(mean, log σ²) of p(x|z) for z [..., K]: Bernoulli logits and None, or the Gaussian
    mean in [0, 1] and its log-variance, each [..., *image_shape] float32."""
    del train
    _check_code('VAE', self, z_xK)
    phi = activations.get(self.activation)
    y = z_xK
    for layer in self.decoder_layers[:-1]:
      y = phi(layer(y))
    out = self.decoder_layers[-1](y).astype(jnp.float32)
    out = out.reshape(z_xK.shape[:-1] + tuple(self.image_shape))
    if self.decoder == 'bernoulli':
      return out, None
    return jax.nn.sigmoid(out), jnp.broadcast_to(self.decoder_log_var, out.shape)

  def __call__(self, x, *, train: bool = False, num_samples: int = 1) -> VAEOutput:
    """q(z|x), `num_samples` reparameterised samples z per image and p(x|z) of each."""
    if not isinstance(num_samples, int) or num_samples < 1:
      raise ValueError(f'VAE num_samples must be a positive integer, got {num_samples!r}.')
    mean_BxK, log_var_BxK = self.encode(x, train=train)
    eps_SxBxK = jax.random.normal(self.make_rng('latent'), (num_samples,) + mean_BxK.shape)
    z_SxBxK = mean_BxK + jnp.exp(0.5 * log_var_BxK) * eps_SxBxK
    decoder_mean, decoder_log_var = self.decode(z_SxBxK, train=train)
    return VAEOutput(mean_BxK, log_var_BxK, z_SxBxK, decoder_mean, decoder_log_var)

  def sample(self, num: int, rng: jax.Array, *, mean: bool = True,
             train: bool = False) -> jax.Array:
    """`num` images [num, *image_shape] in [0, 1] from the model: z ~ p(z), then the mean of
    p(x|z) (`mean`), or a draw x ~ p(x|z) (Bernoulli: binary; Gaussian: not clipped)."""
    if not isinstance(num, numbers.Integral) or isinstance(num, bool) or num < 0:
      raise ValueError(f'VAE sample num must be an integer >= 0, got {num!r}.')
    z_key, x_key = jax.random.split(rng)
    z_NxK = jax.random.normal(z_key, (num, self.latent_dim))
    out, log_var = self.decode(z_NxK, train=train)
    if self.decoder == 'bernoulli':
      probs = jax.nn.sigmoid(out)
      return probs if mean else jax.random.bernoulli(x_key, probs).astype(jnp.float32)
    if mean:
      return out
    return out + jnp.exp(0.5 * log_var) * jax.random.normal(x_key, out.shape)
