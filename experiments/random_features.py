r"""Random Fourier features + ridge classifier against the exact RBF kernel machine on digits.

Ridge regression on the features z(x) of `models.random_features` is kernel
ridge regression with the kernel z(x)ᵀz(y) ≈ exp(-γ‖x - y‖²), so as D grows
its accuracy approaches that of exact kernel ridge with the same γ and ridge
parameter. The script prints the test accuracy for several D (mean and spread
over feature draws), the exact kernel ridge accuracy, and, as a second exact
kernel machine, an RBF support vector classifier with the same γ.

  python -m experiments.random_features [--workdir=/tmp/rff]
"""

import os

from absl import app
from absl import flags
import jax
import numpy as np
from sklearn import datasets
from sklearn import kernel_ridge
from sklearn import linear_model
from sklearn import model_selection
from sklearn import svm

from experiments import command_line
from models import random_features

FLAGS = flags.FLAGS


def load_split(seed: int):
  """Digits scaled to [0, 1], split 70/30 with stratification."""
  x, y = datasets.load_digits(return_X_y=True)
  return model_selection.train_test_split(x / 16.0, y, test_size=0.3, random_state=seed, stratify=y)


def signed_one_hot(y: np.ndarray, num_classes: int) -> np.ndarray:
  # ±1 targets, the encoding RidgeClassifier uses, so both ridge models see the same problem.
  return 2 * np.eye(num_classes)[y] - 1


def exact_kernel_ridge_accuracy(x_train, y_train, x_test, y_test, gamma, ridge) -> float:
  model = kernel_ridge.KernelRidge(alpha=ridge, kernel='rbf', gamma=gamma)
  model.fit(x_train, signed_one_hot(y_train, 10))
  return float(np.mean(np.argmax(model.predict(x_test), axis=1) == y_test))


def svc_accuracy(x_train, y_train, x_test, y_test, gamma, c) -> float:
  return float(svm.SVC(kernel='rbf', gamma=gamma, C=c).fit(x_train, y_train).score(x_test, y_test))


def random_features_accuracy(x_train, y_train, x_test, y_test, gamma, ridge, num_features, seed) -> float:
  features = random_features.sample_features(jax.random.key(seed), x_train.shape[1], num_features, gamma)
  z_train, z_test = np.asarray(features(x_train)), np.asarray(features(x_test))
  # No intercept: kernel ridge has none either.
  classifier = linear_model.RidgeClassifier(alpha=ridge, fit_intercept=False).fit(z_train, y_train)
  return float(classifier.score(z_test, y_test))


def define_flags() -> None:
  # Called only when run as a script, so that importing the module defines no flags.
  flags.DEFINE_string('workdir', None, 'If set, the table is also written there as TSV.')
  flags.DEFINE_list('num_features', ['50', '100', '200', '500', '1000', '2000', '5000'],
                    'Numbers D of random features.')
  flags.DEFINE_integer('draws', 5, 'Independent feature draws per D.', lower_bound=1)
  flags.DEFINE_float('gamma', None, 'RBF γ > 0; by default 1 / (input_dim · Var x), the SVC '
                     '"scale" rule.')
  flags.DEFINE_float('ridge', 1e-2, 'Ridge parameter of both ridge classifiers.', lower_bound=0.0)
  flags.DEFINE_float('svc_c', 10.0, 'Regularisation constant C > 0 of the SVC.')
  flags.register_validator('gamma', lambda v: v is None or 0 < v < float('inf'),
                           '--gamma must be positive and finite.')
  flags.register_validator('ridge', lambda v: v < float('inf'), '--ridge must be finite.')
  flags.register_validator('svc_c', lambda v: v > 0, '--svc_c must be positive.')
  flags.DEFINE_integer('split_seed', 0, 'Seed of the stratified 70/30 train/test split.',
                       lower_bound=0, upper_bound=2**32 - 1)  # scikit-learn's seed range


def main(argv):
  del argv
  table = None
  if FLAGS.workdir:
    command_line.work_directory(FLAGS.workdir)
    try:  # before the work, so that an earlier table is not replaced by a run that fails
      table = command_line.record_file(FLAGS.workdir, 'random_features.tsv',
                                       'the accuracies are written to')
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  counts = command_line.integers_at_least(FLAGS.num_features, 'num_features')
  x_train, x_test, y_train, y_test = load_split(FLAGS.split_seed)
  gamma = FLAGS.gamma if FLAGS.gamma is not None else 1.0 / (x_train.shape[1] * x_train.var())
  print(f'digits: {len(x_train)} train, {len(x_test)} test; gamma = {gamma:.4f}, ridge = {FLAGS.ridge}')
  exact = exact_kernel_ridge_accuracy(x_train, y_train, x_test, y_test, gamma, FLAGS.ridge)
  svc = svc_accuracy(x_train, y_train, x_test, y_test, gamma, FLAGS.svc_c)
  rows = []
  print(f'{"D":>6}  {"RFF ridge acc (mean ± std)":>27}')
  for num_features in counts:
    accuracies = [random_features_accuracy(x_train, y_train, x_test, y_test, gamma, FLAGS.ridge, num_features,
                                           seed) for seed in range(FLAGS.draws)]
    rows.append((num_features, np.mean(accuracies), np.std(accuracies)))
    print(f'{num_features:>6d}  {rows[-1][1]:>19.4f} ± {rows[-1][2]:.4f}', flush=True)
  print(f'exact RBF kernel ridge accuracy: {exact:.4f}')
  print(f'exact RBF SVC (C = {FLAGS.svc_c}) accuracy: {svc:.4f}')
  if table:
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with open(table, 'w') as f:
      f.write('model\tnum_features\tmean_accuracy\tstd_accuracy\n')
      f.writelines(f'rff_ridge\t{d}\t{m:.6f}\t{s:.6f}\n' for d, m, s in rows)
      f.write(f'exact_kernel_ridge\t\t{exact:.6f}\t\nexact_svc\t\t{svc:.6f}\t\n')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)
