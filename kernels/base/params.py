"""The one definition of a training run's parameters: the common ones here, each workload's with it.

Every parameter has a name, a type, a default and a one-line doc. The common
parameters (world size, batch, precision, DDP, timing, records ...) are declared
here; a workload declares its own next to its code (kernels/workloads/<name>.py)
and gives the defaults of the common parameters marked "per workload" (dataset,
precision, batch, epochs, lr). One merged table feeds the CLI (`lab train --help`,
grouped), the notebook's generated parameters cell (a section per workload), study
files and validation; nothing else declares parameters.

This module is the bottom of the parameter path and imports nothing above it:
the parameter type, the common table, `RunConfig` and strict coercion.
kernels/launch/config.py merges the workloads' tables, resolves and checks a run's values
(`resolve`, `check_environment`) and derives a changed config (`replace`).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.base.errors import ConfigError  # also imported from here by notebooks, examples and tests
from kernels.base.files import PROJECT_ROOT, results_home

PER_WORKLOAD = None  # the default of a common parameter that each workload sets


class _PerDevice:
    """The default of a parameter that depends on the device type: on with CUDA, off on CPU (None in a notebook)."""

    def __repr__(self) -> str:
        return "None"


PER_DEVICE = _PerDevice()


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    doc: str
    choices: tuple = ()
    group: str = "common"  # "common", or the name of the workload that owns it


# Order matters: it is the order of --help, the notebook's parameters cell and config.json.
COMMON: tuple[Param, ...] = (
    Param(
        "workload",
        str,
        "resnet18",
        "model family: a registered workload (lab train --help lists them) or module:OBJECT for your own",
    ),
    Param(
        "dataset", str, PER_WORKLOAD, "data set; each workload lists the ones it takes (None: the workload's default)"
    ),
    Param("gpus", int, 1, "world size: number of ranks (one per GPU; CPU processes on gloo when no GPU)"),
    Param(
        "precision",
        str,
        PER_WORKLOAD,
        "fp32, bf16 or fp16 autocast; GradScaler only for fp16, which needs a GPU; bf16 on a GPU without it (V100, "
        "T4) trains as fp16 (None: the workload's default)",
        ("fp32", "bf16", "fp16"),
    ),
    Param(
        "batch",
        int,
        PER_WORKLOAD,
        "GLOBAL batch size over all ranks; each rank takes batch / gpus (None: the workload's default)",
    ),
    Param(
        "micro_batches", int, 1, "gradient-accumulation micro-batches per rank and step (per-rank batch must divide)"
    ),
    Param("epochs", int, PER_WORKLOAD, "training epochs (None: the workload's default)"),
    Param(
        "lr",
        float,
        PER_WORKLOAD,
        "peak learning rate of the workload's optimizer for the global batch (None: the workload's recipe)",
    ),
    Param(
        "engine",
        str,
        "ddp",
        "data-parallel engine: ddp (torch DistributedDataParallel) or horovod (Horovod's "
        "DistributedOptimizer; build it with `make horovod`)",
        ("ddp", "horovod"),
    ),
    Param("bucket_cap_mb", float, 25.0, "DDP gradient bucket size in MiB"),
    Param("gradient_as_bucket_view", bool, True, "DDP: gradients are views into the all-reduce buckets (saves a copy)"),
    Param("hvd_fusion_mb", float, 128.0, "horovod: tensor fusion threshold in MiB (HOROVOD_FUSION_THRESHOLD)"),
    Param("hvd_cycle_ms", float, 1.0, "horovod: cycle time in ms between fusion rounds (HOROVOD_CYCLE_TIME)"),
    Param(
        "pipeline",
        str,
        "auto",
        "auto (stream for sets streamed from disk, else device), device (data resident "
        "on the device, batched on-device transforms), stream (shards read sequentially "
        "by background threads) or dataloader (torch DataLoader baseline)",
        ("auto", "device", "stream", "dataloader"),
    ),
    Param(
        "cache",
        str,
        "warm",
        "stream pipeline: warm (the page cache may serve re-reads) or cold (reads bypass the "
        "page cache with O_DIRECT, or evict each byte range where the file system refuses "
        "it: every epoch reads storage)",
        ("warm", "cold"),
    ),
    Param(
        "window_mb",
        float,
        64.0,
        "stream pipeline: MiB per read-ahead window (samples are shuffled within a "
        "window, windows within a rank's range)",
    ),
    Param("read_mb", float, 8.0, "stream pipeline: MiB per sequential read call (at least 1)"),
    Param("io_threads", int, 2, "stream pipeline: background reader threads per rank"),
    Param("num_workers", int, 4, "dataloader pipeline: worker processes per rank"),
    Param("prefetch_factor", int, 2, "dataloader pipeline: batches prefetched per worker"),
    Param("train_samples", int, 0, "use the first N training samples (0: all); for quick runs"),
    Param("test_samples", int, 0, "use the first N test samples (0: all); for quick runs"),
    Param("seed", int, 0, "seed of model init, data order and augmentation; same seed, same run"),
    Param("compile", bool, PER_DEVICE, "torch.compile the model (None: on with CUDA, off on CPU)"),
    Param(
        "cuda_graphs",
        bool,
        PER_DEVICE,
        "CUDA: replay the compiled forward and backward as CUDA graphs "
        "(torch.compile mode reduce-overhead): a step is a few graph launches, "
        "not hundreds of kernel launches (None: on with CUDA and compile where "
        "the workload's shapes are static; needs compile)",
    ),
    Param(
        "channels_last",
        bool,
        PER_DEVICE,
        "channels_last memory format for model and inputs (convolutional "
        "models; None: on with CUDA; on a CPU where the workload measured it "
        "faster: ResNet-18 from width 16)",
    ),
    Param("device", str, "auto", "auto (cuda when visible, else cpu), cuda or cpu", ("auto", "cuda", "cpu")),
    Param("timing_warmup_steps", int, 5, "first steps of the run excluded from throughput (compilation, autotuning)"),
    Param(
        "comm_probe_steps",
        int,
        10,
        "after training, time this many fwd+bwd with and without gradient sync to "
        "expose communication (0: off; needs gpus > 1)",
    ),
    Param(
        "profile_steps",
        int,
        0,
        "profile this many training steps (0: off): one gzipped Chrome trace per rank, "
        "a breakdown by operator category and the top operators in the run directory",
    ),
    Param("profile_wait", int, 10, "profiling: steps skipped before the profiler starts (compilation, autotuning)"),
    Param("profile_warmup", int, 2, "profiling: steps the profiler traces and discards before the active steps"),
    Param(
        "profile_with",
        str,
        "torch",
        "profiling: torch (torch.profiler traces) or external (Nsight wraps the "
        "ranks: NVTX ranges and cudaProfilerStart/Stop around the active steps)",
        ("torch", "external"),
    ),
    Param("profile_memory", bool, False, "profiling: record tensor allocations (larger traces)"),
    Param("profile_shapes", bool, True, "profiling: record operator input shapes"),
    Param("profile_dir", str, "", "profiling: where the traces go (empty: <run directory>/traces)"),
    Param(
        "profile_hta",
        str,
        "auto",
        "profiling: Holistic Trace Analysis on GPU traces: auto (when installed), on (required), off",
        ("auto", "on", "off"),
    ),
    Param(
        "monitor_hz",
        float,
        2.0,
        "resource monitor samples per second on each node (GPU via NVML, host via "
        "psutil) into monitor.csv; 0: off; at most 5 (NVML refreshes slower)",
    ),
    Param(
        "sync_debug_steps",
        int,
        0,
        "CUDA: count the host-device synchronisations over this many steps after the "
        "timing warm-up (torch.cuda.set_sync_debug_mode) into host_syncs_per_step",
    ),
    Param("log_every", int, 50, "print a progress line every N steps (0: per epoch only)"),
    Param("checkpoint_every", int, 1, "checkpoint every N epochs (0: never; a run then cannot resume)"),
    Param(
        "checkpoint_async",
        bool,
        True,
        "write checkpoints in a background thread (the state is copied to host "
        "memory first; the next save or the end of the run waits for the write)",
    ),
    Param(
        "eval_every", int, 1, "evaluate over the test set every N epochs, and after the last (0: after the last only)"
    ),
    Param(
        "eval_batch",
        int,
        0,
        "samples per rank per evaluation batch (0: 4 x the per-rank training batch; "
        "evaluation keeps no activations for backward)",
    ),
    Param(
        "stop_after_steps",
        int,
        0,
        "checkpoint and stop at this total step count (0: run to the end); a run "
        "already there does nothing, a larger value or 0 resumes it",
    ),
    Param("timeout_min", float, 10.0, "process-group timeout in minutes (collectives that hang fail after this)"),
    Param(
        "startup_timeout_min",
        float,
        5.0,
        "minutes for all ranks to reach the rendezvous (MASTER_ADDR, MASTER_PORT) and for the first step to complete",
    ),
    Param(
        "hang_timeout_min",
        float,
        10.0,
        "a rank with no step (or evaluation batch) for this many minutes dumps its Python stacks and fails the run",
    ),
    Param(
        "sync_check_steps",
        int,
        10,
        "every N steps the ranks agree on a stop request (USR1 or TERM: checkpoint "
        "and stop) and on a non-finite loss; one small all-reduce each time",
    ),
    Param(
        "term_grace_s", float, 60.0, "after SIGTERM, seconds to reach a step boundary and checkpoint before giving up"
    ),
    Param(
        "allow_config_change",
        bool,
        False,
        "resume even though a parameter that alters the run changed (the change is recorded)",
    ),
    Param(
        "resume_unverified",
        bool,
        False,
        "resume from a checkpoint that carries no checksum (one written by "
        "a lab before checksums): nothing vouches for its bytes; it is read "
        "as data only (tensors, numbers, containers) all the same",
    ),
    Param(
        "backend",
        str,
        "auto",
        "process-group backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo; gloo on CUDA "
        "lets several ranks share one GPU (a check of the multi-rank path on one GPU, not a "
        "way to train fast)",
        ("auto", "nccl", "gloo"),
    ),
    Param("oversubscribe", bool, False, "allow more CPU ranks on this node than it has cores"),
    Param("data_dir", str, "", "data root (empty: <project>/data)"),
    Param("results_dir", str, "", "where run records go (empty: $LAB_RESULTS/runs, else <project>/results/runs)"),
    Param("label", str, "", "free-form label added to the run id"),
    Param("run_id", str, "", "run directory name (empty: generated; an existing run with a checkpoint resumes)"),
    Param(
        "launcher",
        str,
        "auto",
        "auto, local (spawn gpus processes here), srun (inside an allocation) or none (this process is one rank)",
        ("auto", "local", "srun", "none"),
    ),
)
COMMON_BY_NAME = {p.name: p for p in COMMON}
OVERRIDABLE = tuple(p.name for p in COMMON if p.default is PER_WORKLOAD)


def default(name: str):
    """A common parameter's default: the one place it is written (analyses and predictions use it too)."""
    return COMMON_BY_NAME[name].default


