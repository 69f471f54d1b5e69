"""Where a builder that reads local files finds them, and which files it was prepared from.

Such a builder declares `SOURCE_FILES` (names that must all be present),
`SOURCE_ENV_VAR` and `SOURCE_DEFAULT_DIRS`. The folder is, in order: the one
passed by the caller, the one in the environment variable, the first default
folder that holds every file.

The prepared data set keeps the SHA-256 of each file it was prepared from
(`SOURCE_RECORD` in its folder), so that a later call naming a folder whose files
differ is refused rather than silently served the data set prepared from the others.
Each builder writes it from its `_split_generators`, into the folder TFDS renames into
place with the data, so a preparation stopped at any point leaves no data set without it.
"""

import hashlib
import json
import os

SOURCE_RECORD = 'source_files.json'


def reads_local_files(builder_cls) -> bool:
  return bool(getattr(builder_cls, 'SOURCE_FILES', ()))


def find_dir(name: str, builder_cls, source_dir: str | os.PathLike | None,
             cache_dir: str) -> str:
  """The folder holding `builder_cls.SOURCE_FILES`, or FileNotFoundError saying what to set.

  Args:
    name: the data set's name in `data.load`, for messages.
    builder_cls: the builder that will read the files.
    source_dir: the folder the caller passed, if any.
    cache_dir: where the prepared data set was looked for, for messages.
  """
  files = builder_cls.SOURCE_FILES
  env_var = builder_cls.SOURCE_ENV_VAR
  how = f'pass source_dir= to data.load or set ${env_var}'
  given = (('source_dir', source_dir), (f'${env_var}', os.environ.get(env_var)))
  for origin, folder in given:
    if folder:
      missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
      if missing:
        raise FileNotFoundError(
            f"Data set '{name}': the folder {os.fspath(folder)} given by {origin} lacks "
            f'{", ".join(missing)}; {how} to a folder holding {", ".join(files)}.')
      return os.fspath(folder)
  for folder in builder_cls.SOURCE_DEFAULT_DIRS:
    if all(os.path.isfile(os.path.join(folder, f)) for f in files):
      return folder
  searched = ''.join(f' or {d}' for d in builder_cls.SOURCE_DEFAULT_DIRS)
  raise FileNotFoundError(
      f"Data set '{name}' is not prepared in {cache_dir} and its files "
      f"({', '.join(files)}) were not found in source_dir, ${env_var}{searched}; "
      f'{how} to the folder holding them.')


def given_dir(builder_cls, source_dir: str | os.PathLike | None) -> tuple[str, str] | None:
  """(folder, origin) the caller named, by `source_dir` or the environment variable, if any."""
  env_var = builder_cls.SOURCE_ENV_VAR
  for origin, folder in (('source_dir', source_dir), (f'${env_var}', os.environ.get(env_var))):
    if folder:
      return os.fspath(folder), origin
  return None


def digests(builder_cls, folder: str) -> dict[str, str]:
  """{file name: SHA-256 hex} of `builder_cls.SOURCE_FILES` in `folder`."""
  found = {}
  for name in builder_cls.SOURCE_FILES:
    digest = hashlib.sha256()
    with open(os.path.join(folder, name), 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
    found[name] = digest.hexdigest()
  return found


def write_record(prepared_dir: str, builder_cls, folder: str) -> None:
  """Keeps the digests of the files in `folder` beside the data set prepared from them."""
  path = os.path.join(prepared_dir, SOURCE_RECORD)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump({'sha256': digests(builder_cls, folder)}, f, indent=1, sort_keys=True)
  os.replace(path + '.tmp', path)


def check_record(name: str, prepared_dir: str, builder_cls,
                 source_dir: str | os.PathLike | None) -> None:
  """ValueError, in one sentence, if the caller names a folder (by `source_dir` or the
  environment variable) whose files differ from those the data set in `prepared_dir` was
  prepared from. Nothing is checked when no folder is named, when it lacks a file (the
  prepared copy is then what there is), or when the data set keeps no record."""
  given = given_dir(builder_cls, source_dir)
  path = os.path.join(prepared_dir, SOURCE_RECORD)
  if given is None or not os.path.isfile(path):
    return
  folder, origin = given
  if not all(os.path.isfile(os.path.join(folder, f)) for f in builder_cls.SOURCE_FILES):
    return
  try:
    with open(path, encoding='utf-8') as f:
      recorded = json.load(f)['sha256']
  except (OSError, ValueError, KeyError, TypeError):
    return  # an unreadable record says nothing either way
  found = digests(builder_cls, folder)
  differ = [f for f in builder_cls.SOURCE_FILES if recorded.get(f) != found[f]]
  if differ:
    raise ValueError(
        f"Data set '{name}' in {prepared_dir} was prepared from another {', '.join(differ)} "
        f'than the one in {folder} (given by {origin}); give data_dir= (or '
        f'$JAXLAB_DATA_DIR) another folder to prepare it from these files, or remove '
        f'{prepared_dir} to prepare it again.')
