r"""MLP classifier on scikit-learn's handwritten digits (8x8, 10 classes).

The default experiment: needs no network and trains in well under a minute on a CPU.

  python -m experiments.main --config=experiments/configs/digits_mlp.py --workdir=workdirs/digits_mlp
"""

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'digits'
  config.task.input_scale = 1 / 16  # pixel values are 0..16
  config.model.features = (256, 256, 10)
  config.model.activation = 'relu'
  config.model.dropout_rate = 0.2
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.global_batch_size = 64
  config.eval_batch_size = 128
  config.num_train_steps = 2000
  config.log_every_steps = 200
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
