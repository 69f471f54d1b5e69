"""Autoencoder objectives (denoising, sparse, contractive) and the VAE's ELBO and IWAE bound.

'autoencoder' — `model(x̃) → (logits with x's shape, code h [B, K])`
(`models/generative/autoencoders.py`), x the image scaled to [0, 1]:

  loss(x) = R(x, σ(logits(x̃))) + β Σ_j KL(ρ ‖ ρ̂_j) + λ ‖J_f(x̃)‖²_F

  R: Bernoulli cross-entropy −Σ_i [x_i log x̂_i + (1 − x_i) log(1 − x̂_i)], or the squared
     error Σ_i (x̂_i − x_i)², summed over the pixels of one example.
  x̃: x itself, or in training a corruption of it from the task's own 'corruption' stream
     (Vincent et al. 2008): 'gaussian' x + ν·N(0, I), or 'masking', each pixel set to 0
     independently with probability ν (the paper zeroes a fixed fraction ν of them; the
     expected fraction is the same). The clean x stays the target.
  sparsity (Ng 2011, "Sparse autoencoder"; Lee et al. 2008): KL(ρ ‖ ρ̂) =
     ρ log(ρ/ρ̂) + (1 − ρ) log((1 − ρ)/(1 − ρ̂)), ρ̂_j = the mean of code unit j over the
     GLOBAL batch: under shard_map/pmap the per-device sums and counts are psum'd over the
     device axis, so every device computes the same scalar and every parallel mode gives
     the same loss and gradients. The scalar is added to each example's loss, so the
     batch mean of the loss is the mean reconstruction plus the penalty. With gradient
     accumulation each micro-batch uses its own ρ̂ (as batch norm does); an evaluation
     batch uses its real (`mask` = 1) examples.
  contraction (Rifai et al. 2011): for a one-layer sigmoid encoder h = σ(W x + b),
     ‖J_f(x)‖²_F = Σ_j (h_j (1 − h_j))² Σ_i W_ji², from the parameters, J never formed.

  Metrics (nats or squared error per example): 'loss', 'reconstruction', 'mean_code' (the
  mean code activation), and 'sparsity_penalty' β Σ_j KL(ρ ‖ ρ̂_j) and 'contraction_penalty'
  λ ‖J_f‖²_F when their weight is positive.

'vae' — `model(x, num_samples=S) → VAEOutput` (Kingma & Welling 2014):

  ELBO(x) = E_q[log p(x|z)] − KL(q(z|x) ‖ N(0, I))    (§2.2; the KL analytic, Appendix B)

  estimated with one z in training and with the K = `iwae_samples` samples of the
  evaluation (their mean log p(x|z)). Evaluation also reports the importance-weighted
  bound (Burda et al. 2016), with w_k = p(x|z_k) p(z_k) / q(z_k|x), z_k ~ q(z|x):

  IWAE_K(x) = log (1/K) Σ_k w_k,   ELBO ≤ E IWAE_K ≤ E IWAE_{K+1} ≤ log p(x)  (Theorem 1)

  Inputs are pixels/255, or with `dequantize` (pixels + u)/256, u ~ U[0, 1) from the
  'dequantize' stream (`models.generative.likelihood`), in training and evaluation; a
  Gaussian decoder on dequantised data then also reports bits per dimension of −ELBO and
  −IWAE (upper bounds on the 8-bit data's, Theis et al. 2016).

  Metrics (nats per example): 'loss' = −ELBO, 'elbo', 'kl', 'reconstruction' = −E log p(x|z);
  in evaluation also 'iwae', and 'elbo_bits_per_dim', 'iwae_bits_per_dim'.
"""

import dataclasses
import inspect
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from models.generative import autoencoders
from models.generative import likelihood
from train.tasks import base

RECONSTRUCTIONS = ('bernoulli', 'squared_error')
CORRUPTIONS = ('none', 'gaussian', 'masking')
# ρ̂ is clipped this far inside (0, 1) so that a saturated code unit gives a finite KL.
_RHO_HAT_MARGIN = 1e-6


