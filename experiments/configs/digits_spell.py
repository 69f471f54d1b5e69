r"""One-to-many: spell the digit an 8×8 image shows ('seven') with a GRU decoder.

Data: scikit-learn's digits (1,437 train / 360 test images). The image, as one
64-vector scaled to [0, 1], sets the decoder's initial state h_0 = tanh(W v + b);
the decoder then writes the digit's English name one character at a time
(teacher forcing in training, greedy decoding in evaluation: `exact_match` is
the share of test images whose name comes out exactly).

  python -m experiments.main --config=experiments/configs/digits_spell.py --workdir=workdirs/digits_spell
"""

import ml_collections

from experiments.configs import default

NAMES = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine')


def get_config():
  config = default.get_config()
  config.data.name = 'digits'
  config.task = ml_collections.ConfigDict({
      'name': 'seq2seq', 'source_key': 'image', 'source_length_key': '',
      'source_scale': 1 / 16, 'target_key': 'label', 'target_length_key': '',
      'target_names': NAMES, 'max_target_length': 5})
  config.model = ml_collections.ConfigDict({
      'name': 'vector_to_sequence', 'vocab_size': 128, 'cell': 'gru', 'features': 64,
      'num_layers': 1, 'embed_dim': 16, 'dropout_rate': 0.0, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.optimizer.schedule = 'cosine'
  config.global_batch_size = 64
  config.eval_batch_size = 360
  config.num_train_steps = 1000
  config.log_every_steps = 250
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
