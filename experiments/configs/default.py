"""Defaults shared by every experiment config; each config overrides what it needs.

Not a runnable experiment by itself (it names no data set).
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  # Every model takes a compute dtype ('float32', 'bfloat16'); parameters stay float32.
  config.model = ml_collections.ConfigDict({'name': 'mlp', 'dtype': 'float32'})
  # The objective (train/tasks/): preprocessing, random streams, loss, metrics.
  config.task = ml_collections.ConfigDict()
  config.task.name = 'classification'
  config.task.input_key = 'image'
  config.task.input_scale = 1.0
  # Per-channel normalisation (input - mean) / std after augmentation, one value
  # per channel, e.g. the training set's statistics; () for none.
  config.task.input_mean = ()
  config.task.input_std = ()
  config.task.label_smoothing = 0.0
  # Augmentation stages applied to each train batch on the device, e.g.
  # ({'name': 'random_crop', 'padding': 2}, {'name': 'mixup', 'alpha': 0.2});
  # see data/augment.py for every transform and its parameters.
  config.task.augment = ()

  config.data = ml_collections.ConfigDict()
  config.data.name = config_dict.placeholder(str)
  config.data.train_split = 'train'
  config.data.eval_split = 'test'
  # Hold each split in memory as stacked arrays (for data sets that fit).
  config.data.in_memory = True
  # Threads reading and prefetching train batches (default: 0 in memory, else 2).
  config.data.num_threads = config_dict.placeholder(int)
  # Where prepared data sets are cached (default: $JAXLAB_DATA_DIR or ~/tensorflow_datasets).
  config.data.data_dir = config_dict.placeholder(str)
  # Passed to data.load: e.g. source_dir for fashion_mnist, builder arguments for TFDS.
  config.data.options = ml_collections.ConfigDict()
  # Text data sets become token windows when a tokenizer is named (data/text.py):
  # 'char' or 'byte_bpe' (with vocab_size), trained on the train split and kept
  # in the work directory; windows of `window` tokens of the record's `text_key`.
  config.data.tokenizer = config_dict.placeholder(str)
  config.data.vocab_size = config_dict.placeholder(int)
  config.data.window = config_dict.placeholder(int)
  config.data.text_key = 'text'

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 1e-3
  config.optimizer.momentum = 0.9
  config.optimizer.nesterov = False
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-8
  config.optimizer.weight_decay = 1e-4
  config.optimizer.weight_decay_mask = 'all'  # or 'kernels': no decay on biases and norms
  config.optimizer.grad_clip_norm = 0.0
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = 0
  config.optimizer.final_lr_fraction = 0.0
  config.optimizer.boundaries = (0.5, 0.75)
  config.optimizer.decay_factor = 0.1

  # mode: 'jit' (data parallel), 'fsdp', 'shard_map', 'pmap' or 'tensor' (Megatron-style
  # tensor parallelism: jit on a ('data', 'model') mesh of (devices / model_parallelism) x
  # model_parallelism devices; each parameter, its optimiser state and its EMA are split by
  # the logical axis names its module declares, through logical_axis_rules; see
  # train/parallel.py).
  config.parallel = ml_collections.ConfigDict()
  config.parallel.mode = 'jit'
  config.parallel.num_devices = config_dict.placeholder(int)  # all devices
  config.parallel.fsdp_min_size = 1024
  # 'tensor' only: the size of the 'model' axis; it must divide the devices and every split
  # dimension (the number of heads, the MLP width), else setup stops with one sentence.
  config.parallel.model_parallelism = 1
  # 'tensor' only: ((logical axis, 'data' | 'model' | None), ...); None: Megatron's
  # (('batch', 'data'), ('heads', 'model'), ('mlp', 'model')) with embed, kv, length and
  # vocab replicated (train/parallel.py MEGATRON_RULES).
  config.parallel.logical_axis_rules = config_dict.placeholder(tuple)

  # Exponential moving average of the parameters, used for evaluation and
  # sampling when > 0 (e.g. 0.999); the decay after n updates is
  # min(ema_decay, (1 + n)/(10 + n)) (train/step.py ema_decay_at).
  config.ema_decay = 0.0
  # Micro-batches per step: gradients are summed over them before one update.
  config.grad_accum_steps = 1

  # Steps whose loss, gradients or update are not finite are skipped (the state
  # is left as it was); this many in a row stop the run.
  config.max_bad_steps = 10
  # (first, end): record a jax.profiler trace of these steps in WORKDIR/profile.
  config.profile_steps = ()

  config.global_batch_size = 128
  config.eval_batch_size = 256
  config.num_train_steps = 1000
  config.log_every_steps = 100
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  config.checkpoints_to_keep = 3
  return config
