r"""Discrete diffusion (D3PM, Austin et al. 2021) on binarised Fashion-MNIST.

Pixels are binarised at 128; the absorbing-state process (β_t = 1/(T − t + 1), T = 1,000)
masks them one by one, and the U-Net of fashion_mnist_ddpm.py, fed the three categories
(off, on, mask) as one-hot channels, predicts the logits of x_0, trained on the hybrid loss
L_vb + 0.01 · cross-entropy (eq. 5). 16 samples with all 1,000 steps after each evaluation.

  python -m experiments.main --config=experiments/configs/fashion_mnist_d3pm.py \
      --workdir=workdirs/fashion_mnist_d3pm

`--config.task.transition=uniform --config.model.out_channels=2` uses the uniform transition
matrices instead (two categories, off and on: no mask).
"""

from experiments.configs import fashion_mnist_ddpm


def get_config():
  config = fashion_mnist_ddpm.get_config()
  config.task.update({'objective': 'd3pm', 'transition': 'absorbing', 'num_steps': 1000,
                      'num_samples': 16, 'sample_steps': 0})
  config.model.out_channels = 3
  return config
