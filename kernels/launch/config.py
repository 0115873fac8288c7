"""Resolving a run's parameters: the merged table, validation, and the checks that need the machine.

kernels/base/params.py holds the common parameters and `RunConfig`; each workload declares
its own next to its code. This module merges them (`table`), turns user-supplied values
into a `RunConfig` (`resolve`, raising ConfigError that names the parameter and the fix
for unknown names, a parameter of another workload, malformed values and impossible
combinations) and adds the checks that need this machine (`check_environment`: GPUs
visible, results dir writable, data present, the engine built), before any process is
spawned or any file is written. It sits above the workloads, data sets and engines
whose own checks it calls, and below the loop and the launchers that use it.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernels.base import params
from kernels.base.errors import ConfigError
from kernels.base.params import (
    COMMON,
    COMMON_BY_NAME,
    PER_DEVICE,
    PER_WORKLOAD,
    Param,
    RunConfig,
    coerce,
    unknown_name_error,
)


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
            raise ConfigError(
                f"'{name}' is a parameter of workload {owner}, not {wl.name}; remove it, or set workload={owner}"
            )
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
    cuda = values["device"] == "cuda" or (values["device"] == "auto" and params.visible_gpus() > 0)
    for p in COMMON:  # recorded resolved: the record says what ran
        if p.default is PER_DEVICE and values[p.name] is None:
            values[p.name] = cuda
    if raw.get("cuda_graphs") in (None, PER_DEVICE):  # only through compile, and only where shapes are static
        values["cuda_graphs"] = bool(cuda and values["compile"] and wl.static_shapes and values["micro_batches"] == 1)
    if raw.get("channels_last") in (None, PER_DEVICE):
        if values["engine"] == "horovod":  # its collectives take contiguous tensors only (kernels/engines/horovod)
            values["channels_last"] = False
        elif not cuda and wl.cpu_channels_last is not None:
            values["channels_last"] = wl.cpu_channels_last(values)  # where the workload measured it faster and safe
    if values["pipeline"] == "auto":  # recorded resolved, so records and analyses compare like with like
        from kernels.data import DATASETS

        ds = DATASETS.get(values["dataset"])
        values["pipeline"] = "stream" if ds is not None and ds.streamed else "device"
    cfg = RunConfig(values)
    _check_combinations(cfg, wl)
    return cfg


def need(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless cond."""
    if not cond:
        raise ConfigError(msg)


def _check_ranges(cfg: RunConfig) -> None:
    """Each number within its range: sizes, counts, rates and timeouts."""
    need(cfg.gpus >= 1, f"parameter 'gpus': world size must be >= 1, got {cfg.gpus}")
    need(cfg.batch >= 1, f"parameter 'batch': must be >= 1, got {cfg.batch}")
    need(
        cfg.batch % cfg.gpus == 0,
        f"parameter 'batch': the global batch {cfg.batch} is not divisible by gpus={cfg.gpus}; "
        f"use a multiple of {cfg.gpus}, e.g. {cfg.gpus * max(1, round(cfg.batch / cfg.gpus))}",
    )
    need(cfg.micro_batches >= 1, f"parameter 'micro_batches': must be >= 1, got {cfg.micro_batches}")
    need(
        cfg.per_rank_batch % cfg.micro_batches == 0,
        f"parameter 'micro_batches': the per-rank batch {cfg.per_rank_batch} (batch/gpus) is not "
        f"divisible by micro_batches={cfg.micro_batches}",
    )
    need(cfg.epochs >= 1, f"parameter 'epochs': must be >= 1, got {cfg.epochs}")
    need(0 <= cfg.seed < 2**32, f"parameter 'seed': must be in 0 .. 2**32 - 1 (numpy's seeds), got {cfg.seed}")
    need(cfg.lr > 0, f"parameter 'lr': must be > 0, got {cfg.lr}")
    need(cfg.bucket_cap_mb > 0, f"parameter 'bucket_cap_mb': must be > 0, got {cfg.bucket_cap_mb}")
    for name in (
        "num_workers",
        "train_samples",
        "test_samples",
        "timing_warmup_steps",
        "eval_every",
        "eval_batch",
        "comm_probe_steps",
        "log_every",
        "checkpoint_every",
        "stop_after_steps",
        "profile_steps",
        "profile_wait",
        "profile_warmup",
        "sync_debug_steps",
    ):
        need(getattr(cfg, name) >= 0, f"parameter '{name}': must be >= 0, got {getattr(cfg, name)}")
    need(
        0 <= cfg.monitor_hz <= 5,
        f"parameter 'monitor_hz': samples per second in 0 (off) .. 5, got "
        f"{cfg.monitor_hz} (NVML refreshes utilisation every 1/6 to 1 s)",
    )
    need(
        cfg.profile_with != "external" or cfg.profile_steps > 0,
        "parameter 'profile_with': external marks the capture window of the active steps; set profile_steps > 0",
    )
    if cfg.profile_steps and cfg.stop_after_steps:
        end = cfg.profile_wait + cfg.profile_warmup + cfg.profile_steps
        need(
            end <= cfg.stop_after_steps,
            f"parameter 'profile_steps': the profiled window ends at step {end} (profile_wait {cfg.profile_wait} + "
            f"profile_warmup {cfg.profile_warmup} + profile_steps {cfg.profile_steps}) but stop_after_steps="
            f"{cfg.stop_after_steps} stops the run before; lower profile_wait or profile_steps",
        )
    need(cfg.prefetch_factor >= 1, "parameter 'prefetch_factor': must be >= 1")
    need(cfg.window_mb > 0, f"parameter 'window_mb': must be > 0, got {cfg.window_mb}")
    need(cfg.read_mb >= 1, f"parameter 'read_mb': reads of at least 1 MiB, got {cfg.read_mb}")
    need(cfg.io_threads >= 1, f"parameter 'io_threads': must be >= 1, got {cfg.io_threads}")
    need(cfg.timeout_min > 0, "parameter 'timeout_min': must be > 0")
    for name in ("startup_timeout_min", "hang_timeout_min", "term_grace_s"):
        need(getattr(cfg, name) > 0, f"parameter '{name}': must be > 0, got {getattr(cfg, name)}")
    need(cfg.sync_check_steps >= 1, f"parameter 'sync_check_steps': must be >= 1, got {cfg.sync_check_steps}")