def _check_image_key(task) -> None:
  features = task.meta.get('features')
  if features is not None and task.input_key not in features:
    raise ValueError(f'task.input_key={task.input_key!r} is not a feature of the data set; its '
                     f'features are: {", ".join(sorted(features))}.')


def _model_name(model) -> str:
  return type(getattr(model, 'module', model)).__name__


def _sum_per_example(x) -> jax.Array:
  """Σ over every axis after the first."""
  return jnp.sum(x.reshape(x.shape[0], -1), axis=-1)


def global_mean(h_BxK, weights_B, axis_name: str | None) -> jax.Array:
  """Σ_b w_b h_bK / Σ_b w_b over the global batch: per-device sums psum'd over `axis_name`."""
  sums = (jnp.einsum('b,bk->k', weights_B, h_BxK), jnp.sum(weights_B))
  if axis_name is not None:
    sums = jax.lax.psum(sums, axis_name)
  total_K, count = sums
  return total_K / jnp.maximum(count, 1.0)


def bernoulli_kl(rho, rho_hat):
  """KL(Bernoulli(ρ) ‖ Bernoulli(ρ̂)) = ρ log(ρ/ρ̂) + (1 − ρ) log((1 − ρ)/(1 − ρ̂)), elementwise."""
  rho_hat = jnp.clip(rho_hat, _RHO_HAT_MARGIN, 1 - _RHO_HAT_MARGIN)
  return rho * jnp.log(rho / rho_hat) + (1 - rho) * jnp.log((1 - rho) / (1 - rho_hat))


