"""What a run reads: the train and eval sources a config's `data` block names.

`make_sources(data_config, workdir) -> (train_source, eval_source, meta)`:
record data sets (images, vectors) come back as random-access splits, held in
memory as stacked arrays when `in_memory`; text data sets named with a
`tokenizer` come back as token windows (`data.text`); series data sets named
with a `series_window` come back as forecasting windows (`data.series`). `meta`
describes the data for the task and the model: its `features` (and one record's
`shapes`), `num_classes`
when the label has them, or the tokenizer, vocabulary and text unit, or the
series' scaler and unit; `meta['model_defaults']` holds model options the data
determines (`vocab_size`, `num_classes`, `horizon`).
"""

import numpy as np

from data import datasets
from data import pipeline


def make_sources(data_config, workdir: str):
  """(train source, eval source, meta) of `data_config`; one-sentence errors for bad values."""
  if data_config.get('tokenizer'):
    from data import text  # pylint: disable=g-import-not-at-top
    train_source, eval_source, meta = text.make_sources(data_config, workdir)
    meta = {**meta, 'model_defaults': {'vocab_size': meta['vocab_size']}}
  elif data_config.get('series_window') is not None:
    from data import series  # pylint: disable=g-import-not-at-top
    train_source, eval_source, meta = series.make_sources(data_config, workdir)
  else:
    options = dict(data_config.get('options', {}))
    def load(split):
      return datasets.load(data_config.name, split, data_dir=data_config.get('data_dir'), **options)
    train_source, eval_source = load(data_config.train_split), load(data_config.eval_split)
    if data_config.get('in_memory', True):
      train_source = pipeline.InMemorySource(train_source)
      eval_source = pipeline.InMemorySource(eval_source)
    meta = {}
    features = datasets.info(data_config.name, data_dir=data_config.get('data_dir'),
                             **options).features
    label = features['label'] if 'label' in features else None
    if getattr(label, 'num_classes', None):
      meta['num_classes'] = label.num_classes
      meta['model_defaults'] = {'num_classes': label.num_classes}
  first = pipeline.read_batch(train_source, np.zeros(1, np.int64))
  meta.setdefault('features', tuple(sorted(first)))
  # One record's shape per feature, e.g. for a generative task's samples.
  meta.setdefault('shapes', {name: tuple(np.shape(value)[1:]) for name, value in first.items()})
  return train_source, eval_source, meta
