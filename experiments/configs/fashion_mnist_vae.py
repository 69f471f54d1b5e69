r"""Variational autoencoder on Fashion-MNIST (Kingma & Welling 2014), with its IWAE bound.

An MLP encoder (784 → 512 → 256 → μ, log σ² of 16 latents) and decoder, a Gaussian decoder
with a learned variance per pixel on uniformly dequantised pixels ((pixel + u) / 256), so the
negative ELBO and the importance-weighted bound (Burda et al. 2016, K = 50 at evaluation) are
bounds on a density, reported in nats and in bits per dimension (8-bit pixels). Adam 1e-3,
batch 128, 30 epochs.

  python -m experiments.main --config=experiments/configs/fashion_mnist_vae.py \
      --workdir=workdirs/fashion_mnist_vae

`--config.model.latent_dim=2` gives the 2-D latent space of the latent map.
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'fashion_mnist'
  config.task = ml_collections.ConfigDict({
      'name': 'vae', 'input_key': 'image', 'dequantize': True, 'iwae_samples': 50})
  config.model = ml_collections.ConfigDict({
      'name': 'vae', 'latent_dim': 16, 'hidden_sizes': (512, 256), 'decoder': 'gaussian',
      'decoder_scale': 'per_pixel', 'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.0
  config.optimizer.warmup_steps = 200
  config.optimizer.grad_clip_norm = 100.0
  config.global_batch_size = 128
  config.eval_batch_size = 500
  config.num_train_steps = 14_070  # 30 epochs of 60,000 images
  config.log_every_steps = 500
  config.eval_every_steps = 4690
  config.checkpoint_every_steps = 4690
  return config
