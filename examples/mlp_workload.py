"""Your own model in the lab: a complete workload outside kernels/, in one file.

    lab train --workload examples.mlp_workload:WORKLOAD --gpus 2 --hidden 64

A multi-layer perceptron on the embedded handwritten digits (8x8 pixels, flattened).
The lab's loop, launchers, records, notebooks and analysis work with it unchanged:
`--workload module:OBJECT` imports OBJECT from any module on PYTHONPATH (here the
repository root). What a workload gives is described in kernels/workloads/base.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.data import load_image_dataset
from kernels.data.pipeline import tensor_sources
from kernels.base.params import ConfigError, Param
from kernels.workloads import DataInfo, Metric, Recipe, Workload

# Its own parameters: group = the workload's name; they appear under their own heading in `lab train --help`.
PARAMS = (Param("hidden", int, 128, "width of the two hidden layers", group="mlp"),)


def make_data(cfg, rank: int, world: int, device: torch.device):
    """This rank's training source and evaluation shard: the lab's device-resident source, no transform."""
    train, test, classes = load_image_dataset(cfg.dataset, cfg.data_root, size=8, channels=1)
    src, ev = tensor_sources(cfg, train, test, None, rank, world, device)
    return src, ev, DataInfo(input_shape=(64,), num_classes=classes)


class MLP(nn.Module):
    def __init__(self, hidden: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, x):  # uint8 images in [0, 255] -> features in [0, 1]
        return self.net(torch.flatten(x, 1).float() / 255.0)


def build_model(cfg, info: DataInfo):
    if cfg.hidden < 1:
        raise ConfigError(f"parameter 'hidden': must be >= 1, got {cfg.hidden}")
    return MLP(cfg.hidden, info.num_classes), f"mlp-hidden{cfg.hidden}"  # the variant goes into the record


def build_optimizer(cfg, model, steps_per_epoch: int) -> Recipe:
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return Recipe(opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.epochs * steps_per_epoch), "step")


def metric_sums(outputs, targets):
    """Per metric, (numerator, denominator) summed over the batch: the lab sums them over ranks exactly."""
    return {"acc": ((outputs.argmax(1) == targets).sum(), targets.numel())}


WORKLOAD = Workload(
    name="mlp",
    title="a two-hidden-layer perceptron",
    datasets=("digits",),
    params=PARAMS,
    defaults={"precision": "fp32", "batch": 64, "epochs": 10, "lr": 3e-3},
    metrics=(Metric("acc"),),
    make_data=make_data,
    build_model=build_model,
    build_optimizer=build_optimizer,
    loss=F.cross_entropy,
    metric_sums=metric_sums,
    primary_metric="acc",
)
