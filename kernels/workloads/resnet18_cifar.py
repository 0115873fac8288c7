"""ResNet-18 on CIFAR-10 (or the embedded digits, or synthetic data of the same shape).

The model is the CIFAR form of ResNet-18 (He et al. 2016, as used in the
CIFAR literature): a 3x3 stride-1 stem with no max-pool, then four stages of
two BasicBlocks (64, 128, 256, 512 channels at width 64), global average pool
and a linear head. About 0.56 GMACs per 32x32 image forward. The torchvision
model (7x7 stride-2 stem + max-pool, made for ImageNet) on 32x32 input is a
different, ~15x cheaper model; it is offered as model_source=torchvision where
torchvision imports, and the record names the variant either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

from kernels.base.errors import ConfigError
from kernels.base.params import Param, device_type
from kernels.workloads import classification
from kernels.workloads.base import DataInfo, Recipe, Workload, fused

if TYPE_CHECKING:  # annotations only: torch is imported where models and data are built
    import torch

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


PARAMS = (
    Param(
        "width",
        int,
        64,
        "ResNet base width (64 is the standard model; smaller only for tests and demos)",
        group="resnet18",
    ),
    Param(
        "model_source",
        str,
        "native",
        "native (kernels/, CIFAR stem) or torchvision (ImageNet stem, optional dependency)",
        ("native", "torchvision"),
        group="resnet18",
    ),
    Param("momentum", float, 0.9, "SGD momentum (nesterov when > 0)", group="resnet18"),
    Param("weight_decay", float, 5e-4, "SGD weight decay", group="resnet18"),
    Param(
        "lr_warmup_epochs", float, 1.0, "linear LR warm-up length in epochs, then cosine decay to 0", group="resnet18"
    ),
)


# oneDNN's CPU backward of a 1x1 stride-2 convolution in channels_last writes past its workspace when the
# input channels are fewer than its block (8 with AVX2, 16 with AVX-512; uxlfoundation/oneDNN#6035): a crash, a
# hang or wrong weight gradients. The downsampling shortcuts here take width, 2 width and 4 width channels.
CPU_CHANNELS_LAST_MIN_WIDTH = 16


def _meets_the_fault(model_source: str, width: int) -> bool:
    return model_source == "native" and width < CPU_CHANNELS_LAST_MIN_WIDTH


def cpu_channels_last(values: dict) -> bool:
    """channels_last by default on a CPU: measured faster (a training step at batch 64 on the project's 2-core VM,
    torch 2.13, paired: +15 % at width 64, +20 % at 32, +22-30 % at 16) wherever it is clear of that fault."""
    return values["model_source"] == "native" and not _meets_the_fault(values["model_source"], values["width"])


def check(cfg) -> None:
    if cfg.width < 1:
        raise ConfigError(f"parameter 'width': must be >= 1, got {cfg.width}")
    if cfg.channels_last and _meets_the_fault(cfg.model_source, cfg.width) and device_type(cfg) == "cpu":
        raise ConfigError(
            f"parameter 'channels_last': on a CPU, ResNet-18 at width {cfg.width} has 1x1 stride-2 convolutions with "
            f"fewer than {CPU_CHANNELS_LAST_MIN_WIDTH} input channels, whose channels_last backward in oneDNN writes "
            f"past its workspace (uxlfoundation/oneDNN#6035: a crash or wrong gradients); use channels_last=false, "
            f"or width >= {CPU_CHANNELS_LAST_MIN_WIDTH}"
        )
    if not 0 <= cfg.momentum < 1:
        raise ConfigError(f"parameter 'momentum': must be in [0, 1), got {cfg.momentum}")
    if cfg.lr_warmup_epochs < 0:
        raise ConfigError("parameter 'lr_warmup_epochs': must be >= 0")
    if cfg.weight_decay < 0:
        raise ConfigError(f"parameter 'weight_decay': must be >= 0, got {cfg.weight_decay}")


def build_model(cfg, info: DataInfo):
    if cfg.model_source == "torchvision":
        try:
            import torchvision
        except Exception as e:  # the CPU wheel here cannot import it at all
            raise ConfigError(
                f"parameter 'model_source': torchvision is not importable here ({type(e).__name__}: {e}); "
                f"use model_source=native"
            ) from None
        model = torchvision.models.resnet18(num_classes=info.num_classes)
        return model, "torchvision-resnet18-imagenet-stem"
    from kernels.workloads.convnets import ResNet18Cifar

    return ResNet18Cifar(info.num_classes, cfg.width), f"resnet18-cifar-stem-width{cfg.width}"


def lr_lambda(total_steps: int, warmup_steps: int):
    """Linear warm-up to the peak, then cosine decay to 0, per optimizer step."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup_steps) / span)))

    return f


def build_optimizer(cfg, model, steps_per_epoch: int) -> Recipe:
    import torch

    opt = torch.optim.SGD(
        model.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.momentum > 0,
        weight_decay=cfg.weight_decay,
        **fused(model),
    )
    total = cfg.epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, round(cfg.lr_warmup_epochs * steps_per_epoch)))
    return Recipe(opt, sched, "step")


def make_data(cfg, rank: int, world: int, device: torch.device):
    from kernels.data import load_image_dataset
    from kernels.data.pipeline import ImageTransform, tensor_sources

    train, test, classes = load_image_dataset(cfg.dataset, cfg.data_root, samples=cfg.train_samples)
    # Digits and synthetic data are normalised with CIFAR statistics too: the point is
    # an identical pipeline, not the best digits accuracy. No flips for digits.
    transform = ImageTransform(mean=CIFAR_MEAN, std=CIFAR_STD, pad=4, flip=cfg.dataset != "digits")
    src, ev = tensor_sources(cfg, train, test, transform, rank, world, device)
    return src, ev, DataInfo(input_shape=tuple(train.x.shape[1:]), num_classes=classes)


WORKLOAD = Workload(
    name="resnet18",
    title="ResNet-18 (CIFAR form)",
    datasets=("cifar10", "digits", "synthetic"),
    params=PARAMS,
    defaults={"precision": "bf16", "batch": 512, "epochs": 10, "lr": 0.2},
    metrics=(classification.ACCURACY,),
    make_data=make_data,
    build_model=build_model,
    build_optimizer=build_optimizer,
    loss=classification.loss,
    reporting="kernels.workloads.resnet18_reporting",
    metric_sums=classification.metric_sums,
    check=check,
    primary_metric="acc",
    cpu_channels_last=cpu_channels_last,
)
