r"""MLP classifier on MNIST-1D (4,000 train / 1,000 test sequences of length 40).

The data set is generated offline by the `mnist1d` package's published generator.
Published MLP test accuracy: 68% (Greydanus, "Scaling down deep learning", 2020),
with the recipe used here: hidden layers of 100 and 100 ReLU units, Adam (AdamW
without weight decay) at a constant learning rate of 1e-2, batch 100, 6,000 steps.

  python -m experiments.main --config=experiments/configs/mnist1d_mlp.py --workdir=workdirs/mnist1d_mlp
"""

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'mnist1d'
  config.task.input_key = 'x'
  config.model.features = (100, 100, 10)
  config.model.activation = 'relu'
  config.optimizer.learning_rate = 1e-2
  config.optimizer.weight_decay = 0.0
  config.optimizer.schedule = 'constant'
  config.global_batch_size = 100
  config.eval_batch_size = 200
  config.num_train_steps = 6000
  config.log_every_steps = 500
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 1000
  return config
