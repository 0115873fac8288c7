"""The one schema of a run record: written by global rank 0, read by the analysis.

A record is a directory results/runs/<run_id>/ holding:
    config.json   resolved parameters + provenance (git, versions, hosts, devices, Slurm ids)
    metrics.csv   one row per completed epoch; units in the column names
    summary.json  the run's outcome; `status` says whether it is complete
    checkpoint.pt latest checkpoint (a run resumes from it)
Files are written atomically (temp file + rename), so a reader never sees half a
file. Only `status == "complete"` marks a finished run: a run that failed says
"failed" with the error, one stopped on purpose says "stopped", one in progress
"running".

`lab records-doc` prints this schema as Markdown (results/README.md is
that output; a test keeps them equal).
"""
from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

SCHEMA_VERSION = 2


def _process_umask() -> int:
    # Read once at import (single-threaded then): os.umask can only be read by setting it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp creates files 0600 whatever the umask; records in a group's shared project
# directory must be readable by the group, so the final file gets the mode the umask allows.
FILE_MODE = 0o666 & ~_process_umask()

# column -> meaning; `<split>_<metric>` columns for the workload's metrics
# (e.g. train_acc, eval_acc) follow the loss columns.
METRICS_COLUMNS: dict[str, str] = {
    "epoch": "epoch number, from 1",
    "steps": "optimizer steps in this epoch",
    "timed_steps": "steps counted in the timing (the first timing_warmup_steps of each process start, fresh or resumed, are excluded)",
    "samples": "training samples processed in this epoch, all ranks",
    "epoch_s": "wall time of the epoch's training steps, slowest rank, seconds (evaluation excluded)",
    "eval_s": "wall time of the evaluation after the epoch, seconds",
    "samples_per_s": "training throughput, all ranks: global batch / median step time of the epoch's timed steps (a step's time is its slowest rank's)",
    "samples_per_s_p10": "10th percentile of the per-step throughput (global batch / 90th percentile step time)",
    "samples_per_s_p90": "90th percentile of the per-step throughput (global batch / 10th percentile step time)",
    "samples_per_s_per_device": "samples_per_s / world size",
    "step_ms_p50": "median step time over the epoch's timed steps (slowest rank per step), milliseconds",
    "step_ms_p10": "10th percentile step time",
    "step_ms_p90": "90th percentile step time",
    "step_ms_mean": "mean step time (a ratio of sums; one slow step moves it, the median hardly)",
    "data_wait_ms": "mean time per step waiting for the input batch (device-synchronised), averaged over ranks",
    "compute_ms": "step_ms_mean - data_wait_ms: forward, backward (with overlapped gradient all-reduce) and optimizer",
    "data_wait_frac": "data wait over step time, summed over the epoch's timed steps",
    "train_loss": "mean training loss over the epoch's samples, all ranks",
    "eval_loss": "mean loss over the whole test set (sharded over ranks, summed exactly)",
    "lr": "learning rate at the end of the epoch",
    "peak_mem_gib": "peak memory, GiB (CUDA: max allocated on the device; CPU: max resident set of the process), max over ranks",
    "tflops_per_device": "achieved training TFLOP/s per device (counted FLOPs x samples/s per device)",
    "mfu": "model FLOPs utilisation: tflops_per_device / the device's dense peak for the precision; empty when the peak is unknown",
}