def _check_combinations(cfg: RunConfig, wl) -> None:
    """The numbers in range, then the parameters that must agree with each other, with the data set and the
    workload."""
    _check_ranges(cfg)
    need(
        not cfg.cuda_graphs or cfg.compile,
        "parameter 'cuda_graphs': the graphs are captured through torch.compile (mode reduce-overhead); set "
        "compile=true, or cuda_graphs=false",
    )
    need(
        not cfg.cuda_graphs or cfg.micro_batches == 1,
        "parameter 'cuda_graphs': with micro_batches > 1 each micro-batch's backward replays the same captured graph "
        "and would overwrite the gradient the one before left; set cuda_graphs=false (or leave it unset)",
    )
    need(
        not cfg.cuda_graphs or params.device_type(cfg) == "cuda",
        "parameter 'cuda_graphs': CUDA graphs need a GPU; set cuda_graphs=false (or leave it unset) on a CPU",
    )
    need(
        cfg.backend != "nccl" or params.device_type(cfg) == "cuda",
        "parameter 'backend': nccl needs GPUs and none is in use here; use backend=auto or gloo",
    )
    need(
        cfg.device != "cpu" or cfg.precision != "fp16",
        "parameter 'precision': fp16 needs a GPU (GradScaler and fp16 autocast are CUDA-only); "
        "use precision=bf16 or fp32 on CPU",
    )
    _check_run_id(cfg.run_id)
    need(_plain(cfg.label), f"parameter 'label': {cfg.label!r} may hold letters, digits, '-', '_' and '.' only")
    need(
        cfg.dataset in wl.datasets,
        f"parameter 'dataset': workload '{cfg.workload}' takes {', '.join(wl.datasets)}, not '{cfg.dataset}'",
    )
    from kernels.data import DATASETS

    ds = DATASETS.get(cfg.dataset)
    if ds is not None and ds.streamed:
        need(
            cfg.pipeline in ("stream", "dataloader"),
            f"parameter 'pipeline': data set '{cfg.dataset}' is streamed from disk (it need not fit in memory): "
            f"use pipeline=stream (the default) or dataloader (the per-sample baseline), not {cfg.pipeline}",
        )
    elif ds is not None:
        need(
            cfg.pipeline != "stream",
            f"parameter 'pipeline': stream reads a set of shards from disk and '{cfg.dataset}' is held in memory; "
            f"use pipeline=device or dataloader, or dataset=bigmnist",
        )
    from kernels.engines.horovod import check_config

    check_config(cfg)
    if wl.check is not None:
        wl.check(cfg)


