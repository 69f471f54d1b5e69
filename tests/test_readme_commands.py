"""The README's commands name scripts, flags and config fields that exist.

Every command in README.md that runs one of the project's scripts (`python -m MODULE` or
`python PATH.py`, inline or in an indented block) is read, not run: the script must exist,
each `--flag` must be one the script defines, `--config=FILE` must exist, and every
`--config.a.b=…` override and `--sweep=a.b:…` field must be a field of that config (or
`model.KEY` or `task.KEY` an option of the model or task the command trains, which the
entry point adds). A renamed flag or config field then fails here instead of in a
reader's terminal.

So are the pieces of commands the README gives apart from a whole one: a table row's
"same with `--config.…`" is checked against the command of the row it refers to (its own, or
the last one above it in that table), and a flag quoted in prose must be a config field, a
model's or task's option, or a flag one of the scripts defines. The models table must name
every registered model, and every experiment config under the model it trains; the tasks
table must give each task's options; links, anchors and repository paths must exist.
"""

import functools
import glob
import importlib.util
import os
import re

import pytest

from experiments import command_line
from models import registry
from tests.subprocess_util import REPO_ROOT
from train import tasks

ABSL_FLAGS = {'help', 'helpfull'}  # Defined by absl for every script.


def readme_text() -> str:
  with open(os.path.join(REPO_ROOT, 'README.md')) as f:
    return f.read()


# A script command: `python -m experiments.X …`, `python benchmarks/X.py …`, or a script's path
# with its flags and no interpreter (`benchmarks/train_step.py --config=…`).
_COMMAND = (r'python\S* (-m (experiments|benchmarks)\.|(experiments|benchmarks)/)'
            r'|^(experiments|benchmarks)/\S+\.py --')


def readme_commands() -> list[str]:
  """Each script command of the README, its lines joined, inline spans and blocks alike."""
  text = readme_text()
  # Indented blocks: a line ending in a backslash continues on the next.
  blocks = re.sub(r'\\\n\s*', ' ', '\n'.join(line for line in text.splitlines()
                                             if line.startswith('    ')))
  pieces = blocks.splitlines() + re.findall(r'`([^`]+)`', text)
  return [' '.join(p.split()) for p in pieces if re.search(_COMMAND, p.strip())]


def script_and_arguments(command: str) -> tuple[str, str]:
  match = re.search(r'python\S* (?:-m ((?:experiments|benchmarks)\.\S+)|'
                    r'((?:experiments|benchmarks)/\S+\.py))(.*)', command)
  if match is None:  # a script's path without the interpreter
    match = re.match(r'()((?:experiments|benchmarks)/\S+\.py)(.*)', command.strip())
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


def check_command(command: str) -> None:
  """Asserts that `command` names a script, flags of it and fields of its config that exist."""
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


@pytest.mark.parametrize('command', COMMANDS)
def test_readme_command_names_what_exists(command):
  check_command(command)


def is_fragment(span: str) -> bool:
  """Flags quoted without their script (`--config.seed=1 --workdir=…`), not XLA's own."""
  span = span.strip().lstrip('"')
  return span.startswith('--') and not span.startswith('--xla_')


def table_fragments() -> tuple[list[tuple[str, str]], list[str]]:
  """((the command a table row's fragment extends, the fragment), ...) and the fragments with no
  command to extend. A fragment after "same with" or "the … row's command with" extends the last
  command of the rows above it in the same table; any other fragment of a row, the row's first
  command (or, in a row without one, the last above). A fragment outside tables, or in a table
  with no command above it, has none."""
  extended, alone = [], []
  last = None  # the last command of the table's rows read so far
  prose = []  # the lines since the last table row (a quoted span may run over two)
  for line in readme_text().splitlines() + ['|']:
    if not line.startswith('|'):
      last = None
      prose.append(line)
      continue
    alone += [' '.join(span.split()) for span in re.findall(r'`([^`]+)`', '\n'.join(prose))
              if is_fragment(span)]
    prose = []
    spans = [(match.start(), ' '.join(match.group(1).split()))
             for match in re.finditer(r'`([^`]+)`', line)]
    commands = [span for _, span in spans if re.search(_COMMAND, span)]
    for start, span in spans:
      if not is_fragment(span):
        continue
      refers_above = re.search(r"(same|command) with $", line[:start])
      command = last if refers_above or not commands else commands[0]
      if command is None:
        alone.append(span)
      else:
        extended.append((command, span))
    if commands:
      last = commands[0]
  return extended, alone


EXTENDED, ALONE = table_fragments()


def test_the_readme_has_the_fragments_this_test_reads():
  assert len(EXTENDED) > 20 and len(ALONE) > 10
  assert any('fashion_mnist_vit.py' in command and '--config.model.mlp_dim=128' in fragment
             for command, fragment in EXTENDED)
  assert any('mixture_score_sde.py' in command and fragment == '--config.task.sde=vp'
             for command, fragment in EXTENDED)


@pytest.mark.parametrize('command,fragment', EXTENDED)
def test_readme_row_fragment_names_what_its_command_has(command, fragment):
  # The fragment's flags replace the command's own of the same name.
  check_command(f'{command} {fragment}')


@functools.cache
def _every_script_flag() -> frozenset[str]:
  names = set()
  for path in glob.glob(os.path.join(REPO_ROOT, 'experiments', '*.py')) + glob.glob(
      os.path.join(REPO_ROOT, 'benchmarks', '*.py')):
    names |= defined_flags(os.path.relpath(path, REPO_ROOT))
  return frozenset(names)


