r"""LSTM classifier on MNIST-1D (4,000 train / 1,000 test sequences of length 40).

Published GRU test accuracy: 91% (Greydanus, "Scaling down deep learning", 2020).
Here: one LSTM layer of 128 units (Hochreiter & Schmidhuber 1997; models/sequence/rnn.py) reads
the 40 values one per step and its final state feeds a linear classifier; Adam
(AdamW without weight decay) at 3e-3 with cosine decay, gradients clipped to
global norm 1, batch 100, 6,000 steps: the recipe of mnist1d_gru.py.

  python -m experiments.main --config=experiments/configs/mnist1d_lstm.py --workdir=workdirs/mnist1d_lstm
"""

from experiments.configs import mnist1d_gru


def get_config():
  config = mnist1d_gru.get_config()
  config.model.cell = 'lstm'
  return config
