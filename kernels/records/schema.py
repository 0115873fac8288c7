"""The one schema of a run record: written by global rank 0, read by the analysis.

A record is a directory results/runs/<run_id>/ holding:
    config.json   resolved parameters + provenance (git, versions, hosts, devices, Slurm ids)
    metrics.csv   one row per completed epoch; units in the column names
    summary.json  the run's outcome; `status` says whether it is complete
    checkpoint.pt latest checkpoint (a run resumes from it), the sha256 of its bytes on its first line;
                  checkpoint.prev.pt the one before (kernels/records/checkpoint_file.py)
    failure.txt   only when a run failed and could not write its summary (a full disk): the
                  cause, written into space reserved at the start (.reserve while it runs)
    monitor.csv   the resource monitor's samples, all nodes (monitor/<node>.csv while the run lasts)
    traces/, breakdown.csv, top_ops.csv, breakdown.png   profiled runs (profile_steps > 0)
    nsys/         runs under slurm/profile_nsys.sbatch: a report per rank and summary.json, what the
                  reports say (kernels/profiling/nsight.py)
    ncu/          runs under slurm/profile_ncu.sbatch: one rank's report and summary.json, its kernels'
                  throughput and occupancy (kernels/profiling/ncu.py)
    sacct.json    Slurm's accounting of the job(s) that ran it, stored when a job's notebook ends
                  (kernels/slurm/accounting.py)
Files are written atomically (temp file + rename), so a reader never sees half a
file. Only `status == "complete"` marks a finished run: a run that failed says
"failed" with the error, one stopped on purpose says "stopped", one in progress
"running".

`lab records-doc` prints this schema as Markdown (results/README.md is
that output; a test keeps them equal).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path

from kernels.base import files
from kernels.base.files import FILE_MODE, RecordError, atomic_write_bytes  # noqa: F401 (part of the record API)

SCHEMA_VERSION = 2


# column -> meaning; `<split>_<metric>` columns for the workload's metrics
# (e.g. train_acc, eval_acc) follow the loss columns.
METRICS_COLUMNS: dict[str, str] = {
    "epoch": "epoch number, from 1",
    "steps": "optimizer steps in this epoch",
    "timed_steps": "steps counted in the timing (the first timing_warmup_steps of each process start, fresh or "
    "resumed, are excluded)",
    "samples": "training samples processed in this epoch, all ranks",
    "epoch_s": "wall time of the epoch's training steps, slowest rank, seconds (evaluation excluded)",
    "eval_s": "wall time of the evaluation after the epoch, seconds",
    "samples_per_s": "training throughput, all ranks: global batch / median step time of the epoch's timed steps (a "
    "step's time is its slowest rank's)",
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
    "peak_mem_gib": "peak memory, GiB (CUDA: max allocated on the "
    "device; CPU: max resident set of the process), max over ranks",
    "tflops_per_device": "achieved training TFLOP/s per device (counted FLOPs x samples/s per device)",
    "mfu": "model FLOPs utilisation: tflops_per_device / the device's "
    "dense peak for the precision; empty when the peak is unknown",
}

SUMMARY_FIELDS: dict[str, str] = {
    "schema_version": "record schema version",
    "run_id": "the run directory's name",
    "status": "running | complete | stopped | preempted | failed",
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
    "peak_tflops": "the device's dense peak TFLOP/s for the precision (empty when unknown or a MIG slice: "
    "config.json's peak_note says why)",
    "tflops_per_device": "achieved TFLOP/s per device at the headline throughput",
    "mfu": "tflops_per_device / peak_tflops (empty when the peak is unknown)",
    "comm_probe_sync_ms": "fwd+bwd per step with gradient all-reduce (probe after training; empty if not run, and "
    "with engine=horovod, whose hooks cannot be switched off)",
    "comm_probe_nosync_ms": "fwd+bwd per step without gradient sync (DDP no_sync)",
    "exposed_comm_ms": "communication not hidden behind backward: the median over the probe's pairs of (with sync - "
    "without), each pair after a barrier, in alternating order; empty when not distinguishable "
    "from zero (exposed_comm_status), never negative",
    "exposed_comm_status": "measured (the 90 % CI of the median difference lies above zero) or below noise",
    "exposed_comm_ci_ms": "distribution-free 90 % confidence interval [low, high] of the median difference, ms",
    "comm_probe_pairs": "timed pairs behind the probe's medians (comm_probe_steps)",
    "device_type": "cuda or cpu",
    "profile": "profile_steps > 0: the breakdown over the ranks' traces (timeline host|device, steps, "
    "profiled_ms_per_step, share and ms_per_step by category, share_range over ranks, top_ops, "
    "hidden_comm_ms_per_step on GPUs, traces, comm_crosscheck, hta status and results); see breakdown.csv",
    "monitor": "the resource monitor over the training loop: samples, hz, gpus, gpu_util_mean_pct, gpu_util_p95_pct, "
    "gpu_mem_peak_mib, gpu_power_mean_w, energy_j (GPU power integrated), cpu_util_mean_pct, "
    "cpu_util_p95_pct, host_mem_peak_gib, net_bytes, disk_bytes; GPU values empty without GPUs",
    "bottleneck": "the verdict (data | communication | compute | host-bound (launch) | unknown), its reason, the "
    "evidence (data_wait_frac, comm_frac and its source, device_util and its source, mfu) and the "
    "thresholds (kernels/profiling/verdict.py)",
    "requeues": "times Slurm requeued the job of this run (SLURM_RESTART_COUNT)",
    "host_syncs_per_step": "CUDA with sync_debug_steps > 0: host-device synchronisations per training step "
    "(torch.cuda.set_sync_debug_mode), else empty",
    "host_sync_sites": "with host_syncs_per_step: the source lines (file:line) that made those syncs, with counts",
    "cuda_graphs": "CUDA graphs of the compiled step (kernels/run/capture.py): mode (reduce-overhead or off), "
    "graphs_not_captured (compiled graphs Inductor ran without capture) and status in words",
    "checkpoints": "this attempt's checkpoints: count, async (written in a background thread), bytes, "
    "snapshot_ms_median/max (copying the state to host memory: the training loop waits for this) and "
    "write_ms_median/max (the file write and checksum: in the background when async)",
    "grad_param_bytes": "bytes of each trainable parameter's gradient, in registration order (DDP's buckets are made "
    "of them; the scaling predictor reads them)",
    "attempts": "the run's attempts: start, end, status and cause of each (a resumed run has several)",
    "checksum": "sha256 of the rest of the file; a reader refuses a file whose content does not match",
    "io": "the input pipeline's I/O over the whole run (all attempts), per rank and in total: see below",
    "ranks": "per rank: rank, host, peak_mem_gib (this rank's peak memory: device memory on a GPU, resident set on "
    "a CPU), and the workload's own per-rank figures (see below)",
    "workload": "what the workload reports about the run beyond the metrics (see below; empty for most)",
}

# summary.json "io": what the training source read and how long the ranks waited for it.
IO_FIELDS = {
    "source": "streamed-shards, dataloader-per-sample, device-resident or dataloader",
    "cache": "warm or cold (streamed); 'page cache' for the per-sample baseline; empty for in-memory sets",
    "data_bytes": "bytes of training records in the data set (streamed sets)",
    "train_s": "training wall time: the sum of the epochs' times (slowest rank), evaluation excluded",
    "bytes_read": "bytes the ranks read from storage, summed (empty when the source cannot count them)",
    "read_ratio_max_epoch": "the largest epoch's bytes read over data_bytes (1.0: every byte once per epoch)",
    "read_mb_s": "aggregate delivered read bandwidth: bytes_read / train_s, in MB/s (10^6)",
    "storage_mb_s": "sum over ranks of each rank's bytes over its time inside read calls: what storage gave",
    "samples_per_s": "the run's headline samples/s (median step), for the I/O tables",
    "data_wait_frac_max": "the largest rank's share of its step time spent waiting for data",
    "data_wait_frac_min": "the smallest rank's",
    "ranks": "per rank: rank, host, device_name, samples, bytes_read, read_s, read_calls, read_mb_s, "
    "data_wait_frac, bytes_by_epoch",
}


# sacct.json: {"jobs": {<job id>: entry}}, one entry per Slurm job that ran the record (kernels/slurm/accounting.py)
SACCT_FIELDS = {
    "job": "the Slurm job id",
    "queried_utc": "when sacct was asked (when the notebook ended: the job itself still runs, its steps are done)",
    "available": "false when the cluster keeps no accounting or sacct failed; `note` then gives sacct's own words",
    "note": "why no accounting is stored (available: false)",
    "source": "accounting database (the job and its steps) or job completion log (sacct -c: the job only, once ended)",
    "command": "the sacct command line",
    "rows": "the job, its batch step and its srun steps: job_id, name, state, exit_code, start, end, elapsed_s, nodes, "
    "tasks, cpus, max_rss_bytes and max_rss_node (empty without jobacct_gather), energy_j (ConsumedEnergyRaw; "
    "empty without acct_gather_energy)",
}


def metric_columns(metrics) -> list[str]:
    """metrics.csv's columns for a workload's metrics (kernels.workloads.Metric): train_<col>, eval_<col> pairs."""
    cols = list(METRICS_COLUMNS)
    i = cols.index("eval_loss") + 1
    extra = [c for m in metrics for tr, ev in zip(m.columns("train"), m.columns("eval")) for c in (tr, ev)]
    return cols[:i] + extra + cols[i:]


def _checksum(obj: dict) -> str:
    body = {k: v for k, v in obj.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def write_json(path: Path, obj: dict) -> None:
    """A record's JSON file, with a checksum of its content (read_json verifies it)."""
    obj = {**{k: v for k, v in obj.items() if k != "checksum"}}
    obj["checksum"] = _checksum(json.loads(json.dumps(obj, default=str)))
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode(), "results_dir")