@dataclasses.dataclass(frozen=True)
class Autoencoding(base.Task):
  """Reconstruction of [0, 1] images plus optional corruption, sparsity and contraction.

  Options:
    input_key: the record feature holding the images.
    input_scale: the model's x is `float32(record) * input_scale` (1/255: [0, 1]).
    reconstruction: 'bernoulli' (cross-entropy on intensities) or 'squared_error'.
    corruption: 'none', 'gaussian' or 'masking' (training batches only).
    noise_level: ν, the Gaussian noise's standard deviation or the masking probability.
    sparsity_target: ρ in (0, 1), the target mean activation of each code unit.
    sparsity_weight: β ≥ 0 (0: no sparsity penalty).
    contraction_weight: λ ≥ 0 (0: no contraction penalty).
  """
  rng_streams = ('dropout', 'corruption')

  input_key: str = 'image'
  input_scale: float = 1 / 255
  reconstruction: str = 'bernoulli'
  corruption: str = 'none'
  noise_level: float = 0.0
  sparsity_target: float = 0.05
  sparsity_weight: float = 0.0
  contraction_weight: float = 0.0

  def validate(self):
    _check_image_key(self)
    if self.reconstruction not in RECONSTRUCTIONS:
      raise ValueError(f'task.reconstruction={self.reconstruction!r}; allowed: '
                       f'{", ".join(RECONSTRUCTIONS)}.')
    if self.corruption not in CORRUPTIONS:
      raise ValueError(f'task.corruption={self.corruption!r}; allowed: {", ".join(CORRUPTIONS)}.')
    nu = self.noise_level
    if self.corruption == 'masking' and not (isinstance(nu, (int, float)) and 0 < nu < 1):
      raise ValueError(f'task.noise_level is the masking probability and must lie in (0, 1), '
                       f'got {nu!r}.')
    if self.corruption == 'gaussian' and not (isinstance(nu, (int, float)) and nu > 0):
      raise ValueError(f'task.noise_level is the Gaussian noise\'s standard deviation and must '
                       f'be positive, got {nu!r}.')
    if self.corruption == 'none' and nu:
      raise ValueError(f'task.noise_level={nu!r} needs a task.corruption (gaussian or masking).')
    rho = self.sparsity_target
    if not (isinstance(rho, (int, float)) and 0 < rho < 1):
      raise ValueError(f'task.sparsity_target must lie in (0, 1), got {rho!r}.')
    for option in ('sparsity_weight', 'contraction_weight'):
      value = getattr(self, option)
      if not (isinstance(value, numbers.Real) and 0 <= value < math.inf):
        raise ValueError(f'task.{option} must be a finite non-negative number, got {value!r}.')
    base.check_input_scale(self.input_scale)

  def preprocess(self, records):
    return {'input': np.asarray(records[self.input_key], np.float32) * np.float32(self.input_scale)}

  def model_inputs(self, batch):
    return (batch['input'],)

  def transform(self, rngs, batch, train):
    """'target' = the clean image; 'input' = its corruption in training, itself otherwise."""
    x = batch['input']
    batch = {**batch, 'target': x}
    if not train or self.corruption == 'none':
      return batch
    key = rngs['corruption']
    if self.corruption == 'gaussian':
      noisy = x + self.noise_level * jax.random.normal(key, x.shape, x.dtype)
    else:
      noisy = jnp.where(jax.random.bernoulli(key, self.noise_level, x.shape), 0, x).astype(x.dtype)
    return {**batch, 'input': noisy}

  def loss(self, model, batch):
    out = model(*self.model_inputs(batch))
    if isinstance(out, autoencoders.VAEOutput) or not (isinstance(out, tuple) and len(out) == 2):
      raise ValueError(f"task.name='autoencoder' needs a model that returns (logits, code), as "
                       f'the autoencoder models do, but {_model_name(model)} does not; a VAE '
                       "trains with task.name='vae'.")
    logits, h_BxK = out
    logits, h_BxK = logits.astype(jnp.float32), h_BxK.astype(jnp.float32)
    target = batch.get('target', batch['input'])
    if self.reconstruction == 'bernoulli':
      reconstruction_B = -_sum_per_example(likelihood.bernoulli_log_prob(logits, target))
    else:
      reconstruction_B = _sum_per_example(jnp.square(jax.nn.sigmoid(logits) - target))
    loss_B = reconstruction_B
    metrics = {'reconstruction': base.mean_over(reconstruction_B),
               'mean_code': base.mean_over(jnp.mean(h_BxK, axis=-1))}
    ones_B = jnp.ones_like(reconstruction_B)
    if self.sparsity_weight > 0:
      self._check_model(model, 'sparsity_weight')
      weights_B = batch['mask'].astype(jnp.float32) if 'mask' in batch else ones_B
      rho_hat_K = global_mean(h_BxK, weights_B, getattr(model, 'axis_name', None))
      penalty = self.sparsity_weight * jnp.sum(bernoulli_kl(self.sparsity_target, rho_hat_K))
      loss_B = loss_B + penalty
      metrics['sparsity_penalty'] = base.mean_over(penalty * ones_B)
    if self.contraction_weight > 0:
      self._check_model(model, 'contraction_weight')
      kernel_DxK = model.params['encoder_0']['kernel']
      penalty_B = self.contraction_weight * autoencoders.sigmoid_encoder_jacobian_sq_norm(
          h_BxK, kernel_DxK)
      loss_B = loss_B + penalty_B
      metrics['contraction_penalty'] = base.mean_over(penalty_B)
    metrics['loss'] = base.mean_over(loss_B)
    return metrics

  @staticmethod
  def _check_model(model, option: str) -> None:
    module = getattr(model, 'module', None)
    name = type(module).__name__
    if not isinstance(module, autoencoders.Autoencoder):
      raise ValueError(f'task.{option} needs an autoencoder model with a sigmoid code, got {name}.')
    if option == 'sparsity_weight' and module.code_activation != 'sigmoid':
      raise ValueError(f'task.sparsity_weight needs code units in (0, 1), but model {name} has '
                       f'code_activation={module.code_activation!r}; use \'sigmoid\'.')
    if option == 'contraction_weight' and not module.has_one_sigmoid_layer_encoder:
      raise ValueError(f'task.contraction_weight needs a one-layer sigmoid encoder h = σ(W x + b), '
                       f'but model {name} has hidden_sizes={tuple(module.hidden_sizes)} and '
                       f'code_activation={module.code_activation!r}; use hidden_sizes=() and '
                       '\'sigmoid\' (the contractive_autoencoder preset).')


