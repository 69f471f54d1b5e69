r"""LSTM classifier on MNIST-1D (4,000 train / 1,000 test sequences of length 40).

Published GRU test accuracy: 91% (Greydanus, "Scaling down deep learning", 2020).
Here: one LSTM layer of 128 units (Hochreiter & Schmidhuber 1997; models/sequence/rnn.py) reads
the 40 values one per step and its final state feeds a linear classifier; Adam
(AdamW without weight decay) at 3e-3 with cosine decay, gradients clipped to
global norm 1, batch 100, 6,000 steps: the recipe of mnist1d_gru.py.

  python -m experiments.main --config=experiments/configs/mnist1d_lstm.py --workdir=workdirs/mnist1d_lstm
"""

import ml_collections

from experiments.configs import mnist1d_mlp


def get_config():
  config = mnist1d_mlp.get_config()
  config.model = ml_collections.ConfigDict({
      'name': 'rnn_classifier', 'num_classes': 10, 'cell': 'lstm', 'features': 128,
      'num_layers': 1, 'bidirectional': False, 'readout': 'last', 'dropout_rate': 0.0,
      'unroll': 1, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = 'cosine'
  config.optimizer.grad_clip_norm = 1.0
  return config