class RunConfig:
    """The resolved parameters of one run: the common ones and those of its workload, as attributes.

    Immutable; `kernels.launch.config.replace(cfg, **changes)` resolves a new one. The order of `to_dict()` is
    the table's: common parameters first, then the workload's.
    """

    __slots__ = ("_values",)

    def __init__(self, values: dict):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(
                f"RunConfig has no parameter '{name}' (workload {self._values.get('workload')})"
            ) from None

    def __setattr__(self, name, value):
        raise AttributeError("RunConfig is immutable; use replace()")

    def __reduce__(self):
        return (RunConfig, (self._values,))

    def __eq__(self, other) -> bool:
        return isinstance(other, RunConfig) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))

    def __repr__(self) -> str:
        return f"RunConfig({self._values!r})"

    @property
    def per_rank_batch(self) -> int:
        return self.batch // self.gpus

    @property
    def per_rank_eval_batch(self) -> int:
        return self.eval_batch or 4 * self.per_rank_batch

    @property
    def data_root(self) -> Path:
        return Path(self.data_dir) if self.data_dir else PROJECT_ROOT / "data"

    @property
    def results_root(self) -> Path:
        return Path(self.results_dir) if self.results_dir else results_home() / "runs"

    def to_dict(self) -> dict:
        return dict(self._values)

    def cli_args(self) -> list[str]:
        """The command-line arguments that reproduce this config."""
        out = []
        for name, value in self._values.items():
            out += [f"--{name}", format_value(value)]
        return out