SUMMARY_FIELDS: dict[str, str] = {
    "schema_version": "record schema version",
    "run_id": "the run directory's name",
    "status": "running | complete | stopped | failed",
    "error": "the error message when status is failed",
    "started_utc": "ISO time the run (first attempt) started",
    "finished_utc": "ISO time the run ended (this attempt)",
    "resumed_from_step": "global step the last attempt resumed from (0 = fresh start)",
    "epochs_done": "completed epochs",
    "steps_done": "completed optimizer steps",
    "world_size": "number of ranks",
    "device_name": "device of rank 0 (GPU model, or CPU)",
    "throughput_stat": "how samples_per_s was computed, in words",
    "timed_steps": "timed steps behind the figures below (all epochs)",
    "samples_per_s": "HEADLINE throughput, all ranks: global batch / median step time over all timed steps of the run",
    "samples_per_s_p10": "10th percentile of the per-step throughput over the run",
    "samples_per_s_p90": "90th percentile of the per-step throughput over the run",
    "samples_per_s_mean": "timed samples / summed step time (a ratio of sums; kept to compare with the median)",
    "samples_per_s_per_device": "samples_per_s / world size",
    "step_ms_p50": "median step time over all timed steps, ms",
    "step_ms_p10": "10th percentile step time, ms",
    "step_ms_p90": "90th percentile step time, ms",
    "step_ms_mean": "mean step time, ms",
    "epoch_s_median": "median epoch_s over the epochs after the first (over all epochs when there is one)",
    "data_wait_frac": "share of step time spent waiting for data, over all timed steps",
    "final_eval_loss": "eval_loss after the last epoch",
    "peak_mem_gib": "max peak_mem_gib over epochs",
    "fwd_flops_per_sample": "forward FLOPs per sample, counted by torch.utils.flop_counter (2 per MAC)",
    "train_flops_per_sample": "forward + backward FLOPs per sample, counted",
    "peak_tflops": "the device's dense peak TFLOP/s for the precision (empty when unknown)",
    "tflops_per_device": "achieved TFLOP/s per device at the headline throughput",
    "mfu": "tflops_per_device / peak_tflops (empty when the peak is unknown)",
    "comm_probe_sync_ms": "fwd+bwd per step with gradient all-reduce (probe after training; empty if not run)",
    "comm_probe_nosync_ms": "fwd+bwd per step without gradient sync (DDP no_sync)",
    "exposed_comm_ms": "comm_probe_sync_ms - comm_probe_nosync_ms: communication not hidden behind backward",
}


def metric_columns(metrics) -> list[str]:
    """metrics.csv's columns for a workload's metrics (kernels.workloads.Metric): train_<col>, eval_<col> pairs."""
    cols = list(METRICS_COLUMNS)
    i = cols.index("eval_loss") + 1
    extra = [c for m in metrics for tr, ev in zip(m.columns("train"), m.columns("eval")) for c in (tr, ev)]
    return cols[:i] + extra + cols[i:]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


def write_metrics(path: Path, rows: list[dict], columns: list[str]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    atomic_write_bytes(path, buf.getvalue().encode())


def read_run(run_dir: Path) -> dict:
    """{'config': ..., 'summary': ..., 'metrics': list of row dicts} of one record."""
    run_dir = Path(run_dir)
    out = {"dir": str(run_dir)}
    for name in ("config", "summary"):
        p = run_dir / f"{name}.json"
        out[name] = json.loads(p.read_text()) if p.exists() else None
    p = run_dir / "metrics.csv"
    rows = []
    if p.exists():
        with open(p, newline="") as f:
            for row in csv.DictReader(f):
                rows.append({k: _num(v) for k, v in row.items()})
    out["metrics"] = rows
    return out


def is_complete(run_dir: Path) -> bool:
    p = Path(run_dir) / "summary.json"
    if not p.exists():
        return False
    return json.loads(p.read_text()).get("status") == "complete"


def ensure_not_complete(run_dir: Path) -> None:
    """Refuse to start over a finished record (it would be silently overwritten)."""
    from kernels.params import ConfigError

    if is_complete(run_dir):
        raise ConfigError(f"parameter 'run_id': {run_dir} is already a complete run; "
                          f"pass a new run_id (or none) to start another")


def _num(v: str):
    if v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def schema_markdown() -> str:
    lines = [
        "# Run records",
        "",
        "Generated by `lab records-doc` from kernels/records.py, the one definition of the schema.",
        "",
        "Each run leaves `results/runs/<run_id>/` with `config.json` (resolved parameters and provenance: git commit",
        "and dirty flag, Python/torch/CUDA/cuDNN/NCCL versions, host names, device names, Slurm job/array ids),",
        "`metrics.csv` (one row per epoch) and `summary.json`; only `status: complete` marks a finished run.",
        "",
        f"## metrics.csv (schema version {SCHEMA_VERSION})",
        "",
        "| column | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in METRICS_COLUMNS.items()]
    lines += ["| `train_<metric>`, `eval_<metric>` | the workload's metrics (e.g. `eval_acc`, a fraction; a metric "
              "with labels has one column per label, e.g. `eval_mae_h3`) |", ""]
    lines += ["## summary.json", "", "| field | meaning |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in SUMMARY_FIELDS.items()]
    lines += ["| `final_eval_<metric>` | the workload's metrics after the last epoch |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown(), end="")