@functools.cache
def _experiment_configs() -> dict:
  paths = sorted(glob.glob(os.path.join(REPO_ROOT, 'experiments', 'configs', '*.py')))
  return {os.path.basename(path): load_config(os.path.relpath(path, REPO_ROOT))
          for path in paths if os.path.basename(path) != '__init__.py'}


@pytest.mark.parametrize('fragment', ALONE)
def test_readme_quoted_flag_exists_somewhere(fragment):
  flags = re.findall(r'--([\w.]+)', fragment)
  unknown = [name for name in flags if not name.startswith('config.')
             and name not in _every_script_flag()]
  assert not unknown, f'no script defines the flags {unknown} of {fragment!r}'
  for name in flags:
    if not name.startswith('config.') or name == 'config.KEY':
      continue
    field = name.split('.', 1)[1]
    block, _, key = field.partition('.')
    options = (registry.MODELS if block == 'model' else tasks.TASKS if block == 'task' else {})
    assert (any(has_field(config, field) for config in _experiment_configs().values())
            or any(key in command_line._options(block, kind)  # pylint: disable=protected-access
                   for kind in options)), f'no config has the field {field!r} of {fragment!r}'


def section(title: str) -> str:
  """The README's text from the heading `title` to the next heading."""
  text = readme_text()
  start = text.index(f'\n{title}\n')
  following = re.search(r'^#', text[start + len(title) + 2:], re.M)
  return text[start:start + len(title) + 2 + (following.start() if following else len(text))]


def table_rows(text: str, header: str) -> list[list[str]]:
  """The cells of each body row of the table of `text` whose header starts with `header`."""
  lines = text[text.index(f'\n{header}'):].splitlines()[1:]
  lines = lines[:next((i for i, line in enumerate(lines) if not line.startswith('|')), len(lines))]
  return [[cell.strip() for cell in line.strip('|').split(' | ')] for line in lines[2:]]


def model_rows() -> list[tuple[list[str], list[str], list[str]]]:
  """(models, cells, configs) of each row of the README's models table; `a` … `b` names every
  registered model from a to b."""
  order = list(registry.MODELS)
  rows = []
  for cells in table_rows(section('## Models'), '| name |'):
    names = re.findall(r'`(\w+)`', cells[0])
    if '…' in cells[0]:
      names = order[order.index(names[0]):order.index(names[-1]) + 1]
    rows.append((names, cells, re.findall(r'`(\w+\.py)`', cells[3])))
  return rows


def test_models_table_names_every_registered_model_once():
  named = [name for names, _, _ in model_rows() for name in names]
  assert sorted(named) == sorted(registry.MODELS), (
      f'missing {sorted(set(registry.MODELS) - set(named))}, '
      f'not registered {sorted(set(named) - set(registry.MODELS))}')
  for names, cells, _ in model_rows():
    assert len(cells) == 5 and all(cells), (names, cells)  # what, paper, config, result


def test_models_table_lists_every_config_under_the_model_it_trains():
  listed = {}
  for names, _, configs in model_rows():
    for config in configs:
      listed.setdefault(config, set()).update(names)
  for filename, config in _experiment_configs().items():
    if filename == 'default.py':
      continue
    assert config.model.name in listed.get(filename, ()), (
        f'{filename} trains {config.model.name!r}; the models table lists it under '
        f'{sorted(listed.get(filename, ()))}')
  unknown = sorted(set(listed) - set(_experiment_configs()))
  assert not unknown, f'the models table lists configs that do not exist: {unknown}'


def test_tasks_table_gives_each_task_its_options():
  rows = {cells[0].strip('`'): cells
          for cells in table_rows(section('## Tasks: one contract for every model family'),
                                  '| task |')}
  assert sorted(rows) == sorted(tasks.TASKS)
  for name, cells in rows.items():
    options = set(command_line._options('task', name))  # pylint: disable=protected-access
    assert set(re.findall(r'`(\w+)`', cells[2])) == options, (name, sorted(options))


def test_readme_links_and_paths_exist():
  text = readme_text()
  slugs = {re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
           for heading in re.findall(r'^#+ (.+)$', text, re.M)}
  for target in re.findall(r'\]\(([^)\s]+)\)', text):
    if target.startswith('#'):
      assert target[1:] in slugs, f'no heading for the link {target!r}'
    else:
      assert os.path.exists(os.path.join(REPO_ROOT, target)), f'the link {target!r}'
  top = '|'.join(re.escape(name) for name in os.listdir(REPO_ROOT)
                 if os.path.isdir(os.path.join(REPO_ROOT, name)) and not name.startswith('.'))
  for span in re.findall(r'`([^`]+)`', text):
    for path in re.findall(rf'(?<![\w/.$-])(?:{top})/[\w./-]*', span):
      if re.search(r'NAME|KIND|PATH', path) or path.startswith('workdirs/'):
        continue  # a placeholder, or a run's output
      assert os.path.exists(os.path.join(REPO_ROOT, path.rstrip('.'))), f'{path!r} in {span!r}'
  for notebook in re.findall(r'`(\w+\.ipynb)`', text):
    assert os.path.exists(os.path.join(REPO_ROOT, 'notebooks', notebook)), notebook
