r"""Cold diffusion on Fashion-MNIST (Bansal et al. 2022): a U-Net restores blurred images.

The degradation is a Gaussian blur (σ = 1 per step) applied t times, t ≤ T = 50; the U-Net
of fashion_mnist_ddpm.py predicts x_0 from D(x_0, t) and is trained on the ℓ1 error.
Sampling (Algorithm 2, models/generative/cold.py) starts from a fully blurred image.

  python -m experiments.main --config=experiments/configs/fashion_mnist_cold.py \
      --workdir=workdirs/fashion_mnist_cold

`--config.task.degradation=mask` hides the pixels in a fixed random order instead.
"""

from experiments.configs import fashion_mnist_ddpm


def get_config():
  config = fashion_mnist_ddpm.get_config()
  config.task.update({'objective': 'cold', 'num_steps': 50, 'degradation': 'blur',
                      'blur_sigma': 1.0, 'num_samples': 0, 'sample_steps': 0})
  return config
