r"""Dates in many human formats → ISO 8601 with a GRU encoder–decoder, no attention.

Data: the project's `dates` data set (data/builders/dates.py: 18 formats such
as 'the 14th of july 1987', '7/14/87', 'Tue 14 Jul 1987'; 20,000 train and
2,000 test sources, none shared). Characters are tokens (their ASCII codes).
The encoder (one GRU layer of 128 units) reads the source and its final state
starts the decoder (Sutskever et al. 2014; Cho et al. 2014), which is trained
with teacher forcing and evaluated by greedy decoding: `exact_match` is the
share of test dates whose ten characters and EOS all come out right.
dates_seq2seq_attention.py adds attention over the encoder states.

  python -m experiments.main --config=experiments/configs/dates_seq2seq.py --workdir=workdirs/dates_seq2seq
"""

import ml_collections

from experiments.configs import default


def get_config():
  config = default.get_config()
  config.data.name = 'dates'
  config.data.train_split = 'train'
  config.data.eval_split = 'test'
  config.task = ml_collections.ConfigDict({
      'name': 'seq2seq', 'source_key': 'source', 'source_length_key': 'source_length',
      'target_key': 'target', 'target_length_key': 'target_length', 'max_target_length': 10})
  config.model = ml_collections.ConfigDict({
      'name': 'seq2seq', 'vocab_size': 128, 'cell': 'gru', 'features': 128, 'num_layers': 1,
      'embed_dim': 32, 'bidirectional_encoder': False, 'attention': 'none',
      'attention_features': 64, 'dropout_rate': 0.0, 'unroll': 1, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.0
  config.optimizer.schedule = 'cosine'
  config.optimizer.grad_clip_norm = 1.0
  config.global_batch_size = 128
  config.eval_batch_size = 500
  config.num_train_steps = 1200
  config.log_every_steps = 200
  config.eval_every_steps = 600
  config.checkpoint_every_steps = 600
  return config
