r"""AlexNet (Krizhevsky et al. 2012), scaled for 28×28 images, on Fashion-MNIST.

`models/vision/alexnet.py` describes the scaling (3×3/1 first convolution,
'SAME' padding, one tower); here every width is also a quarter of that
network's (`width_multiplier=0.25`: convolutions of 16, 48, 96, 64 and 64
channels, dense layers of 256), so that an epoch takes about two minutes on two
CPU cores. Dropout 0.5 before the dense layers as in the paper; inputs
normalised by the training set's mean and standard deviation; AdamW, learning
rate 1e-3 with warm-up and cosine decay, batch 128, 3 epochs (the time this machine allowed).

  python -m experiments.main --config=experiments/configs/fashion_mnist_alexnet.py \
      --workdir=workdirs/fashion_mnist_alexnet

The IDX files are read from $FASHION_MNIST_DIR (see `data/builders/fashion_mnist.py`).
"""

import ml_collections

from experiments.configs import fashion_mnist_lenet5
from experiments.configs import fashion_mnist_resnet


def get_config():
  config = fashion_mnist_lenet5.get_config()
  config.model = ml_collections.ConfigDict({'name': 'alexnet', 'width_multiplier': 0.25,
                                            'dropout_rate': 0.5, 'dtype': 'float32'})
  config.optimizer.learning_rate = 1e-3
  config.num_train_steps = 3 * fashion_mnist_resnet.STEPS_PER_EPOCH
  config.eval_every_steps = fashion_mnist_resnet.STEPS_PER_EPOCH
  return config
