"""The one definition of a training run's parameters: the common ones here, each workload's with it.

Every parameter has a name, a type, a default and a one-line doc. The common
parameters (world size, batch, precision, DDP, timing, records ...) are declared
here; a workload declares its own next to its code (kernels/workloads/<name>.py)
and gives the defaults of the common parameters marked "per workload" (dataset,
precision, batch, epochs, lr). One merged table feeds the CLI (`lab train --help`,
grouped), the notebook's generated parameters cell (a section per workload), study
files and validation; nothing else declares parameters.

`resolve(raw)` turns a mapping of user-supplied values into a `RunConfig`,
raising `ConfigError` (naming the parameter and the fix) for unknown names, a
parameter of another workload ("'rnn_units' is a parameter of workload dcrnn, not
cnn"), malformed values and impossible combinations. `check_environment(cfg)`
adds the checks that need the machine (GPUs visible, results dir writable, data
present) and is cheap: it runs before any process is spawned or any file is written.
"""
from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_ENV = "LAB_RESULTS"


def results_home() -> Path:
    """The results folder: $LAB_RESULTS, else <project>/results. Records go to its runs/."""
    return Path(os.environ.get(RESULTS_ENV) or PROJECT_ROOT / "results")


class ConfigError(ValueError):
    """A parameter or input is wrong; the message names it and the fix."""


def exit_status(body) -> int:
    """Run a command's body: a ConfigError becomes one line on stderr and exit status 2, the lab's convention."""
    import sys

    try:
        return body() or 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


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
    group: str = "common"   # "common", or the name of the workload that owns it


