r"""CIFAR-style ResNet-20 on Fashion-MNIST with augmentation.

The CIFAR-10 network of He et al. 2016, §4.2 (3×3 stem of 16 channels, three
stages of 16/32/64 channels, here on 28×28/14×14/7×7 maps), trained
nearly the paper's way: SGD with Nesterov momentum 0.9 (the paper's momentum is
plain), L2 weight decay 5e-4 on the kernels, batch
128, random crops of the image padded by 2 pixels and horizontal flips, inputs
normalised by the training set's mean and standard deviation. The learning rate
warms up to 0.1 and decays by a cosine, for a number of epochs that fits the
time budget of this machine (see the README).

  python -m experiments.main --config=experiments/configs/fashion_mnist_resnet.py \
      --workdir=workdirs/fashion_mnist_resnet20

The IDX files are read from $FASHION_MNIST_DIR (see `data/builders/fashion_mnist.py`).
"""

import ml_collections

from experiments.configs import default

# Fashion-MNIST training images scaled to [0, 1]: mean and standard deviation of
# all 60,000 × 784 pixels.
FASHION_MNIST_MEAN = (0.2860,)
FASHION_MNIST_STD = (0.3530,)
STEPS_PER_EPOCH = 468  # 60,000 // 128


def set_normalised_images(config):
  """Reads Fashion-MNIST images scaled to [0, 1] and normalised by the training set's pixel
  mean and standard deviation (shared by the convolutional and ViT configs)."""
  config.data.name = 'fashion_mnist'
  config.task.input_key = 'image'
  config.task.input_scale = 1 / 255
  config.task.input_mean = FASHION_MNIST_MEAN
  config.task.input_std = FASHION_MNIST_STD
  return config


def get_config():
  config = set_normalised_images(default.get_config())
  config.task.augment = ({'name': 'random_crop', 'padding': 2}, {'name': 'horizontal_flip'})
  config.model = ml_collections.ConfigDict({'name': 'resnet20', 'num_classes': 10, 'dtype': 'float32'})
  config.optimizer.name = 'momentum'
  config.optimizer.learning_rate = 0.1
  config.optimizer.momentum = 0.9
  config.optimizer.nesterov = True
  config.optimizer.weight_decay = 5e-4
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = STEPS_PER_EPOCH
  config.global_batch_size = 128
  config.eval_batch_size = 1000
  config.num_train_steps = 12 * STEPS_PER_EPOCH
  config.log_every_steps = 100
  config.eval_every_steps = 4 * STEPS_PER_EPOCH
  config.checkpoint_every_steps = STEPS_PER_EPOCH
  return config
