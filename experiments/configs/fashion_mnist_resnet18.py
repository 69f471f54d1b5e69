r"""ResNet-18 (He et al. 2016, Table 1) on Fashion-MNIST, with the small-input stem.

ResNet-18's four stages of two basic blocks (64/128/256/512 channels) behind the
3×3/1 stem without max pool that CIFAR-sized images take, so the stages work on
28×28, 14×14, 7×7 and 4×4 maps. 11.2M parameters, and about 13× ResNet-20's FLOPs
per image. The recipe is ResNet-20's (`fashion_mnist_resnet.py`: SGD with Nesterov
momentum, L2 5e-4 on the kernels, warm-up and cosine decay from 0.1, batch 128,
random crops and flips) for 2 epochs, with half an epoch of warm-up.

  python -m experiments.main --config=experiments/configs/fashion_mnist_resnet18.py \
      --workdir=workdirs/fashion_mnist_resnet18

`--config.model.name=resnet34` or `resnet50` trains the deeper networks the same way
(ResNet-34: 80.55% after these 2 epochs, in 101 min here, against ResNet-18's 86.95%,
and 89.98% with `--config.model.zero_init_residual=True`;
ResNet-50, trained for 1 epoch with `--config.num_train_steps=468
--config.optimizer.warmup_steps=234`: 66.01% in 105 min, and 83.45% in 99 min with
`--config.model.zero_init_residual=True`, which kept its training accuracy from
collapsing when the learning rate reached its peak).
`--config.model.small_input_stem=False` gives the ImageNet stem (a 7×7/2 convolution
and a 3×3/2 max pool, so 7×7 maps from the first stage on): a twentieth of the FLOPs,
but on this CPU only 2.4× the steps/s (0.83 against 0.34 in one run; profiled, its
convolutions took 900 of its 1,100 ms per step, about 15 GFLOP/s).
"""

from experiments.configs import fashion_mnist_resnet

EPOCHS = 2


def get_config():
  config = fashion_mnist_resnet.get_config()
  config.model.name = 'resnet18'
  config.model.small_input_stem = True
  config.optimizer.warmup_steps = fashion_mnist_resnet.STEPS_PER_EPOCH // 2
  config.num_train_steps = EPOCHS * fashion_mnist_resnet.STEPS_PER_EPOCH
  config.eval_every_steps = fashion_mnist_resnet.STEPS_PER_EPOCH
  return config
