r"""MLP classifier on Fashion-MNIST (28x28 grayscale, 10 classes), any activation.

Hidden widths 512-256-256-128, the network of the UvA deep learning course's
tutorial 3 ("Activation functions"), trained the same way for every activation:
SGD with momentum 0.9, learning rate 1e-2, batch 256. The activation is a config
value, so one command per activation compares them:

  python -m experiments.main --config=experiments/configs/fashion_mnist_mlp.py \
      --workdir=/tmp/fashion_mnist_mlp_relu --config.model.activation=relu

(sigmoid, tanh, relu, leaky_relu, elu, gelu, ...: see `models.activations`).
The IDX files are read from $FASHION_MNIST_DIR (see `data/builders/fashion_mnist.py`).
"""

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'fashion_mnist'
  config.task.input_key = 'image'
  config.task.input_scale = 1 / 255  # pixel values are 0..255
  config.model.features = (512, 256, 256, 128, 10)
  config.model.activation = 'relu'
  config.optimizer.name = 'momentum'
  config.optimizer.learning_rate = 1e-2
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 0.0
  config.optimizer.schedule = 'constant'
  config.global_batch_size = 256
  config.eval_batch_size = 1000
  config.num_train_steps = 11_720  # 50 epochs of the 60,000 training images
  config.log_every_steps = 500
  config.eval_every_steps = 2344  # every 10 epochs
  config.checkpoint_every_steps = 2344
  return config
