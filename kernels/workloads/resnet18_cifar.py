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

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.data import load_image_dataset
from kernels.workloads.base import Augment, Workload

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 64, in_channels: int = 3):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(in_channels, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        stages, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            stride = 1 if i == 0 else 2
            stages += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(cfg, num_classes: int):
    if cfg.model_source == "torchvision":
        try:
            import torchvision
        except Exception as e:  # the CPU wheel here cannot import it at all
            from kernels.params import ConfigError

            raise ConfigError(
                f"parameter 'model_source': torchvision is not importable here ({type(e).__name__}: {e}); "
                f"use model_source=native") from None
        model = torchvision.models.resnet18(num_classes=num_classes)
        return model, "torchvision-resnet18-imagenet-stem"
    return ResNet18Cifar(num_classes, cfg.width), f"resnet18-cifar-stem-width{cfg.width}"


def load_data(cfg):
    return load_image_dataset(cfg.dataset, cfg.data_root, samples=cfg.train_samples)


def augment(cfg, dataset: str) -> Augment:
    # Digits and synthetic data are normalised with CIFAR statistics too: the
    # point is an identical pipeline, not the best digits accuracy.
    return Augment(mean=CIFAR_MEAN, std=CIFAR_STD, pad=4, flip=dataset != "digits")


def loss(outputs, targets):
    return F.cross_entropy(outputs, targets)


def metric_sums(outputs, targets):
    return {"acc": (outputs.argmax(1) == targets).sum()}


WORKLOAD = Workload(
    name="resnet18",
    title="ResNet-18 (CIFAR form)",
    datasets=("cifar10", "digits", "synthetic"),
    metric_names=("acc",),
    build_model=build_model,
    load_data=load_data,
    augment=augment,
    loss=loss,
    metric_sums=metric_sums,
)