def read_json(path: Path) -> dict:
    """A record's JSON file, checked: truncated, not JSON, or a checksum that does not match is a RecordError."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except ValueError as e:
        raise RecordError(
            f"{path} is not valid JSON ({e}); the file is truncated or corrupt: restore it, or "
            f"remove the run directory {path.parent} and run again"
        ) from None
    if not isinstance(obj, dict):
        raise RecordError(f"{path} does not hold a record (a JSON object)")
    if "checksum" in obj and obj["checksum"] != _checksum(obj):
        raise RecordError(
            f"{path}: checksum mismatch, the file was altered or damaged after it was written; "
            f"restore it, or remove the run directory {path.parent} and run again"
        )
    if "checksum" not in obj and isinstance(obj.get("schema_version"), int) and obj["schema_version"] >= 2:
        raise RecordError(
            f"{path}: no checksum, which every record of schema {obj['schema_version']} carries: it "
            f"was edited by hand or written by another program; restore it, or remove the run "
            f"directory {path.parent} and run again"
        )
    return obj


# summary.json's figures the analysis computes with: a number (finite) or null in any record it reads
SUMMARY_NUMBERS = (
    "samples_per_s",
    "samples_per_s_per_device",
    "samples_per_s_p10",
    "samples_per_s_p90",
    "final_eval_acc",
    "data_wait_frac",
    "epoch_s_median",
    "exposed_comm_ms",
    "mfu",
    "peak_mem_gib",
    "step_ms_p50",
    "step_ms_p90",
    "train_flops_per_sample",
)
METRICS_REQUIRED = ("epoch", "steps", "samples", "epoch_s")  # every metrics.csv has these


def check_types(path: Path, obj: dict, numbers=SUMMARY_NUMBERS) -> None:
    """Each of `numbers` present in `obj` is a finite number or null: a RecordError names the first that is not
    (a string, a NaN), so a record with a hand-made value is set aside instead of breaking a table."""
    import math

    for key in numbers:
        v = obj.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise RecordError(
                f"{path}: '{key}' is {v!r}, not a finite number; the record was damaged or edited: "
                f"restore it, or remove the run directory {path.parent} and run again"
            )


def check_metrics(path: Path, rows: list[dict], header: list[str]) -> None:
    """metrics.csv has the lab's columns and numbers (or empty cells) only."""
    missing = [c for c in METRICS_REQUIRED if c not in header]
    if missing:
        raise RecordError(
            f"{path}: not a metrics file of the lab (no {', '.join(missing)} column); restore it, or "
            f"remove the record {path.parent} and run again"
        )
    for i, row in enumerate(rows, 2):
        bad = [k for k, v in row.items() if isinstance(v, str)]
        if bad:
            raise RecordError(
                f"{path}: line {i}: '{bad[0]}' is {row[bad[0]]!r}, not a number; restore the file, or "
                f"remove the record {path.parent} and run again"
            )


