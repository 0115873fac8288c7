"""The workload interface: what a model family brings, so that the loop needs nothing else.

A workload is one `Workload` value. It owns:
- its parameters (`params`, group = its name) and the defaults of the common
  parameters marked per-workload (`defaults`: dataset, precision, batch, epochs, lr);
- its data: `make_data(cfg, rank, world, device)` returns this rank's training
  source, its evaluation source and a `DataInfo` (kernels/data/pipeline.py has the
  sharding contract and the sources that honour it);
- its model: `build_model(cfg, info)` returns (module, variant name for the record);
- its recipe: `build_optimizer(cfg, model, steps_per_epoch)` returns a `Recipe`
  (optimizer, LR scheduler and whether it steps per step or per epoch, gradient
  clipping);
- its loss and metrics: `loss(outputs, targets)`, and `metric_sums(outputs, targets)`
  returning, per `Metric`, a (numerator, denominator) pair of sums over the batch, of
  any shape (a scalar, or one value per label, e.g. per forecast horizon), so that
  sums over ranks and batches give exact means (a Metric with root=True reports the
  square root of that mean: an RMSE);
- optionally `forward(model, x, y, step, train)` when the model needs more than x
  (targets for teacher forcing, the step for scheduled sampling), and `check(cfg)`
  for its own combinations of parameters;
- optionally `prepare(cfg)`, run once before the ranks start (on the launcher's host), to
  make what the run needs on disk, and `report(model, info)`, run on every rank after
  training, whose "shared" part (rank 0's) and "rank" parts land in the record
  (summary.json `workload` and `ranks`);
- optionally its share of the documents, `reporting`: the name of a module (imported only by the
  report and the records' documentation, never by a rank) holding any of CRITERIA (the targets its
  briefs set, kernels/analysis/criteria.py), RECORD_FIELDS (what its summary.json entries mean),
  and TITLE with section(ctx) (its section of the paper). The documents name a workload nowhere else.

kernels/ddp_core.py calls only these; it never branches on a workload or data set
name. docs/user-guide.md ("Your own model") shows a complete workload in a few dozen lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Metric:
    """One metric: `name` for a scalar, or one value per label (columns <split>_<name>_<label>)."""

    name: str
    labels: tuple[str, ...] = ()
    higher_is_better: bool = True
    root: bool = False  # the value is sqrt(numerator / denominator) (an RMSE from sums of squares)

    @property
    def size(self) -> int:
        return max(1, len(self.labels))

    def columns(self, split: str) -> list[str]:
        if not self.labels:
            return [f"{split}_{self.name}"]
        return [f"{split}_{self.name}_{label}" for label in self.labels]


@dataclass(frozen=True)
class DataInfo:
    """What the model builder needs to know about the data."""

    input_shape: tuple[int, ...]  # one sample's shape
    num_classes: int = 0  # classification: number of classes (0 otherwise)
    extra: dict = field(default_factory=dict)


@dataclass
class Recipe:
    """The optimizer and its schedule. `schedule_unit`: 'step' or 'epoch' (when scheduler.step() is called)."""

    optimizer: Any  # a torch.optim.Optimizer (torch is imported where models are built)
    scheduler: Any
    schedule_unit: str = "step"
    clip_grad_norm: float | None = None

    def __post_init__(self):
        if self.schedule_unit not in ("step", "epoch"):
            raise ValueError(f"Recipe: schedule_unit must be 'step' or 'epoch', got {self.schedule_unit!r}")


def default_forward(model, x, y, step: int, train: bool):
    return model(x)


@dataclass(frozen=True)
class Workload:
    name: str
    title: str  # how the documents name the model, e.g. "ResNet-18 (CIFAR form)"
    datasets: tuple[str, ...]  # the data sets it takes; the first is its default
    params: tuple  # its own Param()s (group = name)
    defaults: dict  # defaults of the per-workload common parameters
    metrics: tuple[Metric, ...]
    make_data: Callable  # (cfg, rank, world, device) -> (train source, eval source, DataInfo)
    build_model: Callable  # (cfg, info) -> (nn.Module, variant: str)
    build_optimizer: Callable  # (cfg, model, steps_per_epoch) -> Recipe
    loss: Callable  # (outputs, targets) -> scalar mean loss
    metric_sums: Callable  # (outputs, targets) -> {metric: (numerator, denominator)}
    forward: Callable = default_forward  # (model, x, y, step, train) -> outputs
    check: Callable | None = None  # (cfg) -> None, raises ConfigError
    prepare: Callable | None = None  # (cfg) -> None: before launch, once (e.g. generate a synthetic set)
    report: Callable | None = None  # (model, info) -> {"shared": {...}, "rank": {...}} for the record
    primary_metric: str = ""  # the metric the documents compare across rank counts
    cpu_channels_last: Callable | None = None  # (values) -> bool: channels_last's default on a CPU (None: off)
    reporting: str = ""  # module of its criteria, record fields and paper section (above)
    static_shapes: bool = True  # every training step has the same shapes and no host-side branch:
    # cuda_graphs defaults on with CUDA and compile

    def __post_init__(self):
        from kernels.base.params import COMMON_BY_NAME, OVERRIDABLE

        missing = [k for k in OVERRIDABLE if k not in self.defaults and k != "dataset"]
        if missing:
            raise TypeError(f"workload {self.name}: defaults lack {', '.join(missing)}")
        if not self.datasets:
            raise TypeError(f"workload {self.name}: no data sets")
        for p in self.params:
            if p.name in COMMON_BY_NAME:
                raise TypeError(
                    f"workload {self.name}: parameter '{p.name}' is a common parameter; set its "
                    f"default in `defaults` instead"
                )
            if p.group != self.name:
                raise TypeError(f"workload {self.name}: parameter '{p.name}' must have group={self.name!r}")
        self.defaults.setdefault("dataset", self.datasets[0])
        if self.primary_metric and self.primary_metric not in {m.name for m in self.metrics}:
            raise TypeError(f"workload {self.name}: primary_metric {self.primary_metric!r} is not one of its metrics")


def fused(model) -> dict:
    """Optimizer keyword arguments for the fastest kernels torch offers: `fused=True` on CUDA (one kernel for the
    whole update of SGD, Adam, AdamW, Adagrad) where the model lives on a GPU; on CPU torch's default (foreach),
    which keeps CPU runs as they were."""
    p = next(iter(model.parameters()), None)
    return {"fused": True} if p is not None and p.is_cuda else {}
