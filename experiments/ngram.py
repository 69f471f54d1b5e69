r"""Character n-gram baselines on Tiny Shakespeare: validation perplexity and bits per character.

Each model of `models.ngram` (orders --orders; interpolated Kneser–Ney and
add-k smoothing) is fitted by counting on the train split and scored on the
validation split through the same evaluation windows of `data.text` that the
neural language models use: every target x_t is scored once, given only the
tokens of its own window before it (so the first n − 2 targets of each window
have a shorter context). Perplexity and bits per character come from
`models.losses.language_model_summary`.

No smoothing constant is chosen on the validation split: add-k is reported for
every k of --add_k (k = 1, Laplace, and k = 0.01), and Kneser–Ney uses the
fixed discount D = 0.75 (or --kn_discount=estimate, D = n₁ / (n₁ + 2 n₂) per
level from the training counts).

Each run appends one section to results.md in --workdir: a heading naming its
settings (the flags that change its numbers or samples), the size of the data and
the Markdown table; and one section under the same heading to samples.txt (one
--sample_length character sample per model, drawn with --seed from --prompt).
Nothing earlier in either file changes, so runs with other settings accumulate
there, each under its own heading. From the repository root:

  python -m experiments.ngram --tiny_shakespeare_dir=../shared/data/tinyshakespeare \
      --workdir=workdirs/ngram
"""

import math
import os
import re
import tempfile
import time

from absl import app
from absl import flags
import ml_collections
import numpy as np

from data import text
from experiments import command_line
from models import losses
from models import ngram

FLAGS = flags.FLAGS

RESULTS_FILE = 'results.md'
SAMPLES_FILE = 'samples.txt'


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('tiny_shakespeare_dir', None,
                      'Folder holding input.txt (default: $TINY_SHAKESPEARE_DIR).')
  flags.DEFINE_string('data_dir', None, 'TFDS data directory (default: a temporary folder).')
  flags.DEFINE_string('workdir', None, 'Folder whose results.md and samples.txt each run '
                      'appends its section to.')
  flags.DEFINE_list('orders', ['1', '2', '3', '4', '5', '6'], 'n-gram orders n.')
  flags.DEFINE_list('smoothing', ['kneser_ney', 'add_k'], 'Smoothings, of: ' + ', '.join(ngram.SMOOTHINGS))
  flags.DEFINE_list('add_k', ['1.0', '0.01'], 'Every k of add-k smoothing to report.')
  flags.DEFINE_string('kn_discount', '0.75', "Kneser–Ney discount D in [0, 1], or 'estimate'.")
  flags.DEFINE_integer('window', 256, 'Evaluation window length T, as the neural models use.',
                       lower_bound=1)
  flags.DEFINE_integer('sample_length', 300, 'Characters per sample.', lower_bound=1)
  flags.DEFINE_string('prompt', 'ROMEO:', 'Text every sample continues.')
  flags.DEFINE_integer('seed', 0, 'Seed of every sample.')
  flags.mark_flag_as_required('workdir')


def data_config(source_dir: str | None, data_dir: str, window: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      'name': 'tiny_shakespeare', 'train_split': 'train', 'eval_split': 'validation',
      'data_dir': data_dir, 'options': {'source_dir': source_dir} if source_dir else {},
      'text_key': 'text', 'tokenizer': 'char', 'vocab_size': None, 'window': window})


