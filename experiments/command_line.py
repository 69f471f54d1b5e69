"""The entry points' command line: config files loaded, flags parsed, every mistake one sentence.

`parse_flags` is absl's flag parsing for `app.run(main, flags_parser=...)`, with
`--help` exiting 0 and listing the experiment configs, models and tasks, and
every wrong input (a missing or broken config file, an unknown `--config.KEY`, a
value of the wrong type, a missing required flag) ending the process with one
`error: ...` line and exit status 1.
"""

import ast
import dataclasses
import difflib
import glob
import importlib.machinery
import importlib.util
import json
import os
import re
import sys

from absl import app
from absl import flags
import ml_collections
from ml_collections.config_flags import config_path

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs')
_DEFAULTS = 'experiments/configs/default.py'
_NOT_EXPERIMENTS = ('__init__.py', 'default.py')
_HELP_ARGS = ('-?', '-help', '--help', '-helpshort', '--helpshort', '-helpfull', '--helpfull')


class ConfigError(flags.Error):
  """A config file that cannot be loaded, in one sentence."""


class ConfigFileParser(flags.ArgumentParser):
  """Loads `path[:argument]` and returns its locked `get_config(argument)`, as config_flags'
  own parser does, but with every way a config file fails put in one sentence.

  config_flags defers a missing file to the first use of the config and lets a
  syntax error or get_config's own exception out as a traceback.
  """

  config = None  # the loaded config, kept to explain a bad override
  overrides: dict[str, str] = {}  # config path -> its argument, set by `parse_flags`

  def __init__(self, name: str):
    self.name = name

  def flag_type(self) -> str:
    return 'config object'

  def parse(self, path):
    filename, *arguments = path.split(':', 1)
    if not os.path.isfile(filename):
      raise ConfigError(f'The config file {filename!r} does not exist; the experiment configs '
                        f'are: {", ".join(_config_paths())}.')
    # Any file name, as config_flags allows: the loader does not go by the suffix.
    loader = importlib.machinery.SourceFileLoader(f'{self.name}_config', filename)
    spec = importlib.util.spec_from_file_location(loader.name, filename, loader=loader)
    try:
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
    except SyntaxError as e:
      raise ConfigError(f'The config file {filename!r} has a syntax error at line {e.lineno}: '
                        f'{e.msg}.') from None
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f'Importing the config file {filename!r} failed: {_one_line(e)}.') from None
    if not callable(getattr(module, 'get_config', None)):
      raise ConfigError(f'The config file {filename!r} defines no get_config().')
    try:
      config = module.get_config(*arguments)
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f'get_config() of {filename!r} failed: {_one_line(e)}.') from None
    if not isinstance(config, ml_collections.ConfigDict):
      raise ConfigError(f'get_config() of {filename!r} returned {type(config).__name__}, '
                        'not an ml_collections.ConfigDict.')
    _add_unlisted_options(config, self.overrides)
    config.lock()  # an override of any other key the config lacks is an error, not a new key
    self.config = config
    return config


