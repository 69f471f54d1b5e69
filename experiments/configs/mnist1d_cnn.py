r"""1-D CNN classifier on MNIST-1D (4,000 train / 1,000 test sequences of length 40).

The convolutional baseline of Greydanus 2020 ("Scaling down deep learning"):
three strided convolutions of 25 channels and a linear classifier (published test
accuracy 94%), trained like this repository's MNIST-1D MLP: Adam (AdamW without
weight decay) at a constant learning rate of 1e-2, batch 100, 6,000 steps.

  python -m experiments.main --config=experiments/configs/mnist1d_cnn.py --workdir=workdirs/mnist1d_cnn
"""

import ml_collections

from experiments.configs import mnist1d_mlp


def get_config():
  config = mnist1d_mlp.get_config()
  config.model = ml_collections.ConfigDict({'name': 'cnn1d', 'num_classes': 10,
                                            'dtype': 'float32'})
  return config
