"""Where a builder that reads local files finds them.

Such a builder declares `SOURCE_FILES` (names that must all be present),
`SOURCE_ENV_VAR` and `SOURCE_DEFAULT_DIRS`. The folder is, in order: the one
passed by the caller, the one in the environment variable, the first default
folder that holds every file.
"""

import os


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
