r"""LeNet-5 (LeCun et al. 1998) on Fashion-MNIST.

The 28×28 images are padded by 2 pixels to the paper's 32×32 input; ReLU
activations (the paper's squashing tanh is `--config.model.activation=tanh`);
inputs normalised by the training set's mean and standard deviation; AdamW,
learning rate 2e-3 with warm-up and cosine decay, batch 128, 15 epochs.

  python -m experiments.main --config=experiments/configs/fashion_mnist_lenet5.py \
      --workdir=workdirs/fashion_mnist_lenet5

The IDX files are read from $FASHION_MNIST_DIR (see `data/builders/fashion_mnist.py`).
"""

import ml_collections

from experiments.configs import default
from experiments.configs import fashion_mnist_resnet


def get_config():
  config = fashion_mnist_resnet.set_normalised_images(default.get_config())
  config.model = ml_collections.ConfigDict({'name': 'lenet5', 'activation': 'relu', 'padding': 2,
                                            'dtype': 'float32'})
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 2e-3
  config.optimizer.weight_decay = 1e-4
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = fashion_mnist_resnet.STEPS_PER_EPOCH
  config.global_batch_size = 128
  config.eval_batch_size = 1000
  config.num_train_steps = 15 * fashion_mnist_resnet.STEPS_PER_EPOCH
  config.log_every_steps = 500
  config.eval_every_steps = 5 * fashion_mnist_resnet.STEPS_PER_EPOCH
  config.checkpoint_every_steps = 5 * fashion_mnist_resnet.STEPS_PER_EPOCH
  return config
