r"""Associative recall: which attention kinds retrieve a far token (trained at 64, read at 2,048).

Data: `associative_recall` (data/builders/associative_recall.py): 16 key–value pair tokens
scattered among filler tokens, then 16 queries, each a key followed by its value; the
predictions at the query keys are the only scored targets, so `accuracy` is the recall
accuracy (chance 1/8).

Model: a GPT (models/transformer/gpt.py) of 2 pre-LN layers, width 64, 2 heads, no position
embedding, no dropout; `model.attention` picks the attention kind and nothing else changes
between runs. Recall is a lookup by content, and without positions the trained model reads
any length, so each kind trains at context 64 (pairs at most 63 tokens back; 1,500 steps of
32 examples) and is then evaluated at 256 and 2,048, where a pair sits up to 2,047 tokens
before its query (mean about 1,040):

  python -m experiments.main --config=experiments/configs/recall_gpt.py \
      --workdir=workdirs/recall_gpt_exact --config.model.attention=exact
  python -m experiments.evaluate --workdir=workdirs/recall_gpt_exact \
      --set=data.options.length=2048 --set=model.max_length=2048

and likewise with attention linear, performer, local, strided and fixed
(workdirs/recall_gpt_<kind>); chunked computes what exact does. The sparse kinds' blocks of
128 hold the whole training context, so they train as exact attention does and differ only
in what they can reach at 2,048.
"""

import ml_collections

from experiments.configs import default

LENGTH = 64


def get_config():
  config = default.get_config()
  config.data.name = 'associative_recall'
  config.data.options = ml_collections.ConfigDict({'length': LENGTH})
  # The records are the windows and the data set brings its vocabulary (data/text.py).
  config.data.tokenizer = 'dataset'
  config.data.eval_split = 'validation'
  config.task = ml_collections.ConfigDict({'name': 'language_model', 'sample_length': 0})
  config.model = ml_collections.ConfigDict({
      'name': 'gpt', 'num_layers': 2, 'features': 64, 'num_heads': 2, 'mlp_dim': 256,
      'max_length': config.data.options.get_ref('length'), 'positions': 'none',
      'attention': 'exact', 'attention_options': (), 'dropout_rate': 0.0, 'pre_norm': True,
      'tie_embeddings': True, 'use_bias': True, 'dtype': 'float32'})
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 0.01
  config.optimizer.weight_decay_mask = 'kernels'
  config.optimizer.warmup_steps = 20
  config.optimizer.grad_clip_norm = 1.0
  config.global_batch_size = 32
  config.eval_batch_size = 20
  config.num_train_steps = 1500
  config.log_every_steps = 100
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