def write_metrics(path: Path, rows: list[dict], columns: list[str]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    atomic_write_bytes(path, buf.getvalue().encode(), "results_dir")


def read_run(run_dir: Path) -> dict:
    """{'config': ..., 'summary': ..., 'metrics': list of row dicts} of one record."""
    run_dir = Path(run_dir)
    out = {"dir": str(run_dir)}
    for name in ("config", "summary"):
        p = run_dir / f"{name}.json"
        out[name] = read_json(p) if p.exists() else None
    if out["summary"] is not None:
        check_types(run_dir / "summary.json", out["summary"])
    p = run_dir / "metrics.csv"
    out["metrics"] = read_csv_rows(p) if p.exists() else []
    if p.exists():
        with open(p, newline="") as f:
            header = next(csv.reader(f), [])
        check_metrics(p, out["metrics"], header)
    return out


SIDE_CSVS = ("monitor.csv", "breakdown.csv", "top_ops.csv")  # read by the notebooks, checked by the analysis


def check_side_files(run_dir: Path) -> None:
    """The record's other CSV files are whole (each row has the header's fields): a RecordError names the first
    that is not, so a record with one damaged file is set aside as a whole instead of half-read."""
    for name in SIDE_CSVS:
        if (Path(run_dir) / name).exists():
            read_csv_rows(Path(run_dir) / name, typed=False)


def read_csv_rows(path: Path, typed: bool = True) -> list[dict]:
    """A record's CSV as rows of typed values (typed=False: checked only, no rows kept); a row cut short, with
    extra fields, or undecodable is a RecordError naming the file and the line (a file cut mid-write must not
    pass for data)."""
    path = Path(path)
    rows = []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                if None in row or None in row.values():
                    raise RecordError(
                        f"{path}: line {reader.line_num} does not have the header's "
                        f"{len(reader.fieldnames)} fields; the file is cut short or damaged: restore it, "
                        f"or remove the record {path.parent} and run again"
                    )
                if typed:
                    rows.append({k: _num(v) for k, v in row.items()})
    except (UnicodeDecodeError, csv.Error) as e:
        raise RecordError(
            f"{path} is not a readable CSV ({e}); restore it, or remove the record {path.parent} and run again"
        ) from None
    return rows


def status_of(run_dir: Path) -> str | None:
    """The record's status, or None when it has no summary yet."""
    p = Path(run_dir) / "summary.json"
    return read_json(p).get("status") if p.exists() else None


def is_complete(run_dir: Path) -> bool:
    return status_of(run_dir) == "complete"


def refuse_foreign(results_root: Path, run_dir: Path) -> None:
    """The results folder and the run's own directory must be the user's: a link planted in a shared folder, or
    a directory of another user's, would take the run's writes elsewhere. A results folder that is the user's own
    link (to scratch) is fine; a run directory is never a link (the lab makes it)."""
    from kernels.base.errors import ConfigError

    why = files.foreign(results_root, own_link_ok=True)
    if why:
        raise ConfigError(
            f"parameter 'results_dir': {why}: the lab writes only into directories of yours; pass "
            f"results_dir=<a directory you own>"
        )
    why = files.foreign(run_dir)
    if why:
        raise ConfigError(
            f"parameter 'run_id': {why}: a run directory is one the lab made for you, never a link; "
            f"remove it if it is yours, or pass another run_id"
        )


def ensure_not_complete(run_dir: Path) -> None:
    """Refuse to start over a finished record (it would be silently overwritten)."""
    from kernels.base.errors import ConfigError

    try:
        complete = is_complete(run_dir)
    except RecordError as e:
        raise ConfigError(str(e)) from None
    if complete:
        raise ConfigError(
            f"parameter 'run_id': {run_dir} is already a complete run; pass a new run_id (or none) to start another"
        )


def mark_failed(run_dir: Path, cause: str) -> bool:
    """Whoever sees a run die (its launcher, the batch script, the next attempt) marks a record left
    'running' as failed with the cause (the one the run wrote into its reserved space, when it could).
    True when it changed the record."""
    p = Path(run_dir) / "summary.json"
    try:
        summary = read_json(p) if p.exists() else None
    except RecordError:
        return False
    if not summary or summary.get("status") != "running":
        return False
    from datetime import datetime, timezone

    cause = files.failure_cause(run_dir) or cause
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    summary.update(status="failed", error=cause, finished_utc=now)
    if summary.get("attempts"):
        summary["attempts"][-1].update(status="failed", cause=cause, finished_utc=now)
    try:
        write_json(p, summary)
    except RecordError:  # a full disk: failure.txt, if the run wrote it, still says why
        return False
    files.clear_reserve(run_dir)
    return True


class RunLock:
    """One owner per run directory: a lock file holding host, pid, Slurm job id and start time.

    The lock appears whole or not at all: its content is written to a private file first, which is then
    hard-linked to the lock's name (link fails when the name exists: the O_EXCL of file systems, NFS
    included). A lock whose owner is gone (same host and the pid is dead, or its Slurm job is no longer
    running) is stale and taken over; a live one makes the second run fail fast naming the first. An
    unreadable lock is held while it is fresh (younger than UNREADABLE_STALE_S) and stale after.
    Taking over is serialised by a second lock, `.lock.break`: whoever holds it reads the lock again and
    removes it only if it is the stale one it judged, so two runs that both found it stale never both win.
    """

    NAME = ".lock"
    UNREADABLE_STALE_S = 60.0
    BREAK_STALE_S = 30.0

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / self.NAME
        self.breaker = self.path.with_name(self.NAME + ".break")
        self.held = False

    @staticmethod
    def _me() -> dict:
        import socket
        from datetime import datetime, timezone

        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def owner(self) -> dict | None:
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def _age(self, path: Path) -> float:
        import time

        try:
            return time.time() - os.lstat(path).st_mtime
        except OSError:
            return 0.0

    def stale(self, owner: dict | None) -> bool:
        import shutil
        import socket
        import subprocess

        if not owner:  # unreadable: damaged, or being written by a lab before locks were linked whole
            return self._age(self.path) > self.UNREADABLE_STALE_S
        if owner.get("slurm_job") and shutil.which("squeue"):
            p = subprocess.run(
                ["squeue", "-h", "-j", str(owner["slurm_job"]), "-o", "%T"], capture_output=True, text=True
            )
            if p.returncode == 0 and p.stdout.strip() in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                return owner.get("host") == socket.gethostname() and not _alive(owner.get("pid"))
            return True
        return owner.get("host") == socket.gethostname() and not _alive(owner.get("pid"))

    def describe(self, owner: dict | None) -> str:
        if not owner:
            return (
                f"its lock is unreadable, {self._age(self.path):.0f} s old; stale after {self.UNREADABLE_STALE_S:.0f} s"
            )
        job = f", Slurm job {owner['slurm_job']}" if owner.get("slurm_job") else ""
        return f"host {owner.get('host')} pid {owner.get('pid')}{job}, since {owner.get('started_utc')}"

    def _in_use(self, owner: dict | None):
        from kernels.base.errors import ConfigError

        return ConfigError(
            f"parameter 'run_id': {self.path.parent} is in use by another run ({self.describe(owner)}); "
            f"wait for it, pass another run_id, or remove {self.path} if that run is dead"
        )

    def _link_whole(self) -> bool:
        """Make the lock, content and all, in one step; False when it exists."""
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=f".{self.NAME}.", dir=self.path.parent)
        try:
            os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "w") as f:
                json.dump(self._me(), f)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            return True
        finally:
            os.unlink(tmp)

    def _break_stale(self, judged: bytes | None) -> None:
        """Remove the lock if it is still the stale one read as `judged`, holding the break lock meanwhile."""
        try:
            fd = os.open(self.breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, FILE_MODE)
        except FileExistsError:  # another run is taking it over; a breaker that died leaves this behind
            if self._age(self.breaker) > self.BREAK_STALE_S:
                self.breaker.unlink(missing_ok=True)
            return
        os.close(fd)
        try:
            try:
                now = self.path.read_bytes()
            except FileNotFoundError:
                return
            if now == judged:
                self.path.unlink()
        finally:
            self.breaker.unlink(missing_ok=True)

    def acquire(self) -> None:
        try:
            self._acquire()
        except OSError as e:  # read-only, immutable (chattr +i), another user's: nothing can be written there
            from kernels.base.errors import ConfigError

            raise ConfigError(
                f"parameter 'run_id': cannot write in {self.path.parent} ({e.strerror or e}): the "
                f"directory is read-only, immutable (lsattr shows 'i') or not yours; pass another "
                f"run_id or results_dir"
            ) from None

    def _acquire(self) -> None:
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(20):
            if self._link_whole():
                self.held = True
                return
            try:
                judged = self.path.read_bytes()
            except FileNotFoundError:
                continue  # released or broken meanwhile: try again
            owner = self.owner()
            if not self.stale(owner):
                raise self._in_use(owner) from None
            self._break_stale(judged)
            time.sleep(0.01 * attempt)
        raise self._in_use(self.owner())

    def check(self) -> None:
        """Fail fast (before starting ranks) when a live run holds the directory."""
        if self.path.exists():
            owner = self.owner()
            if not self.stale(owner):
                raise self._in_use(owner)

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _alive(pid) -> bool:
    """A process that exists and is not a zombie (an exited process nobody has reaped yet)."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _num(v: str):
    if v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def schema_markdown(workload_fields: dict[str, dict[str, str]] | None = None) -> str:
    lines = [
        "# Run records",
        "",
        "Generated by `lab records-doc` from kernels/records/schema.py, the one definition of the schema.",
        "",
        "Each run leaves `results/runs/<run_id>/` with `config.json` (resolved parameters and provenance: git commit",
        "and dirty flag, Python/torch/CUDA/cuDNN/NCCL versions, host names, device names, Slurm job/array ids),",
        "`metrics.csv` (one row per epoch) and `summary.json`; only `status: complete` marks a finished run.",
        "Every run also leaves `monitor.csv` (the resource monitor: one sampler per node; columns in",
        "kernels/profiling/monitor.py); a profiled run (`profile_steps > 0`) leaves "
        "`traces/rank<R>-<job>.pt.trace.json.gz`",
        "(one Chrome/Perfetto trace per rank), `breakdown.csv` (ms per step and share by operator category, per rank",
        "and `all`), `top_ops.csv` and `breakdown.png`. A run under slurm/profile_nsys.sbatch leaves `nsys/`: a",
        "report per rank and `summary.json`, the reports read back (kernels/profiling/nsight.py); one under",
        "slurm/profile_ncu.sbatch leaves `ncu/`: one rank's report and `summary.json`, its kernels' throughput",
        "against the device's peak and occupancy (kernels/profiling/ncu.py).",
        "",
        f"## metrics.csv (schema version {SCHEMA_VERSION})",
        "",
        "| column | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in METRICS_COLUMNS.items()]
    lines += [
        "| `train_<metric>`, `eval_<metric>` | the workload's metrics (e.g. `eval_acc`, a fraction; a metric "
        "with labels has one column per label, e.g. `eval_mae_15min`; an RMSE is the root of the summed "
        "squares over the summed count) |",
        "",
    ]
    lines += ["## summary.json", "", "| field | meaning |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in SUMMARY_FIELDS.items()]
    lines += ["| `final_eval_<metric>` | the workload's metrics after the last epoch |", ""]
    lines += ["### summary.json: io", "", "| field | meaning |", "|---|---|"]
    lines += [f"| `io.{k}` | {v} |" for k, v in IO_FIELDS.items()]
    for title, fields in (workload_fields or {}).items():
        lines += ["", f"### summary.json: workload and ranks ({title})", "", "| field | meaning |", "|---|---|"]
        lines += [f"| `{k}` | {v} |" for k, v in fields.items()]
    lines += [
        "",
        "## sacct.json",
        "",
        "A notebook run in a Slurm job (`slurm/papermill_run.sbatch`) stores Slurm's "
        'accounting of the job in its record when it ends, as `{"jobs": {<job id>: entry}}`; a cluster '
        "without accounting gives an entry that says so.",
        "",
        "| field | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in SACCT_FIELDS.items()]
    lines += [""]
    return "\n".join(lines)