@dataclasses.dataclass(frozen=True)
class VariationalAutoencoding(base.Task):
  """−ELBO in training; ELBO, KL, reconstruction, IWAE bound (and bits per dimension) in eval.

  Options:
    input_key: the record feature holding the 8-bit images.
    dequantize: inputs (pixels + u)/256 from the 'dequantize' stream; else pixels/255.
    iwae_samples: K, the samples per image of the evaluation's ELBO and IWAE bound.
  """
  rng_streams = ('dropout', 'latent', 'dequantize')

  input_key: str = 'image'
  dequantize: bool = False
  iwae_samples: int = 50

  def validate(self):
    _check_image_key(self)
    if not isinstance(self.dequantize, bool):
      raise ValueError(f'task.dequantize must be True or False, got {self.dequantize!r}.')
    k = self.iwae_samples
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
      raise ValueError(f'task.iwae_samples must be a positive integer, got {k!r}.')

  def preprocess(self, records):
    """The pixels as float32 (0 … 255); `transform` scales or dequantises them."""
    return {'input': np.asarray(records[self.input_key], np.float32)}

  def model_inputs(self, batch):
    return (batch['input'],)

  def transform(self, rngs, batch, train):
    del train  # evaluation scales (and dequantises) alike
    pixels = batch['input']
    if self.dequantize:
      return {**batch, 'input': likelihood.dequantize(rngs['dequantize'], pixels)}
    return {**batch, 'input': pixels / 255.0}

  def loss(self, model, batch):
    return self._metrics(model, batch, num_samples=1, bounds=False)

  def eval_metrics(self, model, batch):
    return self._metrics(model, batch, num_samples=self.iwae_samples, bounds=True)

  def _metrics(self, model, batch, *, num_samples: int, bounds: bool):
    x = batch['input']
    module = getattr(model, 'module', None)  # (a test may pass a plain callable)
    if module is not None and 'num_samples' not in inspect.signature(
        type(module).__call__).parameters:
      raise ValueError(f"task.name='vae' needs a VAE model (model.name='vae'), but "
                       f'{_model_name(model)} is not one; an autoencoder trains with '
                       "task.name='autoencoder'.")
    out = model(x, num_samples=num_samples)
    log_px_SxB = log_likelihood(out, x)
    kl_B = likelihood.kl_diag_gaussian_to_standard(out.posterior_mean, out.posterior_log_var)
    reconstruction_B = -jnp.mean(log_px_SxB, axis=0)
    elbo_B = -reconstruction_B - kl_B
    metrics = {'loss': base.mean_over(-elbo_B), 'elbo': base.mean_over(elbo_B),
               'kl': base.mean_over(kl_B), 'reconstruction': base.mean_over(reconstruction_B)}
    if not bounds:
      return metrics
    iwae_B = likelihood.log_mean_exp(log_importance_weights(out, log_px_SxB), axis=0)
    metrics['iwae'] = base.mean_over(iwae_B)
    if self.dequantize and out.decoder_log_var is not None:
      num_dims = math.prod(x.shape[1:])
      metrics['elbo_bits_per_dim'] = base.mean_over(likelihood.bits_per_dim(-elbo_B, num_dims))
      metrics['iwae_bits_per_dim'] = base.mean_over(likelihood.bits_per_dim(-iwae_B, num_dims))
    return metrics


def log_likelihood(out: autoencoders.VAEOutput, x) -> jax.Array:
  """log p(x|z_s) [S, B], summed over the pixels: Bernoulli (logits) or Gaussian."""
  if out.decoder_log_var is None:
    log_p = likelihood.bernoulli_log_prob(out.decoder_mean, x)
  else:
    log_p = likelihood.gaussian_log_prob(x, out.decoder_mean, out.decoder_log_var)
  num_samples, batch = log_p.shape[:2]
  return jnp.sum(log_p.reshape(num_samples, batch, -1), axis=-1)


def log_importance_weights(out: autoencoders.VAEOutput, log_px_SxB) -> jax.Array:
  """log w_s = log p(x|z_s) + log p(z_s) − log q(z_s|x), [S, B]."""
  log_prior_SxB = jnp.sum(likelihood.gaussian_log_prob(out.z, 0.0, 0.0), axis=-1)
  log_q_SxB = jnp.sum(likelihood.gaussian_log_prob(out.z, out.posterior_mean,
                                                   out.posterior_log_var), axis=-1)
  return log_px_SxB + log_prior_SxB - log_q_SxB