def format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Every integer parameter ends up in a C int somewhere (torch's and NCCL's counts, sizes and ranks, numpy
# indices, Slurm's task counts); a larger one is refused at once instead of running without end or overflowing.
INT_BOUND = 2**31 - 1


def _integer(value, bad: ConfigError) -> int:
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise bad from None
    raise bad


def _bounded(param: Param, v: int) -> int:
    if abs(v) > INT_BOUND:
        raise ConfigError(
            f"parameter '{param.name}': {v} is beyond what it can hold: an integer parameter lies "
            f"within +-{INT_BOUND:,} (2^31 - 1, a C int as torch, NCCL and Slurm count)"
        )
    return v


def coerce(param: Param, value):
    """Convert a CLI string or a notebook literal to the parameter's type, strictly."""
    t = param.type
    bad = ConfigError(f"parameter '{param.name}': {value!r} is not a valid {t.__name__} ({param.doc})")
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise bad
    if t is int:
        return _bounded(param, _integer(value, bad))
    if t is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            v = float(value)
        elif isinstance(value, str):
            try:
                v = float(value.strip())
            except ValueError:
                raise bad from None
        else:
            raise bad
        if not math.isfinite(v):  # inf/nan would train to NaN losses and "complete"
            raise ConfigError(f"parameter '{param.name}': {value!r} is not a finite number ({param.doc})")
        return v
    if t is str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise bad
        return value
    raise TypeError(t)


def unknown_name_error(name: str, where: str = "", known=None) -> ConfigError:
    """`name` is not a parameter (of 01_train, or of `known`): say so, with the closest known name."""
    known = list(COMMON_BY_NAME if known is None else known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown parameter '{name}'{where}{hint} Known parameters: {', '.join(known)}")


# what a GPU driver leaves on a node (NVIDIA; AMD's for ROCm builds of torch): without any of them torch sees no GPU
GPU_DRIVER_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")


def visible_gpus() -> int:
    """The GPUs torch sees here. On a node without a GPU driver that is 0, known without importing torch: every
    parameter check asks, and importing torch costs a parameter check (and a notebook run's runner) seconds."""
    if not any(Path(p).exists() for p in GPU_DRIVER_NODES):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_type(cfg: RunConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if visible_gpus() > 0 else "cpu"
    return cfg.device
