"""models/registry.py: names select the architectures they say, and options reach the module as
given, filled from the data where left out, in a hashable form."""

import dataclasses

import jax.numpy as jnp
import pytest

from models import registry


@pytest.mark.parametrize('name', ['resnet18', 'resnet34', 'resnet50', 'resnet20', 'resnet32',
                                  'resnet44', 'resnet56', 'resnet110'])
def test_each_resnet_name_builds_the_depth_it_names(name):
  """He et al. 2016: a stem convolution, 2 (basic) or 3 (bottleneck) weighted layers per block,
  and the classifier: depth = layers_per_block · Σ stage_sizes + 2."""
  model = registry.build(name, num_classes=10)
  layers_per_block = {'basic': 2, 'bottleneck': 3}[model.block]
  assert layers_per_block * sum(model.stage_sizes) + 2 == int(name[len('resnet'):])
  assert model.block == ('bottleneck' if name == 'resnet50' else 'basic')


def test_sequences_become_tuples_so_the_module_hashes():
  # A config read back from JSON holds lists; jit's static arguments must hash.
  model = registry.build('resnet20', num_classes=10, stage_sizes=[1, 1], stage_widths=[4, 8])
  assert model.stage_sizes == (1, 1) and model.stage_widths == (4, 8)
  hash(model)


def test_data_defaults_fill_options_left_out_or_none_and_are_checked_where_given():
  data = {'vocab_size': 60, 'num_classes': 3}  # rnn_lm has no num_classes: not passed
  assert registry.build('rnn_lm', data_defaults=data, features=8).vocab_size == 60
  assert registry.build('rnn_lm', data_defaults=data, features=8, vocab_size=None).vocab_size == 60
  assert registry.build('rnn_lm', data_defaults=data, features=8, vocab_size=60).vocab_size == 60
  with pytest.raises(ValueError, match=r"^config\.model\.vocab_size=61 does not match the data, "
                                       r"whose vocab_size is 60; leave it out"):
    registry.build('rnn_lm', data_defaults=data, features=8, vocab_size=61)


def test_the_batch_norm_axis_name_reaches_models_that_take_one():
  assert registry.build('resnet20', 'batch', num_classes=10).batch_norm_axis_name == 'batch'
  assert registry.build('mlp', 'batch', features=(4,)).batch_norm_axis_name == 'batch'


def test_flax_s_own_fields_are_not_options():
  with pytest.raises(ValueError, match=r"^Model 'mlp' has no option 'parent'; allowed: "):
    registry.build('mlp', features=(4,), parent=None)


def test_a_dtype_left_as_none_keeps_the_module_default_and_a_misspelt_one_is_one_sentence():
  default = {f.name: f.default for f in dataclasses.fields(registry.MODELS['mlp'])}['dtype']
  assert registry.build('mlp', features=(4,), dtype=None).dtype is None
  assert registry.build('mlp', features=(4,)).dtype is default
  assert registry.build('mlp', features=(4,), dtype='float32').dtype == jnp.float32
  with pytest.raises(ValueError, match=r"^config\.model\.dtype='bf16' is not a compute dtype; "
                                       r'allowed: float32, bfloat16\.$'):
    registry.build('mlp', features=(4,), dtype='bf16')
