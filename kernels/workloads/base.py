"""The workload interface."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Split:
    """One split of a dataset: inputs (uint8 images NCHW, or float features) and integer targets."""
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def head(self, n: int) -> "Split":
        return self if n <= 0 or n >= len(self) else Split(self.x[:n], self.y[:n])


@dataclass(frozen=True)
class Augment:
    """Per-sample image augmentation and normalisation, applied by the data pipeline.

    pad/flip are the training-time random crop (with zero padding) and horizontal
    flip; mean/std normalise uint8 [0, 255] images channel-wise.
    """
    mean: tuple[float, ...]
    std: tuple[float, ...]
    pad: int = 0
    flip: bool = False


@dataclass(frozen=True)
class Workload:
    name: str
    title: str                              # how the documents name the model, e.g. "ResNet-18 (CIFAR form)"
    datasets: tuple[str, ...]
    metric_names: tuple[str, ...]          # e.g. ("acc",): columns train_acc / eval_acc
    build_model: Callable                   # (cfg, num_classes) -> (nn.Module, variant: str)
    load_data: Callable                     # (cfg) -> (train: Split, test: Split, num_classes: int)
    augment: Callable                       # (cfg, dataset) -> Augment | None
    loss: Callable                          # (outputs, targets) -> scalar mean loss
    metric_sums: Callable                   # (outputs, targets) -> {metric: summed value over batch}