# Order matters: it is the order of --help, the notebook's parameters cell and config.json.
COMMON: tuple[Param, ...] = (
    Param("workload", str, "resnet18", "model family: a registered workload (lab train --help lists them) or "
                                       "module:OBJECT for your own"),
    Param("dataset", str, PER_WORKLOAD, "data set; each workload lists the ones it takes (None: the workload's default)"),
    Param("gpus", int, 1, "world size: number of ranks (one per GPU; CPU processes on gloo when no GPU)"),
    Param("precision", str, PER_WORKLOAD, "fp32, bf16 or fp16 autocast; GradScaler only for fp16, which needs a GPU "
                                          "(None: the workload's default)", ("fp32", "bf16", "fp16")),
    Param("batch", int, PER_WORKLOAD, "GLOBAL batch size over all ranks; each rank takes batch / gpus "
                                      "(None: the workload's default)"),
    Param("micro_batches", int, 1, "gradient-accumulation micro-batches per rank and step (per-rank batch must divide)"),
    Param("epochs", int, PER_WORKLOAD, "training epochs (None: the workload's default)"),
    Param("lr", float, PER_WORKLOAD, "peak learning rate of the workload's optimizer for the global batch "
                                     "(None: the workload's recipe)"),
    Param("engine", str, "ddp", "data-parallel engine: ddp (torch DistributedDataParallel) or horovod (Horovod's "
                                "DistributedOptimizer; build it with `make horovod`)", ("ddp", "horovod")),
    Param("bucket_cap_mb", float, 25.0, "DDP gradient bucket size in MiB"),
    Param("gradient_as_bucket_view", bool, True, "DDP: gradients are views into the all-reduce buckets (saves a copy)"),
    Param("hvd_fusion_mb", float, 128.0, "horovod: tensor fusion threshold in MiB (HOROVOD_FUSION_THRESHOLD)"),
    Param("hvd_cycle_ms", float, 1.0, "horovod: cycle time in ms between fusion rounds (HOROVOD_CYCLE_TIME)"),
    Param("pipeline", str, "auto", "auto (stream for sets streamed from disk, else device), device (data resident "
                                   "on the device, batched on-device transforms), stream (shards read sequentially "
                                   "by background threads) or dataloader (torch DataLoader baseline)",
          ("auto", "device", "stream", "dataloader")),
    Param("cache", str, "warm", "stream pipeline: warm (the page cache may serve re-reads) or cold (each byte range "
                                "is evicted before and after it is read: every epoch reads storage)", ("warm", "cold")),
    Param("window_mb", float, 64.0, "stream pipeline: MiB per read-ahead window (samples are shuffled within a "
                                    "window, windows within a rank's range)"),
    Param("read_mb", float, 8.0, "stream pipeline: MiB per sequential read call (at least 1)"),
    Param("io_threads", int, 2, "stream pipeline: background reader threads per rank"),
    Param("num_workers", int, 4, "dataloader pipeline: worker processes per rank"),
    Param("prefetch_factor", int, 2, "dataloader pipeline: batches prefetched per worker"),
    Param("train_samples", int, 0, "use the first N training samples (0: all); for quick runs"),
    Param("test_samples", int, 0, "use the first N test samples (0: all); for quick runs"),
    Param("seed", int, 0, "seed of model init, data order and augmentation; same seed, same run"),
    Param("compile", bool, PER_DEVICE, "torch.compile the model (None: on with CUDA, off on CPU)"),
    Param("channels_last", bool, PER_DEVICE, "channels_last memory format for model and inputs (convolutional "
                                             "models; None: on with CUDA, off on CPU)"),
    Param("device", str, "auto", "auto (cuda when visible, else cpu), cuda or cpu", ("auto", "cuda", "cpu")),
    Param("timing_warmup_steps", int, 5, "first steps of the run excluded from throughput (compilation, autotuning)"),
    Param("comm_probe_steps", int, 10, "after training, time this many fwd+bwd with and without gradient sync to "
                                       "expose communication (0: off; needs gpus > 1)"),
    Param("profile_steps", int, 0, "profile this many training steps (0: off): one gzipped Chrome trace per rank, "
                                   "a breakdown by operator category and the top operators in the run directory"),
    Param("profile_wait", int, 10, "profiling: steps skipped before the profiler starts (compilation, autotuning)"),
    Param("profile_warmup", int, 2, "profiling: steps the profiler traces and discards before the active steps"),
    Param("profile_with", str, "torch", "profiling: torch (torch.profiler traces) or external (Nsight wraps the "
                                        "ranks: NVTX ranges and cudaProfilerStart/Stop around the active steps)",
          ("torch", "external")),
    Param("profile_memory", bool, False, "profiling: record tensor allocations (larger traces)"),
    Param("profile_shapes", bool, True, "profiling: record operator input shapes"),
    Param("profile_dir", str, "", "profiling: where the traces go (empty: <run directory>/traces)"),
    Param("profile_hta", str, "auto", "profiling: Holistic Trace Analysis on GPU traces: auto (when installed), "
                                      "on (required), off", ("auto", "on", "off")),
    Param("monitor_hz", float, 2.0, "resource monitor samples per second on each node (GPU via NVML, host via "
                                    "psutil) into monitor.csv; 0: off; at most 5 (NVML refreshes slower)"),
    Param("sync_debug_steps", int, 0, "CUDA: count the host-device synchronisations over this many steps after the "
                                      "timing warm-up (torch.cuda.set_sync_debug_mode) into host_syncs_per_step"),
    Param("log_every", int, 50, "print a progress line every N steps (0: per epoch only)"),
    Param("checkpoint_every", int, 1, "checkpoint every N epochs (0: never; a run then cannot resume)"),
    Param("checkpoint_async", bool, True, "write checkpoints in a background thread (the state is copied to host "
                                          "memory first; the next save or the end of the run waits for the write)"),
    Param("eval_every", int, 1, "evaluate over the test set every N epochs, and after the last (0: after the last "
                                "only)"),
    Param("eval_batch", int, 0, "samples per rank per evaluation batch (0: 4 x the per-rank training batch; "
                                "evaluation keeps no activations for backward)"),
    Param("stop_after_steps", int, 0, "checkpoint and stop after this many total steps (0: run to the end); "
                                      "resume by re-running"),
    Param("timeout_min", float, 10.0, "process-group timeout in minutes (collectives that hang fail after this)"),
    Param("startup_timeout_min", float, 5.0, "minutes for all ranks to reach the rendezvous (MASTER_ADDR, "
                                             "MASTER_PORT) and for the first step to complete"),
    Param("hang_timeout_min", float, 10.0, "a rank with no step (or evaluation batch) for this many minutes dumps "
                                          "its Python stacks and fails the run"),
    Param("sync_check_steps", int, 10, "every N steps the ranks agree on a stop request (USR1 or TERM: checkpoint "
                                       "and stop) and on a non-finite loss; one small all-reduce each time"),
    Param("term_grace_s", float, 60.0, "after SIGTERM, seconds to reach a step boundary and checkpoint before "
                                       "giving up"),
    Param("allow_config_change", bool, False, "resume even though a parameter that alters the run changed "
                                              "(the change is recorded)"),
    Param("oversubscribe", bool, False, "allow more CPU ranks on this node than it has cores"),
    Param("data_dir", str, "", "data root (empty: <project>/data)"),
    Param("results_dir", str, "", "where run records go (empty: $LAB_RESULTS/runs, else <project>/results/runs)"),
    Param("label", str, "", "free-form label added to the run id"),
    Param("run_id", str, "", "run directory name (empty: generated; an existing run with a checkpoint resumes)"),
    Param("launcher", str, "auto", "auto, local (spawn gpus processes here), srun (inside an allocation) or none "
                                   "(this process is one rank)", ("auto", "local", "srun", "none")),
)
COMMON_BY_NAME = {p.name: p for p in COMMON}
OVERRIDABLE = tuple(p.name for p in COMMON if p.default is PER_WORKLOAD)


