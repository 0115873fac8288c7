"""A run's record over its life: the run id, fresh or resume (or refuse), the lock, config.json, metrics.csv,
summary.json, and the failure mark.

Global rank 0 alone writes; every rank learns rank 0's decision. The schema is kernels/records/schema.py's.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

import torch

from kernels.records import checkpoint_file as ckpt
from kernels.base import files, sysinfo
from kernels.records import schema as records
from kernels.base.dist import all_gather_object, broadcast_object, check_distinct_gpus, gpu_uuid
from kernels.base.errors import ConfigError
from kernels.base.flops import mfu, peak_note, peak_tflops
from kernels.profiling import verdict
from kernels.run.checkpointing import LoopState
from kernels.run.metrics import peak_memory_gib, rounded
from kernels.base.stats import step_summary
from kernels.run.ids import make_run_id

# Parameters that do not change what a run computes: they may differ between attempts.
RECORD_ROOM = 16 << 20  # the record's own files (config, summary, metrics, monitor, notebooks) with room to spare
OPERATIONAL = frozenset(
    {
        "log_every",
        "timing_warmup_steps",
        "comm_probe_steps",
        "checkpoint_every",
        "stop_after_steps",
        "timeout_min",
        "startup_timeout_min",
        "hang_timeout_min",
        "sync_check_steps",
        "term_grace_s",
        "data_dir",
        "results_dir",
        "label",
        "run_id",
        "launcher",
        "allow_config_change",
        "resume_unverified",
        "oversubscribe",
        "num_workers",
        "prefetch_factor",
        "profile_steps",
        "profile_wait",
        "profile_warmup",
        "profile_with",
        "profile_memory",
        "profile_shapes",
        "profile_dir",
        "profile_hta",
        "monitor_hz",
        "sync_debug_steps",
    }
)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def config_changes(cfg, old: dict) -> list[dict]:
    """The parameters that alter the run and differ from the checkpoint's; an error unless allowed."""
    new = cfg.to_dict()
    changes = [
        {"parameter": k, "checkpoint": old.get(k), "now": new.get(k)}
        for k in sorted(set(old) | set(new))
        if k not in OPERATIONAL and old.get(k) != new.get(k)
    ]
    if changes and not cfg.allow_config_change:
        listed = ", ".join(
            f"{c['parameter']} ({c['checkpoint']!r} in the checkpoint, {c['now']!r} now)" for c in changes
        )
        raise ConfigError(
            f"resuming {cfg.results_root / make_run_id(cfg)} with changed parameters that "
            f"alter the run: {listed}. Resume with the checkpoint's values, pass another run_id to "
            f"start over, or allow_config_change=true to continue anyway (the change is recorded)"
        )
    return changes


def check_free_space(model, run_dir: Path, previous_failure: str | None = None) -> None:
    """Before anything is written: room for two checkpoints (current and previous) of this model with up to two
    optimizer moments per parameter, less what the run's checkpoints already hold (a resume), and the record."""
    tensors = [*model.parameters(), *model.buffers()]
    checkpoint = 3 * sum(t.numel() * t.element_size() for t in tensors)
    held = sum(f.stat().st_size for f in Path(run_dir).glob("checkpoint*.pt")) if Path(run_dir).exists() else 0
    need = max(0, 2 * checkpoint - held) + RECORD_ROOM
    probe, free = sysinfo.free_space(run_dir)
    if free < need:
        has, needs, each, room, there = files.sizes(free, need, checkpoint, RECORD_ROOM, held)
        why = f" (the previous attempt failed: {previous_failure})" if previous_failure else ""
        on_disk = f"; {there} of them on disk already" if held else ""
        raise ConfigError(
            f"parameter 'results_dir': {probe} has {has} free, this run needs about {needs}{why}: two "
            f"checkpoints (current and previous) of {each} each (weights and two optimizer moments"
            f"{on_disk}) and {room} for the record; free "
            f"space there or pass results_dir=<a directory with room>"
        )


