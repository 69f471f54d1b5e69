"""Models by name, so configs (not code edits) select the architecture."""

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp

from models.generative import autoencoders
from models.generative.time_mlp import TimeMLP
from models.generative.unet import UNet
from models.mlp import MLP
from models.sequence.causal_conv import CausalConvLM
from models.sequence import rnn_models
from models.sequence import forecasting
from models.transformer.bert import BERT
from models.transformer.encoder_decoder import TransformerSeq2Seq
from models.transformer.gpt import GPT
from models.vision import resnet
from models.vision.alexnet import AlexNet
from models.vision.cnn1d import CNN1D
from models.vision.lenet import LeNet5
from models.vision.vit import ViT

MODELS: dict[str, type[nn.Module]] = {
    'mlp': MLP, 'causal_conv_lm': CausalConvLM,
    'cnn1d': CNN1D, 'lenet5': LeNet5, 'alexnet': AlexNet,
    'resnet18': resnet.ResNet18, 'resnet34': resnet.ResNet34, 'resnet50': resnet.ResNet50,
    'resnet20': resnet.ResNet20, 'resnet32': resnet.ResNet32, 'resnet44': resnet.ResNet44,
    'resnet56': resnet.ResNet56, 'resnet110': resnet.ResNet110,
    'rnn_classifier': rnn_models.RNNClassifier, 'rnn_tagger': rnn_models.RNNTagger,
    'rnn_lm': rnn_models.RNNLanguageModel, 'seq2seq': rnn_models.Seq2Seq,
    'vector_to_sequence': rnn_models.VectorToSequence,
    'causal_conv_pooled': forecasting.PooledConvForecaster,
    'causal_conv_shifted': forecasting.ShiftedConvForecaster,
    'gpt': GPT,
    'transformer_seq2seq': TransformerSeq2Seq,
    'bert': BERT,
    'vit': ViT,
    'autoencoder': autoencoders.Autoencoder,
    'denoising_autoencoder': autoencoders.DenoisingAutoencoder,
    'sparse_autoencoder': autoencoders.SparseAutoencoder,
    'contractive_autoencoder': autoencoders.ContractiveAutoencoder,
    'vae': autoencoders.VAE,
    'unet': UNet,
    'time_mlp': TimeMLP,
}

# Compute dtypes a config may name; parameters stay float32. Not float16: its gradients need
# loss scaling, which the train step does not do, and XLA:CPU has no float16 products with
# float32 accumulation.
DTYPES = ('float32', 'bfloat16')


def build(name: str, batch_norm_axis_name: str | None = None,
          data_defaults: Mapping[str, Any] | None = None, **options) -> nn.Module:
  """Builds model `name` with `options`.

  The train library passes the batch-norm axis name, and `data_defaults`: options
  the data determines (e.g. `vocab_size` from the tokenizer), used where the
  config leaves them out and checked where it gives them.
  """
  if name not in MODELS:
    raise ValueError(f'Unknown model {name!r}; allowed: {", ".join(sorted(MODELS))}.')
  cls = MODELS[name]
  fields = {f.name for f in dataclasses.fields(cls)} - {'parent', 'name'}
  unknown = sorted(set(options) - fields)
  if unknown:
    raise ValueError(f'Model {name!r} has no option {unknown[0]!r}; allowed: {", ".join(sorted(fields))}.')
  # Sequences become tuples (a config read back from JSON holds lists) and mappings sorted
  # (key, value) pairs, so that the module is hashable, e.g. as a static argument of `jit`.
  options = {key: _as_tuples(value) for key, value in options.items()}
  for key, value in (data_defaults or {}).items():
    if key not in fields:
      continue
    if options.get(key) is None:
      options[key] = value
    elif options[key] != value:
      raise ValueError(f'config.model.{key}={options[key]!r} does not match the data, whose '
                       f'{key} is {value!r}; leave it out to take the data\'s.')
  num_classes = (data_defaults or {}).get('num_classes')
  features = options.get('features')
  # (A features that is no tuple is left to the MLP's own sentence.)
  if (cls is MLP and num_classes is not None and isinstance(features, tuple) and features
      and features[-1] != num_classes):
    # The MLP has no num_classes option: its last width is the number of logits.
    raise ValueError(f'config.model.features={features!r} ends in {features[-1]!r}, the number of '
                     f'logits, but the data has {num_classes} classes; make its last entry '
                     f'{num_classes}.')
  if options.get('dtype') is not None:
    options['dtype'] = compute_dtype(options['dtype'])
  if 'batch_norm_axis_name' in fields:
    options['batch_norm_axis_name'] = batch_norm_axis_name
  return cls(**options)


def compute_dtype(value) -> jnp.dtype:
  """`value` ('bfloat16', jnp.bfloat16, ...) as a dtype, if it is one of `DTYPES`."""
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or dtype.name not in DTYPES:
    raise ValueError(f'config.model.dtype={value!r} is not a compute dtype; allowed: '
                     f'{", ".join(DTYPES)}.')
  return dtype


def _as_tuples(value):
  if isinstance(value, (list, tuple)):
    return tuple(_as_tuples(v) for v in value)
  if isinstance(value, Mapping) or hasattr(value, 'to_dict'):  # a dict or a ConfigDict
    return tuple(sorted((key, _as_tuples(v)) for key, v in dict(value).items()))
  return value
