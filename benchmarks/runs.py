"""`loop.setup` for the benchmark scripts, with a config it refuses as one usage error."""

from absl import app

from train import loop


def setup(config, workdir: str) -> loop.Run:
  """`loop.setup(config, workdir)`; the ValueError or FileNotFoundError by which it refuses a
  config (one sentence) is raised as an app.UsageError, which `command_line.run` prints as one
  `error:` line, as `experiments.main` prints it."""
  try:
    return loop.setup(config, workdir)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from None
