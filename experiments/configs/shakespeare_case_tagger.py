r"""Per-character tagging (many-to-many, aligned): restore the capitals of lower-cased Shakespeare.

Data: the project's `shakespeare_case` data set (data/builders/shakespeare_case.py:
each line of Tiny Shakespeare, lower-cased, with a tag per character saying
whether it was upper case). A bidirectional LSTM of 128 units per direction
(Graves & Schmidhuber 2005) tags every character; reported are the per-character
accuracy and the F1 score of the upper-case tag (a tagger that never
capitalises has accuracy 0.908 on validation and F1 = 0).

  python -m experiments.main --config=experiments/configs/shakespeare_case_tagger.py \
      --workdir=workdirs/shakespeare_case_tagger
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'shakespeare_case'
  config.data.train_split = 'train'
  config.data.eval_split = 'validation'
  config.task = ml_collections.ConfigDict({
      'name': 'tagging', 'input_key': 'input', 'tag_key': 'tags', 'length_key': 'length',
      'positive_tag': 1})
  config.model = ml_collections.ConfigDict({
      'name': 'rnn_tagger', 'num_tags': 2, 'vocab_size': 128, 'embed_dim': 32, 'cell': 'lstm',
      'features': 128, 'num_layers': 1, 'bidirectional': True, 'dropout_rate': 0.1,
      'unroll': 1, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.optimizer.schedule = 'cosine'
  config.optimizer.grad_clip_norm = 1.0
  config.global_batch_size = 64
  config.eval_batch_size = 256
  config.num_train_steps = 1500
  config.log_every_steps = 250
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