def _plain(name: str) -> bool:
    """Letters, digits, '-', '_' and '.' only: safe in a path and a Slurm job name."""
    return all(c.isalnum() or c in "-_." for c in name)


def _check_run_id(run_id: str) -> None:
    if not _plain(run_id) or run_id in (".", ".."):
        raise ConfigError(
            f"parameter 'run_id': {run_id!r} must be a plain directory name of letters, digits, '-', '_' and '.'"
        )


def replace(cfg: RunConfig, **changes) -> RunConfig:
    """A new config with `changes`, resolved and checked again."""
    return resolve({**cfg.to_dict(), **changes})


SETTLED = ("run_id", "launcher", "results_dir")


def settled(cfg: RunConfig, **fixed) -> RunConfig:
    """`cfg` with what the driver fixes before the ranks start (the fields in SETTLED), not resolved again:
    nothing resolve() derives depends on them. Any other change goes through replace()."""
    other = sorted(set(fixed) - set(SETTLED))
    if other:
        raise ValueError(f"settled() fixes {', '.join(SETTLED)} only, not {', '.join(other)}; use replace()")
    new = RunConfig({**cfg.to_dict(), **fixed})
    if new.run_id != cfg.run_id:
        _check_run_id(new.run_id)
    return new


def check_environment(cfg: RunConfig, *, ranks_on_this_node: int | None = None, rank_only: bool = False) -> None:
    """Checks that need the machine; cheap, and before any file is written.

    ranks_on_this_node: how many ranks will share this node's GPUs (the local
    launcher spawns all of them here; srun spreads them; None = cfg.gpus).
    rank_only: a rank its driver has checked already: only what is its own (its device, its cores, its software,
    its data path); the results folder and the workload's `prepare` were the driver's, once.
    """
    from kernels.data import check_dataset

    dev = params.device_type(cfg)
    if dev == "cuda":
        n = params.visible_gpus()
        local = cfg.gpus if ranks_on_this_node is None else ranks_on_this_node
        if n == 0:
            raise ConfigError("parameter 'device': cuda requested but no GPU is visible; use device=auto or cpu")
        if local > n and cfg.backend != "gloo":
            raise ConfigError(
                f"parameter 'gpus': {local} ranks on this node but only {n} GPU(s) visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                f"ask for fewer gpus or run across nodes with srun (backend=gloo lets ranks share a GPU: a check of "
                f"the multi-rank path, not for speed)"
            )
    elif cfg.precision == "fp16":
        raise ConfigError("parameter 'precision': fp16 needs a GPU and none is visible; use precision=bf16 or fp32")
    else:
        local = cfg.gpus if ranks_on_this_node is None else ranks_on_this_node
        from kernels.base.sysinfo import usable_cores

        cores = usable_cores()
        if local > cores and not cfg.oversubscribe:
            raise ConfigError(
                f"parameter 'gpus': {local} CPU ranks on this node but only {cores} core(s) are available to this "
                f"process; ask for fewer, run across nodes with srun, or pass oversubscribe=true to share cores"
            )
    if cfg.engine == "horovod":
        from kernels.engines.horovod import check_built

        check_built()
    if not rank_only:
        _check_writable(cfg.results_root)
    if cfg.profile_steps and cfg.profile_dir:
        _check_writable(Path(cfg.profile_dir), "profile_dir")
    if cfg.profile_steps and cfg.profile_hta == "on" and cfg.profile_with == "torch":
        from kernels.profiling import hta

        if not hta.installed():
            raise ConfigError(
                f"parameter 'profile_hta': on, but HolisticTraceAnalysis is not installed; "
                f"`{hta.INSTALL}` into this environment, or use profile_hta=auto"
            )
    from kernels.workloads import get_workload

    wl = get_workload(cfg.workload)
    if wl.prepare is not None and not rank_only:
        wl.prepare(cfg)
    check_dataset(cfg.dataset, cfg.data_root)


def missing_data(cfg: RunConfig) -> str | None:
    """What a run's first check would say of its data set (missing, damaged), or None: a submitter says it before
    the job waits in the queue only to stop there, on nodes that often cannot download."""
    from kernels.data import check_dataset

    try:
        check_dataset(cfg.dataset, cfg.data_root)
    except ConfigError as e:
        return str(e)
    return None


def _check_writable(path: Path, name: str = "results_dir") -> None:
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(
            f"parameter '{name}': {path} is not writable (nearest existing: {probe}); "
            f"pass {name}=<a writable directory>"
        )