def model_specs(orders, smoothings, add_ks, kn_discount) -> list[tuple[int, str, dict]]:
  """(order, label, NGramModel options) of every model to fit, or UsageError in one sentence
  on a bad flag (before the data is read)."""
  orders = command_line.integers_at_least(orders, 'orders')
  if not smoothings:
    raise app.UsageError(f'--smoothing= names no smoothing; give one or more of: '
                         f'{", ".join(ngram.SMOOTHINGS)}.')
  unknown = [s for s in smoothings if s not in ngram.SMOOTHINGS]
  if unknown:
    raise app.UsageError(f'Unknown --smoothing {unknown[0]!r}; the smoothings are: '
                         f'{", ".join(ngram.SMOOTHINGS)}.')
  ks = [_number(k) for k in add_ks]
  if ('add_k' in smoothings and not ks) or not all(0 <= k < math.inf for k in ks):
    raise app.UsageError(f'--add_k={",".join(add_ks)} must be finite numbers of at least 0 '
                         '(k = 0 counts without smoothing).')
  discount = None if kn_discount == 'estimate' else _number(kn_discount)
  if discount is not None and not 0 <= discount <= 1:
    raise app.UsageError(f"--kn_discount={kn_discount} must be a number in [0, 1] (which keeps "
                         "each distribution normalised) or 'estimate'.")
  specs = []
  for order in orders:
    for smoothing in smoothings:
      if smoothing == 'kneser_ney':
        label = 'Kneser–Ney, D estimated' if discount is None else f'Kneser–Ney, D = {discount:g}'
        specs.append((order, label, dict(smoothing='kneser_ney', discount=discount)))
      else:
        specs.extend((order, f'add-k, k = {k:g}', dict(smoothing='add_k', add_k=k)) for k in ks)
  return specs


def _number(text: str) -> float:
  """`text` as a float, NaN (refused by every range check) if it is not a number."""
  try:
    return float(text)
  except ValueError:
    return math.nan


def check_orders(orders: list[int], vocab_size: int) -> None:
  """UsageError unless every order's m-gram codes fit: V^n below 2^62 (`models.ngram`)."""
  highest = ngram.max_order(vocab_size)
  too_high = [n for n in orders if n > highest]
  if too_high:
    raise app.UsageError(f'--orders has {too_high[0]}, too high for the {vocab_size} tokens of the '
                         f'vocabulary (V^n must stay below 2^62); give orders of at most {highest}.')


def encode_prompt(tokenizer, prompt: str) -> np.ndarray:
  """--prompt as ids, or UsageError naming a character the tokenizer does not have."""
  try:
    return np.asarray(tokenizer.encode(prompt), np.int64)
  except ValueError as error:
    reason = str(error)
    raise app.UsageError(f'--prompt={prompt!r} cannot be encoded: {reason[:1].lower()}'
                         f'{reason[1:]}') from None


def evaluate(model: ngram.NGramModel, windows: dict, units_per_token: np.ndarray, unit: str) -> dict:
  """Summed NLL over the weighted targets of `windows`, as `language_model_summary` reports it."""
  log_p_BxT = model.window_log_probs(windows['tokens'])
  weights_BxT = windows['weights']
  # Padding targets have weight 0; add-0 may give them log 0, which must not reach the sum.
  nats = -np.sum(np.where(weights_BxT > 0, log_p_BxT, 0.0) * weights_BxT)
  targets_BxT = windows['tokens'][:, 1:]
  return losses.language_model_summary(nats, weights_BxT.sum(),
                                       np.sum(units_per_token[targets_BxT] * weights_BxT), unit)


def settings_heading(*, window: int, orders, smoothings, add_ks, kn_discount: str, prompt: str,
                     sample_length: int, seed: int) -> str:
  """The Markdown heading of one run's sections in results.md and samples.txt: the flags, as
  given, that change its numbers or samples (--add_k only with add-k smoothing, --kn_discount
  only with Kneser–Ney), as one code span."""
  given = [f'--window={window}', f'--orders={",".join(orders)}',
           f'--smoothing={",".join(smoothings)}']
  if 'add_k' in smoothings:
    given.append(f'--add_k={",".join(add_ks)}')
  if 'kneser_ney' in smoothings:
    given.append(f'--kn_discount={kn_discount}')
  # The prompt as a Python literal: quoted, and a line break in it written as \n.
  given += [f'--prompt={prompt!r}', f'--sample_length={sample_length}', f'--seed={seed}']
  text = ' '.join(given)
  # A code span's backticks outnumber any run of backticks inside it (CommonMark).
  fence = '`' * (1 + max([0] + [len(run) for run in re.findall('`+', text)]))
  pad = ' ' if '`' in text else ''
  return f'## {fence}{pad}{text}{pad}{fence}'