class RunRecord:
    def __init__(self, cfg, renv, log):
        self.cfg, self.renv, self.log = cfg, renv, log
        self.is_rank0, self.world = renv.is_rank0, renv.world_size
        self.lock: records.RunLock | None = None
        self.owned = False  # this attempt wrote the record: it may mark it failed
        self.run_id = self.run_dir = None
        self.facts: dict = {}  # set_facts(): the device, FLOPs, metric columns
        self.attempts: list[dict] = []

    def set_facts(self, model, wl, device, name: str, flops: dict, precision: str, metric_cols: list[str]) -> None:
        """What the summary needs to know of the device (its peak for `precision`, or why it has none), the model
        and the workload's metrics (metric_cols: the loop's MetricSums.cols)."""
        cuda = device.type == "cuda"
        self.facts = {
            "device_name": name,
            "device_type": device.type,
            "flops": flops,
            "peak": peak_tflops(name, precision) if cuda else None,
            "peak_note": peak_note(name, precision) if cuda else None,
            "metric_cols": metric_cols,
            "columns": records.metric_columns(wl.metrics),
            # gradient sizes in registration order: what DDP's buckets are made of (the predictor's input)
            "grad_param_bytes": [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad],
        }

    # ------------------------------------------------------------------ open
    def open(self, device, model) -> dict | None:
        """All ranks: where each runs, rank 0's decision (fresh or resume) shared. Returns the checkpoint's state
        when resuming (rank 0 read it while deciding; the others read it here), else None."""
        self.ranks = all_gather_object(
            {
                "host": sysinfo.host(),
                "node": os.environ.get("SLURMD_NODENAME", sysinfo.host()),
                "device": self.facts["device_name"],
                "threads": torch.get_num_threads(),
                "global_rank": self.renv.global_rank,
                "local_rank": self.renv.local_rank,
                "gpu_uuid": gpu_uuid(device),
                "pid": os.getpid(),
                "cpus": sysinfo.cpu_list(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None,
            }
        )
        check_distinct_gpus(self.ranks, self.cfg.backend)
        decision, state = None, None
        if self.is_rank0:
            try:
                decision, state = self._decide(model)
            except ConfigError as e:
                decision = {"error": str(e)}
            except Exception as e:  # every rank must hear of it, or they wait at the broadcast
                decision = {"error": f"{type(e).__name__}: {e}"}
        decision = broadcast_object(decision)
        if "error" in decision:
            err = ConfigError(decision["error"])
            err.said_by_rank0 = not self.is_rank0  # one message, not one per rank (kernels/train.py)
            raise err
        self.run_id = decision["run_id"]
        self.run_dir = self.cfg.results_root / self.run_id
        self.changes, self.notes = decision["changes"], decision["notes"]
        self.attempts = decision["attempts"] + [
            {
                "started_utc": utc_now(),
                "status": "running",
                "host": sysinfo.host(),
                "slurm_job": os.environ.get("SLURM_JOB_ID"),
                "resumed_from_step": 0,
            }
        ]
        if decision["resume"] and state is None:
            state, _, _ = ckpt.load(self.run_dir, self.cfg.resume_unverified)
        return state if decision["resume"] else None

    def _decide(self, model) -> tuple[dict, dict | None]:
        """Rank 0: the run id, fresh or resume, the lock, and the checks a resume must pass."""
        cfg = self.cfg
        run_id = make_run_id(cfg)
        run_dir = cfg.results_root / run_id
        records.refuse_foreign(cfg.results_root, run_dir)
        records.ensure_not_complete(run_dir)
        resume = ckpt.exists(run_dir)
        marked = files.failure_cause(run_dir)  # what an attempt that could not finish its summary wrote
        old = records.read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
        status = old.get("status")
        failed = old.get("error") if status == "failed" else marked if status == "running" else None
        check_free_space(model, run_dir, failed)
        fresh = not run_dir.exists()
        self.lock = records.RunLock(run_dir)
        self.lock.acquire()
        decision = {"run_id": run_id, "resume": resume, "changes": [], "notes": [], "attempts": []}
        state = None
        try:
            decision["attempts"] = list(old.get("attempts") or [])
            if old.get("status") == "running":  # its lock was stale: that attempt died without a summary
                cause = marked or "ended without recording why (killed, out of memory, or a node failure)"
                if decision["attempts"]:
                    decision["attempts"][-1].update(status="failed" if marked else "died", cause=cause)
                self.log(f"note: the previous attempt of {run_id} {'failed: ' if marked else ''}{cause}")
            elif failed:
                self.log(f"note: the previous attempt of {run_id} failed: {failed}")
            if resume:
                state, used, notes = ckpt.load(run_dir, cfg.resume_unverified)
                decision["notes"] = notes + (
                    [f"resuming from the previous checkpoint, {used.name}"] if used.name == ckpt.PREVIOUS else []
                )
                decision["changes"] = config_changes(cfg, state["config"])
                if len(state["rng"]) != self.world:
                    raise ConfigError(
                        f"the checkpoint in {run_dir} was written by {len(state['rng'])} ranks, this "
                        f"run has {self.world}; resume with gpus={len(state['rng'])}"
                    )
        except BaseException:
            self.lock.release()
            if fresh:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return decision, state

    def resumed(self, state: dict) -> None:
        self.attempts[-1]["resumed_from_step"] = state["global_step"]
        for note in self.notes:
            self.log(f"warning: {note}")
        for c in self.changes:
            self.log(
                f"warning: {c['parameter']} changed from {c['checkpoint']!r} to {c['now']!r} "
                f"(allow_config_change); recorded in config.json"
            )
        self.log(
            f"resuming {self.run_id} from epoch {state['epoch'] + 1} step {state['step_in_epoch']} "
            f"(global step {state['global_step']})"
        )

    def write_config(self, st: LoopState, derived: dict) -> None:
        """Rank 0: the run directory and config.json (resolved parameters and provenance)."""
        if not self.is_rank0:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.owned = True
        files.reserve_space(self.run_dir)  # for the record of a failure on a full disk (fail())
        ranks = self.ranks
        records.write_json(
            self.run_dir / "config.json",
            {
                "schema_version": records.SCHEMA_VERSION,
                "run_id": self.run_id,
                "params": self.cfg.to_dict(),
                "derived": {"world_size": self.world, **derived, "nodes": len({x["node"] for x in ranks})},
                "git": sysinfo.git_info(),
                "versions": sysinfo.software_versions(),
                "hosts": sorted({x["host"] for x in ranks}),
                "nodes": sorted({x["node"] for x in ranks}),
                "devices": sorted({x["device"] for x in ranks}),
                "ranks": ranks,
                "slurm": sysinfo.slurm_ids(),
                "config_changes": self.changes,
                "system": sysinfo.node_facts(),
                "lab": sysinfo.lab_ids(),
                "command": sys.argv,
                "started_utc": st.started_utc,
            },
        )

    def write_rows(self, rows: list[dict]) -> None:
        if self.is_rank0:
            records.write_metrics(self.run_dir / "metrics.csv", rows, self.facts["columns"])

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    # ------------------------------------------------------------------ summary
    def write_summary(self, status: str, st: LoopState, seen: dict, error: str | None = None) -> dict | None:
        """Rank 0: summary.json. seen: what the observers measured (probe, profile, monitor, io, workload, ranks,
        checkpoints, host_syncs_per_step); a failed or running record has what there is so far."""
        if not self.is_rank0:
            return None
        f, rows, t = self.facts, st.rows, st.timing
        summary = {
            "schema_version": records.SCHEMA_VERSION,
            "run_id": self.run_id,
            "status": status,
            "error": error,
            "started_utc": st.started_utc,
            "finished_utc": utc_now() if status != "running" else None,
            "resumed_from_step": st.resumed_from_step,
            "epochs_done": len(rows),
            "steps_done": st.global_step,
            "world_size": self.world,
            "device_name": f["device_name"],
            **self._throughput(t, rows),
        }
        summary.update(
            checkpoints=seen.get("checkpoints"),
            host_syncs_per_step=seen.get("host_syncs_per_step"),
            host_sync_sites=seen.get("host_sync_sites"),
            cuda_graphs=seen.get("cuda_graphs"),
        )
        summary.update(seen.get("probe") or {})
        mon, prof = dict(seen.get("monitor") or {}), seen.get("profile")
        contention = mon.pop("contention", None)  # did foreign work share this run's cores or GPUs, with evidence
        mon = mon or None
        summary.update(device_type=f["device_type"], profile=prof, monitor=mon, contention=contention)
        summary["bottleneck"] = (
            verdict.decide(summary, mon, prof if prof and prof.get("share") else None) if status != "running" else None
        )
        io = seen.get("io")  # the run's headline beside the I/O figures, for the I/O tables
        summary["io"] = {**io, "samples_per_s": summary["samples_per_s"]} if io else None
        summary["workload"], summary["ranks"] = seen.get("workload"), seen.get("ranks")
        for c in f["metric_cols"]:
            summary[f"final_eval_{c}"] = rows[-1][f"eval_{c}"] if rows else None
        self.attempts[-1].update(
            status=status, finished_utc=summary["finished_utc"], cause=error, steps_done=st.global_step
        )
        summary["attempts"] = self.attempts
        records.write_json(self.run_dir / "summary.json", summary)
        if status != "running":
            files.clear_reserve(self.run_dir)  # the summary says how the run ended
        return summary

    def fail(self, exc: BaseException, summarise) -> None:
        """Rank 0: the record of a failure (summarise(error) writes the summary). On a full disk the cause goes
        into the space reserved at the start first, which frees room for the summary; when even that cannot be
        written, failure.txt tells the launcher and the next attempt why."""
        error = files.failure_text(exc)
        files.record_failure(self.run_dir, error)
        try:
            summarise(error)
        except OSError as e:
            self.log(
                f"error: the summary of {self.run_id} could not be written ({e}); {files.FAILURE} "
                f"there says why the run failed"
            )

    def _throughput(self, t: dict, rows: list[dict]) -> dict:
        """The headline figures over all timed steps of the run (slowest rank per step), and the FLOP facts."""
        f, batch = self.facts, self.cfg.batch
        run_stats = step_summary(t["step_ms"], batch)
        tput = run_stats["samples_per_s"]
        per_dev = tput / self.world if tput else None
        tflops = per_dev * f["flops"]["train_flops_per_sample"] / 1e12 if per_dev else None
        steady = rows[1:] if len(rows) > 1 else rows  # the first epoch carries start-up effects
        n = t["timed_steps"]
        return {
            "throughput_stat": (f"global batch / median step time over {n} timed steps (slowest rank per step)")
            if n
            else "no timed steps",
            "timed_steps": n,
            "samples_per_s": rounded(tput),
            "samples_per_s_p10": rounded(run_stats["samples_per_s_p10"]),
            "samples_per_s_p90": rounded(run_stats["samples_per_s_p90"]),
            "samples_per_s_mean": rounded(n * batch * 1e3 / t["sum_step_ms"] if t["sum_step_ms"] else None),
            "samples_per_s_per_device": rounded(per_dev),
            "step_ms_p50": rounded(run_stats["step_ms_p50"]),
            "step_ms_p10": rounded(run_stats["step_ms_p10"]),
            "step_ms_p90": rounded(run_stats["step_ms_p90"]),
            "step_ms_mean": rounded(t["sum_step_ms"] / n if n else None),
            "epoch_s_median": rounded(median(x["epoch_s"] for x in steady) if steady else None),
            "data_wait_frac": rounded(t["sum_wait_ms"] / t["sum_step_ms"] if t["sum_step_ms"] else None, 5),
            "final_eval_loss": rows[-1]["eval_loss"] if rows else None,
            "peak_mem_gib": max((x["peak_mem_gib"] for x in rows), default=None),
            **f["flops"],
            "peak_tflops": f["peak"],
            "tflops_per_device": rounded(tflops, 5),
            "mfu": rounded(mfu(per_dev, f["flops"]["train_flops_per_sample"], f["peak"]), 5),
            "comm_probe_sync_ms": None,
            "comm_probe_nosync_ms": None,
            "exposed_comm_ms": None,
            "exposed_comm_status": None,
            "exposed_comm_ci_ms": None,
            "comm_probe_pairs": None,
            "requeues": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "checkpoints": None,
            "host_syncs_per_step": None,
            "grad_param_bytes": f["grad_param_bytes"],
        }


def workload_report(wl, model, info, rank: int, device) -> dict:
    """The workload's part of the summary: rank 0's shared entry, and one entry per rank (its memory and its own
    part): {"workload": ..., "ranks": [...]}."""
    mine = wl.report(model, info) if wl.report is not None else {}
    entry = {
        "rank": rank,
        "host": sysinfo.host(),
        "peak_mem_gib": round(peak_memory_gib(device), 4),
        **(mine.get("rank") or {}),
    }
    return {"workload": mine.get("shared"), "ranks": sorted(all_gather_object(entry), key=lambda x: x["rank"])}