def table(workload: str | None = None) -> list[Param]:
    """The merged table: the common parameters, then every registered workload's (and `workload`'s, if a plug-in)."""
    from kernels.workloads import get_workload, registered

    params = list(COMMON)
    wls = registered()
    if workload and workload not in {w.name for w in wls}:
        wls = [*wls, get_workload(workload)]
    for wl in wls:
        params += list(wl.params)
    return params


class RunConfig:
    """The resolved parameters of one run: the common ones and those of its workload, as attributes.

    Immutable; `replace(**changes)` resolves a new one. The order of `to_dict()` is
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
            raise AttributeError(f"RunConfig has no parameter '{name}' (workload {self._values.get('workload')})") \
                from None

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

    def replace(self, **changes) -> "RunConfig":
        return resolve({**self.to_dict(), **changes})

    def cli_args(self) -> list[str]:
        """The command-line arguments that reproduce this config."""
        out = []
        for name, value in self._values.items():
            out += [f"--{name}", _format(value)]
        return out


def _format(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def coerce(param: Param, value):
    """Convert a CLI string or a notebook literal to the parameter's type, strictly."""
    t = param.type
    bad = ConfigError(
        f"parameter '{param.name}': {value!r} is not a valid {t.__name__} ({param.doc})"
    )
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise bad
    if t is int:
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
    return ConfigError(
        f"unknown parameter '{name}'{where}{hint} Known parameters: {', '.join(known)}"
    )


def resolve(raw: dict) -> RunConfig:
    """Defaults + `raw`, typed and checked. Raises ConfigError before any work.

    A common parameter marked per-workload takes the workload's default when it is
    absent or None; a parameter of another workload is an error naming that workload.
    """
    from kernels.workloads import get_workload, owner_of  # late: workloads import torch

    wname = coerce(COMMON_BY_NAME["workload"], raw.get("workload") or COMMON_BY_NAME["workload"].default)
    wl = get_workload(wname)
    own = {p.name: p for p in wl.params}
    for name in raw:
        if name in COMMON_BY_NAME or name in own:
            continue
        owner = owner_of(name)
        if owner:
            raise ConfigError(f"'{name}' is a parameter of workload {owner}, not {wl.name}; remove it, or set "
                              f"workload={owner}")
        raise unknown_name_error(name, known=[*COMMON_BY_NAME, *own])
    values = {}
    for p in (*COMMON, *wl.params):
        given = raw.get(p.name)
        if given is PER_DEVICE:  # the default itself, passed on (a table's defaults as values)
            given = None
        if given is not None:
            v = coerce(p, given)
        elif p.default is PER_WORKLOAD:
            v = wl.defaults[p.name]
        elif p.default is PER_DEVICE:
            v = None  # resolved below, once the device is known
        elif p.name in raw:  # None given for a parameter that has a value of its own
            v = coerce(p, None)
        else:
            v = p.default
        if p.choices and v not in p.choices:
            raise ConfigError(
                f"parameter '{p.name}': unknown value {v!r}; choose one of {', '.join(map(str, p.choices))}"
            )
        values[p.name] = v
    values["workload"] = wl.name if ":" not in wname else wname
    cuda = values["device"] == "cuda" or (values["device"] == "auto" and visible_gpus() > 0)
    for p in COMMON:  # recorded resolved: the record says what ran
        if p.default is PER_DEVICE and values[p.name] is None:
            values[p.name] = cuda
    if values["pipeline"] == "auto":  # recorded resolved, so records and analyses compare like with like
        from kernels.data import DATASETS

        ds = DATASETS.get(values["dataset"])
        values["pipeline"] = "stream" if ds is not None and ds.streamed else "device"
    cfg = RunConfig(values)
    _check_combinations(cfg, wl)
    return cfg


