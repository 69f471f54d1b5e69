"""The README's commands name scripts, flags and config fields that exist.

Every command in README.md that runs one of the project's scripts (`python -m MODULE` or
`python PATH.py`, inline or in an indented block) is read, not run: the script must exist,
each `--flag` must be one the script defines, `--config=FILE` must exist, and every
`--config.a.b=…` override and `--sweep=a.b:…` field must be a field of that config (or
`model.KEY` or `task.KEY` an option of the model or task the command trains, which the
entry point adds). A renamed flag or config field then fails here instead of in a
reader's terminal.
"""

import importlib.util
import os
import re

import pytest

from experiments import command_line
from tests.subprocess_util import REPO_ROOT

ABSL_FLAGS = {'help', 'helpfull'}  # Defined by absl for every script.


def readme_commands() -> list[str]:
  """Each script command of the README, its lines joined, inline spans and blocks alike."""
  with open(os.path.join(REPO_ROOT, 'README.md')) as f:
    text = f.read()
  # Indented blocks: a line ending in a backslash continues on the next.
  blocks = re.sub(r'\\\n\s*', ' ', '\n'.join(line for line in text.splitlines()
                                             if line.startswith('    ')))
  pieces = blocks.splitlines() + re.findall(r'`([^`]+)`', text)
  return [' '.join(p.split()) for p in pieces
          if re.search(r'python\S* (-m (experiments|benchmarks)\.|(experiments|benchmarks)/)', p)]


def script_and_arguments(command: str) -> tuple[str, str]:
  match = re.search(r'python\S* (?:-m ((?:experiments|benchmarks)\.\S+)|'
                    r'((?:experiments|benchmarks)/\S+\.py))(.*)', command)
  path = match.group(1).replace('.', '/') + '.py' if match.group(1) else match.group(2)
  return path, match.group(3)


_DEFINED = r"DEFINE_\w+\(\s*['\"](\w+)['\"]"


def defined_flags(path: str) -> set[str]:
  """The flags `path` defines, and those that the project's modules it imports define when
  imported, at their top level (benchmarks/free_parts.py takes train_step.py's --config and
  --steps; a flag a module defines inside a function is defined only if that runs)."""
  with open(os.path.join(REPO_ROOT, path)) as f:
    text = f.read()
  names = set(re.findall(_DEFINED, text)) | ABSL_FLAGS
  for package, module in re.findall(r'^from (benchmarks|experiments) import (\w+)$', text, re.M):
    imported = os.path.join(REPO_ROOT, package, f'{module}.py')
    if os.path.exists(imported):
      with open(imported) as f:
        names |= set(re.findall(r'^\S[^\n]*' + _DEFINED, f.read(), re.M))
  return names


def load_config(path: str):
  spec = importlib.util.spec_from_file_location('readme_config', os.path.join(REPO_ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def has_field(config, dotted: str) -> bool:
  for name in dotted.split('.'):
    if not hasattr(config, 'keys') or name not in config:
      return False
    config = config[name]
  return True


def is_unlisted_option(config, dotted: str, values: dict[str, str]) -> bool:
  """Whether `dotted` is model.KEY or task.KEY with KEY an option of the model or task the
  command trains (`--config.model.name` or the config's): the entry point adds such an
  option when the config leaves it at its default."""
  block, _, key = dotted.partition('.')
  if block not in ('model', 'task') or '.' in key or block not in config:
    return False
  name = values.get(f'config.{block}.name') or config[block].get('name')
  return key in command_line._options(block, name)  # pylint: disable=protected-access


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_this_test_reads():
  # The parser itself: it must find the quick start, a multi-line block and a line-broken
  # inline span, or a change to the README's layout would leave commands unchecked.
  assert len(COMMANDS) > 60
  assert any('--config.optimizer.nesterov=True' in c and '--config.num_train_steps=3000' in c
             for c in COMMANDS)
  assert any('recompute_batch_stats' in c and '--max_passes' in c for c in COMMANDS)


@pytest.mark.parametrize('command', COMMANDS)
def test_readme_command_names_what_exists(command):
  path, arguments = script_and_arguments(command)
  assert os.path.exists(os.path.join(REPO_ROOT, path)), f'{path} in {command!r}'
  flags = re.findall(r'--([\w.]+)(?:=(\S*))?', arguments)
  unknown = [name for name, _ in flags if name.split('.')[0] not in defined_flags(path)]
  assert not unknown, f'{path} defines no flag {unknown} in {command!r}'
  values = dict(flags)
  config_file = values.get('config', '').strip(']')
  fields = [name.split('.', 1)[1] for name, _ in flags if name.startswith('config.')]
  if 'sweep' in values:
    fields.append(values['sweep'].split(':')[0])
  if config_file.endswith('.py') and 'NAME' not in config_file:
    assert os.path.exists(os.path.join(REPO_ROOT, config_file)), command
    config = load_config(config_file)
    missing = [field for field in fields
               if not has_field(config, field) and not is_unlisted_option(config, field, values)]
    assert not missing, f'{config_file} has no field {missing} in {command!r}'
  else:  # No config, or a placeholder for any config (NAME.py, …): nothing to look up.
    assert not config_file or 'NAME' in config_file or '…' in config_file, command