def _add_unlisted_options(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> None:
  """Adds to config.task and config.model each option that an override sets, that the config
  leaves out (at its default) and that the task or model it names takes, with the override's
  value, so that config_flags can apply the override (e.g. --config.task.beta_end=0.01); a
  boolean option given without a value is added as True (--config.model.batch_norm) or False
  (--noconfig.model.batch_norm), as absl reads those forms."""
  for path, arg in overrides.items():
    block, _, key = path.partition('.')
    if (block not in ('task', 'model') or not re.fullmatch(r'\w+', key)
        or not isinstance(config.get(block), ml_collections.ConfigDict) or key in config[block]):
      continue
    name = overrides.get(f'{block}.name', '').partition('=')[2] or config[block].get('name')
    field = _options(block, name).get(key)
    if field is not None and '=' in arg:
      config[block][key] = _literal(arg.partition('=')[2])
    elif field is not None and (field.type in (bool, 'bool') or isinstance(field.default, bool)):
      config[block][key] = not arg.lstrip('-').startswith('no')


def _options(block: str, name) -> dict[str, dataclasses.Field]:
  """The options (name: dataclass field) of the task (block 'task') or model ('model') called
  `name`, else {}."""
  # pylint: disable=g-import-not-at-top
  if block == 'task':
    from train import tasks
    cls, builder_given = tasks.TASKS.get(name), ('meta',)
  else:
    from models import registry
    cls, builder_given = registry.MODELS.get(name), ('parent', 'name', 'batch_norm_axis_name')
  cls = getattr(cls, 'func', cls)  # a preset given as functools.partial
  if cls is None or not dataclasses.is_dataclass(cls):
    return {}
  return {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in builder_given}


def _literal(text: str):
  """A command-line value as the Python value config_flags will parse it as."""
  if text.lower() in ('true', 'false'):
    return text.lower() == 'true'
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def load_config_files_with(flag_name: str = 'config') -> None:
  """Makes the config-file flag `flag_name` (from `config_flags.DEFINE_config_file`) load its
  file with `ConfigFileParser`; config_flags still defines and applies the overrides."""
  flags.FLAGS[flag_name].parser = ConfigFileParser(flag_name)


def parse_flags(argv: list[str], *, doc: str, needs_workdir: bool = True,
                example: str = 'digits_mlp') -> list[str]:
  """absl's flag parsing, with `--help` exiting 0 and every wrong input one `error:` line;
  `--config` is required, and `--workdir` unless `needs_workdir` is False (a benchmark).
  `example` names the config (and work directory) a missing flag's sentence suggests."""
  before_separator = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  help_args = [arg for arg in before_separator if arg in _HELP_ARGS]
  if help_args:
    print(_help_text(doc, full='full' in help_args[0]))
    sys.exit(0)
  ConfigFileParser.overrides = _overrides(argv)
  repeated = _repeated_tuple_override(argv)
  if repeated:
    _exit_with(repeated)
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    # Parsing runs the config file's own code and config_flags' overrides:
    # whatever fails there, the person at the command line gets the sentence.
    _exit_with(_parse_error(e, argv))
  if len(rest) > 1:
    _exit_with(f'Unexpected arguments {" ".join(rest[1:])!r}: every option is a flag, '
               'e.g. --config.seed=1 (see --help).')
  if flags.FLAGS['config'].value is None:
    _exit_with(_missing('--config', 'the experiment config file, e.g. '
                        f'--config=experiments/configs/{example}.py'))
  if needs_workdir and not flags.FLAGS['workdir'].value:
    _exit_with(_missing('--workdir', 'the directory for checkpoints, logs and metrics, e.g. '
                        f'--workdir=workdirs/{example}'))
  return rest


def run(main, **kwargs) -> None:
  """`app.run(main, **kwargs)`, with a UsageError raised by `main` (a flag value refused
  after parsing) printed as its one `error:` line; absl prints the whole usage before it."""
  def main_with_one_line_errors(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      _exit_with(str(e))
  app.run(main_with_one_line_errors, **kwargs)


def integers_at_least(values: list[str], flag: str, least: int = 1, why: str = '') -> list[int]:
  """A list flag's `values` as integers of at least `least`, in order, or UsageError naming the
  flag and its values (`why`, if given, is said in brackets)."""
  try:
    numbers = [int(v) for v in values]
  except ValueError:
    numbers = []
  if not numbers or min(numbers) < least:
    allowed = 'positive integers' if least == 1 else f'integers of at least {least}'
    raise app.UsageError(f'--{flag}={",".join(values)} must be {allowed}'
                         + (f' ({why})' if why else '') + '.')
  return numbers


def output_file(path: str, flag: str, *, figure: bool = True) -> str:
  """`path`, given by `--flag`, checked as a file to write before any work is done, or
  UsageError: it must not be a folder, the nearest of its folders that exists must be a
  writable folder (the missing ones are made when the file is written) and, for a figure, it
  must end in a format matplotlib writes."""
  if os.path.isdir(path):
    raise app.UsageError(f'--{flag}={path} is a folder; give the file to write in it.')
  why = unwritable(path)
  if why:
    raise app.UsageError(f'--{flag}={path} cannot be written: {why}.')
  if figure:
    import matplotlib.figure  # pylint: disable=g-import-not-at-top
    formats = sorted(matplotlib.figure.Figure().canvas.get_supported_filetypes())
    suffix = os.path.splitext(path)[1].lstrip('.').lower()
    if suffix not in formats:
      raise app.UsageError(f'--{flag}={path} must end in a figure format: '
                           f'{", ".join("." + f for f in formats)}.')
  return path


def record_file(folder: str, name: str, role: str) -> str:
  """The absolute path of the file `name` in `folder` that a script `role`s (e.g. 'appends
  its record to'), checked before any work is done: a folder there, or a file or folder that
  cannot be written (`unwritable`), is a ValueError in one sentence, found before the work
  rather than after it."""
  path = os.path.join(os.path.abspath(folder), name)
  if os.path.isdir(path):
    raise ValueError(f'{path!r}, the file {role}, is a folder.')
  why = unwritable(path)
  if why:
    raise ValueError(f'{path!r}, the file {role}, cannot be written: {why}.')
  return path


def unwritable(path: str) -> str | None:
  """Why the file `path` (not a folder) cannot be written, or None if it can: a file there
  must be writable, and the nearest of its folders that exists must be a writable folder (the
  missing ones are made when the file is written)."""
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.access(path, os.W_OK):
    return f'permission denied on the file {path}'
  existing = os.path.dirname(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return f'{existing} is a file, not a folder'
  if not os.access(existing, os.W_OK | os.X_OK):
    return f'permission denied on the folder {existing}'
  return None


def append_record(path: str, record: dict) -> None:
  """Appends `record` to the JSON-lines file at `path` (made if missing) as one line, keys
  sorted. A last line left unended (a run stopped while writing it) is ended first, so the
  record starts a line of its own and every earlier line stays as it was."""
  with open(path, 'a+b') as f:
    f.seek(0, os.SEEK_END)
    unended = False
    if f.tell():
      f.seek(-1, os.SEEK_END)
      unended = f.read(1) != b'\n'
    f.write((('\n' if unended else '') + json.dumps(record, sort_keys=True) + '\n').encode('utf-8'))


def work_directory(path: str) -> str:
  """The absolute `path` of a work directory, checked before any work is done as a folder
  that can be written or created (train/loop.py: check_workdir), or UsageError in one
  sentence."""
  from train import loop  # pylint: disable=g-import-not-at-top
  try:
    return loop.check_workdir(path)
  except ValueError as e:
    raise app.UsageError(str(e)) from None


def _exit_with(sentence: str):
  sys.stderr.write(f'error: {sentence}\n')
  sys.exit(1)


def _missing(flag: str, what: str) -> str:
  return f'{flag} is missing; give {what}.'


def _parse_error(error: Exception, argv: list[str]) -> str:
  """One sentence saying which argument is wrong and what it may be."""
  if isinstance(error, ConfigError):
    return str(error)
  config = flags.FLAGS['config'].parser.config
  if config is None and not any(re.match(r'-{1,2}config(=|$)', arg) for arg in argv[1:]):
    return _missing('--config', 'the experiment config file before any --config.KEY override')
  overrides = _overrides(argv)
  if config is not None:
    for path, arg in overrides.items():
      unknown = _unknown_key(config, path, arg)
      if unknown:
        return unknown
  if isinstance(error, flags.UnrecognizedFlagError):
    known = [name for name in flags.FLAGS if not name.startswith('config.')]
    close = difflib.get_close_matches(error.flagname, known, n=1)
    hint = f'; did you mean --{close[0]}?' if close else ''
    return f'Unknown flag --{error.flagname}{hint} (see --help).'
  message = str(error)
  if isinstance(error, flags.IllegalFlagValueError) and config is not None:
    for path, arg in overrides.items():
      if message.startswith(f'flag --config.{path}='):
        kind = config_path.get_type(path, config).__name__
        return (f'{arg} is not a valid {kind}: config.{path} holds '
                f'{config_path.get_value(path, config)!r}.')
  return _one_line(message).removeprefix('flag ') + '.'


def _overrides(argv: list[str]) -> dict[str, str]:
  """Config path -> the argument setting it ('optimizer.name' -> '--config.optimizer.name=sgd')."""
  found = {}
  for arg in argv[1:]:
    match = re.match(r'-{1,2}(?:no)?config\.([^=]+)', arg)
    if match:
      found[match.group(1)] = arg
  return found


def _repeated_tuple_override(argv: list[str]) -> str | None:
  """The sentence for a config key given more than once with a tuple among its values, which
  config_flags would join into one tuple (--config.model.features=(32,10) and later =(16,10)
  train features (32, 10, 16, 10)), else None."""
  values = {}
  for arg in argv[1:argv.index('--')] if '--' in argv else argv[1:]:
    match = re.match(r'-{1,2}config\.([^=]+)=(.*)', arg, re.DOTALL)
    if match:
      values.setdefault(match.group(1), []).append(match.group(2))
  for path, given in values.items():
    if len(given) > 1 and any(isinstance(_literal(v), (tuple, list)) for v in given):
      return (f'--config.{path} is given {len(given)} times ({", ".join(given)}), and the values '
              f'of a tuple option given more than once are joined into one tuple; give it once.')
  return None


def _unknown_key(config: ml_collections.ConfigDict, path: str, arg: str) -> str | None:
  """The sentence for an override naming a key the config lacks, or None if it has it."""
  if '[' in path:  # item syntax (key['x']) is left to config_flags
    return None
  node, parents = config, []
  for name in path.split('.'):
    if isinstance(node, ml_collections.ConfigDict) and name in node:
      node, parents = node[name], parents + [name]
      continue
    parent = '.'.join(parents)
    flag = arg.split('=', 1)[0]
    if not isinstance(node, ml_collections.ConfigDict):
      return f'{flag}: config.{parent} is the value {node!r}, which has no keys such as {name!r}.'
    where = f'config.{parent}' if parent else 'the config'
    sentence = f'{flag}: {where} has no key {name!r}'
    if not node:
      return (f'{sentence}; it is empty, so set it whole, e.g. '
              f'--config.{parent}="{{\'{name}\': ...}}".')
    nearest = _nearest_keys(config, parents, name)
    if nearest:
      sentence += f' (nearest: {", ".join(nearest)})'
    if parents in (['task'], ['model']) and _options(parent, node.get('name')):
      kind = 'task' if parent == 'task' else 'model'
      rest = path.split('.')[len(parents) + 1:]
      if name in _options(parent, node.name) and rest:
        # A key inside an option the config leaves out (_add_unlisted_options adds only a
        # whole option), e.g. --config.model.attention_options.block=64.
        return (f'{sentence}; the {node.name} {kind} takes {name!r}, but the config leaves '
                f'it out, so set it whole, e.g. --config.{parent}.{name}="{{\'{rest[0]}\': '
                f'...}}".')
      if name in _options(parent, node.name) and '=' not in arg:
        # A value-less form of an option that is not boolean, e.g. --config.model.dropout_rate
        # (or its value after a space): only the '=' form adds an option the config leaves out.
        return (f'{sentence}; the {node.name} {kind} takes {name!r}, but the config leaves '
                f'it out, so give its value after \'=\', e.g. --config.{path}=VALUE.')
      return (f'{sentence}; the {node.name} {kind} takes: '
              f'{", ".join(sorted(_options(parent, node.name)))}.')
    return f'{sentence}; every key and its default is in {_DEFAULTS}.'
  return None


def _nearest_keys(config, parents: list[str], name: str) -> list[str]:
  """Keys beside the missing one that are spelled like it, and keys of that name elsewhere."""
  siblings = config
  for parent in parents:
    siblings = siblings[parent]
  prefix = ''.join(f'{p}.' for p in parents)
  close = [prefix + key for key in difflib.get_close_matches(name, list(siblings.keys()), n=3)]
  elsewhere = [path for path in _all_keys(config) if path.rsplit('.', 1)[-1] == name]
  return list(dict.fromkeys(elsewhere + close))[:4]


def _all_keys(config, prefix: str = '') -> list[str]:
  keys = []
  for key, value in config.items():
    keys.append(prefix + key)
    if isinstance(value, ml_collections.ConfigDict):
      keys += _all_keys(value, f'{prefix}{key}.')
  return keys


def _one_line(error) -> str:
  """`error` (or its message) on one line: 'Type: first line' for exceptions."""
  if isinstance(error, BaseException):
    text = str(error).strip().splitlines()
    return f'{type(error).__name__}: {text[0] if text else ""}'.rstrip(': .')
  return ' '.join(str(error).split()).rstrip('.')


def _config_paths() -> list[str]:
  return [f'experiments/configs/{name}' for name, _ in _experiment_configs()]


def _experiment_configs() -> list[tuple[str, str]]:
  """(file name, first line of its docstring) of every experiment config."""
  configs = []
  for path in sorted(glob.glob(os.path.join(CONFIG_DIR, '*.py'))):
    name = os.path.basename(path)
    if name in _NOT_EXPERIMENTS:
      continue
    with open(path, encoding='utf-8') as f:
      try:
        doc = ast.get_docstring(ast.parse(f.read())) or ''
      except SyntaxError:
        doc = '(does not parse)'
    configs.append((name, doc.strip().splitlines()[0] if doc.strip() else ''))
  return configs


def _help_text(doc: str, full: bool) -> str:
  """The usage, the flags, the experiment configs and the registered models and tasks."""
  # Imported only for --help: both pull in JAX, Flax and TFDS.
  from models import registry  # pylint: disable=g-import-not-at-top
  from train import tasks  # pylint: disable=g-import-not-at-top
  flag_help = flags.FLAGS.get_help() if full else flags.FLAGS.main_module_help()
  width = max(len(name) for name, _ in _experiment_configs())
  configs = '\n'.join(f'  {name:<{width}}  {doc}' for name, doc in _experiment_configs())
  return (f'{doc.strip()}\n\nflags:\n{flag_help}\n\n'
          f'Experiment configs (--config=experiments/configs/NAME.py):\n{configs}\n\n'
          f'Models (--config.model.name): {", ".join(sorted(registry.MODELS))}\n'
          f'Tasks (--config.task.name): {", ".join(sorted(tasks.TASKS))}\n\n'
          f'Every --config.KEY and its default: {_DEFAULTS}. '
          f'{"" if full else "Every flag: --helpfull."}')