def _check_combinations(cfg: RunConfig, wl) -> None:
    def need(cond: bool, msg: str):
        if not cond:
            raise ConfigError(msg)

    need(cfg.gpus >= 1, f"parameter 'gpus': world size must be >= 1, got {cfg.gpus}")
    need(cfg.batch >= 1, f"parameter 'batch': must be >= 1, got {cfg.batch}")
    need(cfg.batch % cfg.gpus == 0,
         f"parameter 'batch': the global batch {cfg.batch} is not divisible by gpus={cfg.gpus}; "
         f"use a multiple of {cfg.gpus}, e.g. {cfg.gpus * max(1, round(cfg.batch / cfg.gpus))}")
    need(cfg.micro_batches >= 1, f"parameter 'micro_batches': must be >= 1, got {cfg.micro_batches}")
    need(cfg.per_rank_batch % cfg.micro_batches == 0,
         f"parameter 'micro_batches': the per-rank batch {cfg.per_rank_batch} (batch/gpus) is not "
         f"divisible by micro_batches={cfg.micro_batches}")
    need(cfg.epochs >= 1, f"parameter 'epochs': must be >= 1, got {cfg.epochs}")
    need(cfg.lr > 0, f"parameter 'lr': must be > 0, got {cfg.lr}")
    need(cfg.bucket_cap_mb > 0, f"parameter 'bucket_cap_mb': must be > 0, got {cfg.bucket_cap_mb}")
    for name in ("num_workers", "train_samples", "test_samples", "timing_warmup_steps", "eval_every", "eval_batch",
                 "comm_probe_steps", "log_every", "checkpoint_every", "stop_after_steps", "profile_steps",
                 "profile_wait", "profile_warmup", "sync_debug_steps"):
        need(getattr(cfg, name) >= 0, f"parameter '{name}': must be >= 0, got {getattr(cfg, name)}")
    need(0 <= cfg.monitor_hz <= 5, f"parameter 'monitor_hz': samples per second in 0 (off) .. 5, got "
                                   f"{cfg.monitor_hz} (NVML refreshes utilisation every 1/6 to 1 s)")
    need(cfg.profile_with != "external" or cfg.profile_steps > 0,
         "parameter 'profile_with': external marks the capture window of the active steps; set profile_steps > 0")
    if cfg.profile_steps and cfg.stop_after_steps:
        end = cfg.profile_wait + cfg.profile_warmup + cfg.profile_steps
        need(end <= cfg.stop_after_steps,
             f"parameter 'profile_steps': the profiled window ends at step {end} (profile_wait {cfg.profile_wait} + "
             f"profile_warmup {cfg.profile_warmup} + profile_steps {cfg.profile_steps}) but stop_after_steps="
             f"{cfg.stop_after_steps} stops the run before; lower profile_wait or profile_steps")
    need(cfg.prefetch_factor >= 1, "parameter 'prefetch_factor': must be >= 1")
    need(cfg.window_mb > 0, f"parameter 'window_mb': must be > 0, got {cfg.window_mb}")
    need(cfg.read_mb >= 1, f"parameter 'read_mb': reads of at least 1 MiB, got {cfg.read_mb}")
    need(cfg.io_threads >= 1, f"parameter 'io_threads': must be >= 1, got {cfg.io_threads}")
    need(cfg.timeout_min > 0, "parameter 'timeout_min': must be > 0")
    for name in ("startup_timeout_min", "hang_timeout_min"):
        need(getattr(cfg, name) > 0, f"parameter '{name}': must be > 0, got {getattr(cfg, name)}")
    need(cfg.sync_check_steps >= 1, f"parameter 'sync_check_steps': must be >= 1, got {cfg.sync_check_steps}")
    need(cfg.device != "cpu" or cfg.precision != "fp16",
         "parameter 'precision': fp16 needs a GPU (GradScaler and fp16 autocast are CUDA-only); "
         "use precision=bf16 or fp32 on CPU")
    need(all(c.isalnum() or c in "-_." for c in cfg.run_id) and cfg.run_id not in (".", ".."),
         f"parameter 'run_id': {cfg.run_id!r} must be a plain directory name of letters, digits, '-', '_' and '.'")
    need(all(c.isalnum() or c in "-_." for c in cfg.label),
         f"parameter 'label': {cfg.label!r} may hold letters, digits, '-', '_' and '.' only")
    need(cfg.dataset in wl.datasets,
         f"parameter 'dataset': workload '{cfg.workload}' takes {', '.join(wl.datasets)}, not '{cfg.dataset}'")
    from kernels.data import DATASETS

    ds = DATASETS.get(cfg.dataset)
    if ds is not None and ds.streamed:
        need(cfg.pipeline in ("stream", "dataloader"),
             f"parameter 'pipeline': data set '{cfg.dataset}' is streamed from disk (it need not fit in memory): "
             f"use pipeline=stream (the default) or dataloader (the per-sample baseline), not {cfg.pipeline}")
    elif ds is not None:
        need(cfg.pipeline != "stream",
             f"parameter 'pipeline': stream reads a set of shards from disk and '{cfg.dataset}' is held in memory; "
             f"use pipeline=device or dataloader, or dataset=bigmnist")
    from kernels.comm.horovod import check_config

    check_config(cfg)
    if wl.check is not None:
        wl.check(cfg)


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_type(cfg: RunConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if visible_gpus() > 0 else "cpu"
    return cfg.device


def check_environment(cfg: RunConfig, *, ranks_on_this_node: int | None = None) -> None:
    """Checks that need the machine; cheap, and before any file is written.

    ranks_on_this_node: how many ranks will share this node's GPUs (the local
    launcher spawns all of them here; srun spreads them; None = cfg.gpus).
    """
    from kernels.data import check_dataset

    dev = device_type(cfg)
    if dev == "cuda":
        n = visible_gpus()
        local = cfg.gpus if ranks_on_this_node is None else ranks_on_this_node
        if n == 0:
            raise ConfigError("parameter 'device': cuda requested but no GPU is visible; use device=auto or cpu")
        if local > n:
            raise ConfigError(
                f"parameter 'gpus': {local} ranks on this node but only {n} GPU(s) visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                f"ask for fewer gpus or run across nodes with srun")
    elif cfg.precision == "fp16":
        raise ConfigError(
            "parameter 'precision': fp16 needs a GPU and none is visible; use precision=bf16 or fp32")
    else:
        local = cfg.gpus if ranks_on_this_node is None else ranks_on_this_node
        from kernels.sysinfo import usable_cores

        cores = usable_cores()
        if local > cores and not cfg.oversubscribe:
            raise ConfigError(
                f"parameter 'gpus': {local} CPU ranks on this node but only {cores} core(s) are available to this "
                f"process; ask for fewer, run across nodes with srun, or pass oversubscribe=true to share cores")
    if cfg.engine == "horovod":
        from kernels.comm.horovod import check_built

        check_built()
    _check_writable(cfg.results_root)
    if cfg.profile_steps and cfg.profile_dir:
        _check_writable(Path(cfg.profile_dir), "profile_dir")
    if cfg.profile_steps and cfg.profile_hta == "on" and cfg.profile_with == "torch":
        from kernels.profiling import hta

        if not hta.installed():
            raise ConfigError(f"parameter 'profile_hta': on, but HolisticTraceAnalysis is not installed; "
                              f"`{hta.INSTALL}` into this environment, or use profile_hta=auto")
    from kernels.workloads import get_workload

    wl = get_workload(cfg.workload)
    if wl.prepare is not None:
        wl.prepare(cfg)
    check_dataset(cfg.dataset, cfg.data_root)


def _check_writable(path: Path, name: str = "results_dir") -> None:
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(
            f"parameter '{name}': {path} is not writable (nearest existing: {probe}); "
            f"pass {name}=<a writable directory>")


def describe_markdown() -> str:
    """The parameter table for docs: common parameters, then each workload's."""
    rows = ["| parameter | type | default | meaning |", "|---|---|---|---|"]
    for p in table():
        owner = "" if p.group == "common" else f" (workload {p.group})"
        rows.append(f"| `{p.name}` | {p.type.__name__} | `{_format(p.default)!s}` | {p.doc}{owner} |")
    return "\n".join(rows)
