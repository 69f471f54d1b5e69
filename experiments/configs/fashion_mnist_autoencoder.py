r"""Regularised autoencoders on Fashion-MNIST: denoising, sparse and contractive.

One sigmoid hidden layer of 256 units between the 784 pixels and a decoder to per-pixel
Bernoulli logits (the setting of the three papers); the variant is the model and the task's
penalty or corruption:

  * denoising (Vincent et al. 2008): each pixel zeroed with probability 0.3, the clean image
    the target;
  * sparse (KL(ρ ‖ ρ̂) with ρ = 0.05 on the batch-mean code, weight 1);
  * contractive (Rifai et al. 2011): λ ‖J_f(x)‖²_F with λ = 0.1.

  python -m experiments.main --config=experiments/configs/fashion_mnist_autoencoder.py \
      --workdir=workdirs/fashion_mnist_denoising_autoencoder
  python -m experiments.main --config=experiments/configs/fashion_mnist_autoencoder.py \
      --workdir=workdirs/fashion_mnist_sparse_autoencoder \
      --config.model.name=sparse_autoencoder --config.task.corruption=none \
      --config.task.noise_level=0.0 --config.task.sparsity_weight=1.0
  python -m experiments.main --config=experiments/configs/fashion_mnist_autoencoder.py \
      --workdir=workdirs/fashion_mnist_contractive_autoencoder \
      --config.model.name=contractive_autoencoder --config.task.corruption=none \
      --config.task.noise_level=0.0 --config.task.contraction_weight=0.1

Adam 1e-3, batch 128, 20 epochs.
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'fashion_mnist'
  config.task = ml_collections.ConfigDict({
      'name': 'autoencoder', 'input_key': 'image', 'input_scale': 1 / 255,
      'reconstruction': 'bernoulli', 'corruption': 'masking', 'noise_level': 0.3,
      'sparsity_target': 0.05, 'sparsity_weight': 0.0, 'contraction_weight': 0.0})
  config.model = ml_collections.ConfigDict({
      'name': 'denoising_autoencoder', 'latent_dim': 256, 'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.0
  config.global_batch_size = 128
  config.eval_batch_size = 500
  config.num_train_steps = 9380  # 20 epochs
  config.log_every_steps = 500
  config.eval_every_steps = 4690
  config.checkpoint_every_steps = 4690
  return config
