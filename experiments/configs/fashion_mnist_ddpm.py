r"""DDPM on Fashion-MNIST (Ho et al. 2020): ε-prediction with a small U-Net, EMA weights.

Linear β from 1e-4 to 0.02 over T = 1,000 steps; pixels scaled to [−1, 1]; a U-Net of base
width 32 (28 → 14 → 7, widths 32/64/64, one residual block per level, self-attention at
7 × 7; models/generative/unet.py); Adam 2e-4 with warmup, gradients clipped to norm 1, an EMA
of the parameters with decay 0.999 for evaluation and sampling (Ho et al. use 0.9999 over
800k steps). After each evaluation 16 samples with 100 respaced steps (Nichol & Dhariwal
2021) are written to the run's samples.

  python -m experiments.main --config=experiments/configs/fashion_mnist_ddpm.py \
      --workdir=workdirs/fashion_mnist_ddpm

The same network trains the other objectives of train/tasks/diffusion.py, e.g. the VP score
SDE (Song et al. 2021; time in [0, 1] scaled by 1,000 for the embedding):

  python -m experiments.main --config=experiments/configs/fashion_mnist_ddpm.py \
      --workdir=workdirs/fashion_mnist_score_sde --config.task.objective=score_sde \
      --config.model.time_scale=1000.0 --config.task.sample_steps=500
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'fashion_mnist'
  config.task = ml_collections.ConfigDict({
      'name': 'diffusion', 'objective': 'ddpm', 'input_key': 'image', 'num_steps': 1000,
      'num_samples': 16, 'sample_steps': 100})
  config.model = ml_collections.ConfigDict({
      'name': 'unet', 'channels': 32, 'channel_mults': (1, 2, 2), 'num_res_blocks': 1,
      'attention_resolutions': (7,), 'dropout_rate': 0.1, 'num_groups': 8, 'time_scale': 1.0,
      'dtype': 'float32'})
  config.optimizer.learning_rate = 2e-4
  config.optimizer.weight_decay = 0.0
  config.optimizer.warmup_steps = 200
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.final_lr_fraction = 0.1
  config.ema_decay = 0.999
  config.global_batch_size = 64
  config.eval_batch_size = 500
  config.num_train_steps = 3000
  config.log_every_steps = 100
  config.eval_every_steps = 1500
  config.checkpoint_every_steps = 500
  return config