def append_section(path: str, section: str) -> None:
  """Appends `section` to the file at `path` (made if missing), after a blank line when the file
  holds text already (ending its last line first if it was left unended); what the file held
  is kept byte for byte."""
  gap = ''
  if os.path.isfile(path) and os.path.getsize(path):
    with open(path, 'rb') as f:
      f.seek(-1, os.SEEK_END)
      gap = '\n' if f.read(1) == b'\n' else '\n\n'
  with open(path, 'a', encoding='utf-8') as f:
    f.write(gap + section)


def main(argv):
  del argv
  command_line.work_directory(FLAGS.workdir)
  for name, role in ((RESULTS_FILE, 'the table is appended to'),
                     (SAMPLES_FILE, 'the samples are appended to')):
    try:
      command_line.record_file(FLAGS.workdir, name, role)
    except ValueError as error:
      raise app.UsageError(str(error)) from None
  start = time.perf_counter()
  specs = model_specs(FLAGS.orders, FLAGS.smoothing, FLAGS.add_k, FLAGS.kn_discount)
  with tempfile.TemporaryDirectory() as temporary:
    config = data_config(FLAGS.tiny_shakespeare_dir, FLAGS.data_dir or temporary, FLAGS.window)
    try:
      train, evaluation, meta = text.make_sources(config, FLAGS.workdir)
    except (ValueError, FileNotFoundError) as error:  # no input.txt, another one, too short
      raise app.UsageError(str(error)) from None
  tokenizer, unit = meta['tokenizer'], meta['unit']
  # The checks that need the vocabulary: before any model is fitted or file written.
  check_orders(sorted({order for order, _, _ in specs}), meta['vocab_size'])
  prompt = encode_prompt(tokenizer, FLAGS.prompt)
  eval_windows = evaluation.gather(np.arange(len(evaluation)))
  about = (f'Tiny Shakespeare: {len(train.tokens):,} train / {len(evaluation.tokens):,} '
           f'validation characters, V = {meta["vocab_size"]}, {len(evaluation)} evaluation '
           f'windows of {FLAGS.window}')
  print(about, flush=True)
  heading = settings_heading(window=FLAGS.window, orders=FLAGS.orders, smoothings=FLAGS.smoothing,
                             add_ks=FLAGS.add_k, kn_discount=FLAGS.kn_discount,
                             prompt=FLAGS.prompt, sample_length=FLAGS.sample_length,
                             seed=FLAGS.seed)

  header = ('| n | smoothing | validation perplexity | bits/char | fit time (s) |\n'
            '|---|---|---|---|---|\n')
  rows, samples = [], []
  print(header, end='', flush=True)
  for order, label, options in specs:
    fit_start = time.perf_counter()
    model = ngram.NGramModel(train.tokens, vocab_size=meta['vocab_size'], order=order, **options)
    fit_seconds = time.perf_counter() - fit_start
    summary = evaluate(model, eval_windows, meta['token_units'], unit)
    rows.append(f'| {order} | {label} | {summary["perplexity"]:.3f} | '
                f'{summary[f"bits_per_{unit}"]:.4f} | {fit_seconds:.2f} |\n')
    print(rows[-1], end='', flush=True)
    drawn = model.sample(prompt, FLAGS.sample_length, np.random.default_rng(FLAGS.seed))
    samples.append(f'### n = {order}, {label}\n\n'
                   f'{FLAGS.prompt}{tokenizer.decode(drawn.tolist())}\n')

  os.makedirs(FLAGS.workdir, exist_ok=True)
  append_section(os.path.join(FLAGS.workdir, RESULTS_FILE),
                 f'{heading}\n\n{about}.\n\n{header}{"".join(rows)}')
  append_section(os.path.join(FLAGS.workdir, SAMPLES_FILE),
                 f'{heading}\n\n' + '\n'.join(samples))
  print(f'Appended the table to {RESULTS_FILE} and the samples to {SAMPLES_FILE} in '
        f'{FLAGS.workdir} under {heading[3:]}, in {time.perf_counter() - start:.1f} s.')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
