"""The thin DDP/AMP training loop: one call per rank.

    env -> device -> process group -> data -> model (+ FLOP count) -> DDP -> loop
        -> per-epoch eval + record row + checkpoint -> comm probe -> summary -> teardown

The same code runs on 1 CPU process, N gloo processes, 1 GPU, N GPUs and N
nodes; only the device and the backend differ. The loop knows nothing about the
workload beyond the `Workload` interface. Every reported scalar is reduced over
ranks; global rank 0 alone writes files.
"""
from __future__ import annotations

import copy
import faulthandler
import inspect
import os
import resource
import secrets
import shutil
import signal
import sys
import threading
import time
import traceback
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from kernels import checkpoint as ckpt
from kernels import records, sysinfo
from kernels.dist import (all_gather_object, all_reduce, broadcast_object, check_distinct_gpus, gpu_uuid,
                          process_group, rank_env, select_device)
from kernels.flops import mfu, model_flops_per_sample, peak_tflops
from kernels.params import ConfigError, RunConfig, device_type
from kernels.profiling import monitor as res_monitor
from kernels.profiling import verdict
from kernels.profiling.trace import StepProfiler
from kernels.stats import median_ci, step_summary, thin
from kernels.timers import StepTimer, synchronize
from kernels.workloads import get_workload

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def make_run_id(cfg: RunConfig, environ=None) -> str:
    """A readable, unique id. Under Slurm it is derived from the job id, so a
    requeued job finds its checkpoint and resumes."""
    env = os.environ if environ is None else environ
    if cfg.run_id:
        return cfg.run_id
    workload = get_workload(cfg.workload).name  # a plug-in's own name, not its module:OBJECT spec
    parts = [workload, cfg.dataset, f"g{cfg.gpus}"] + ([cfg.label] if cfg.label else [])
    if "SLURM_JOB_ID" in env:
        job = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
        task = f"_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in env else ""
        return "-".join(parts + [f"j{job}{task}"])
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return "-".join([stamp] + parts + [secrets.token_hex(2)])


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Terminated(Exception):
    """SIGTERM arrived and no step boundary came within term_grace_s: stopped without a checkpoint."""


class NonFiniteLoss(Exception):
    """The training loss became NaN or infinite."""


class StopSignals:
    """USR1 (Slurm's warning before a time limit or preemption) and TERM (scancel, a time limit) ask the
    run to stop; the ranks agree at the next check (every sync_check_steps steps), checkpoint, and record
    'preempted'. TERM also arms an alarm: if no boundary comes within term_grace_s (a rank is stuck), the
    rank stops anyway and records 'failed'."""

    def __init__(self, term_grace_s: float):
        self.request: str | None = None
        self.grace = max(1, int(term_grace_s))
        # the batch script leaves this file when its warning came before the ranks could be signalled
        self.stop_file = os.environ.get("LAB_STOP_FILE")
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_usr1(self, signum, frame):
        self.request = self.request or "SIGUSR1 (the scheduler's warning before the time limit or a preemption)"

    def _on_term(self, signum, frame):
        if self.request is None or "SIGTERM" not in self.request:
            self.request = "SIGTERM (a time limit, scancel, or the launcher stopping the ranks)"
            signal.alarm(self.grace)

    def pending(self) -> str | None:
        if self.request is None and self.stop_file and os.path.exists(self.stop_file):
            self.request = "the batch script's stop file (SIGUSR1 came before the ranks could get it)"
        return self.request

    def _on_alarm(self, signum, frame):
        raise Terminated(f"terminated by signal {signal.SIGTERM.value} and no step boundary within "
                         f"term_grace_s={self.grace} s: stopped without a checkpoint")


class Watchdog(threading.Thread):
    """A rank that makes no progress (no step, evaluation batch or checkpoint) for too long is hung:
    dump every thread's Python stack to stderr, record the failure (rank 0) and end the process,
    so that its launcher or srun ends the run. Before the first step the startup limit applies."""

    def __init__(self, startup_s: float, hang_s: float, on_hang):
        super().__init__(daemon=True, name="lab-watchdog")
        self.startup_s, self.hang_s, self.on_hang = startup_s, hang_s, on_hang
        self.last, self.started, self.stopped = time.monotonic(), False, False

    def beat(self, step: bool = False) -> None:
        self.last = time.monotonic()
        self.started = self.started or step

    def run(self) -> None:
        while not self.stopped:
            limit = self.hang_s if self.started else self.startup_s
            idle = time.monotonic() - self.last
            if idle > limit:
                what = "no step, evaluation batch or checkpoint" if self.started else "no first step"
                self.on_hang(f"{what} for {idle:.0f} s (limit {limit:.0f} s, "
                             f"{'hang' if self.started else 'startup'}_timeout_min): the rank is hung")
                return
            time.sleep(min(5.0, max(0.2, limit / 20)))


EXIT_HUNG = 70


def run(cfg: RunConfig) -> str:
    """Run this process's rank of `cfg`. Returns the run's status (the same on every rank)."""
    stops = StopSignals(cfg.term_grace_s)
    renv = rank_env()
    if renv.world_size != cfg.gpus:
        raise ConfigError(
            f"parameter 'gpus': gpus={cfg.gpus} but the launcher started {renv.world_size} rank(s) "
            f"({renv.source}); make them agree (e.g. srun --ntasks={cfg.gpus})")
    device = select_device(device_type(cfg), renv.local_rank)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    with process_group(renv, device, cfg.timeout_min, cfg.startup_timeout_min) as backend:
        return Trainer(cfg, renv, device, backend, stops).run()


class Trainer:
    def __init__(self, cfg: RunConfig, renv, device: torch.device, backend: str, stops: StopSignals | None = None):
        self.cfg, self.renv, self.device, self.backend = cfg, renv, device, backend
        self.stops = stops or StopSignals(cfg.term_grace_s)
        self.is_rank0 = renv.is_rank0
        self.world = renv.world_size
        self.wl = get_workload(cfg.workload)
        self.run_dir: Path | None = None
        self.lock: records.RunLock | None = None
        self.owns_record = False  # this attempt wrote the record: it may mark it failed
        self.watchdog = Watchdog(cfg.startup_timeout_min * 60, cfg.hang_timeout_min * 60, self._hung)
        self.watchdog.start()

    def log(self, msg: str) -> None:
        if self.is_rank0:
            print(msg, flush=True)

    # ---------------------------------------------------------------- setup
    def _prepare(self):
        cfg, wl, dev = self.cfg, self.wl, self.device
        seed_everything(cfg.seed)
        self.train_src, self.eval_src, info = wl.make_data(cfg, self.renv.global_rank, self.world, dev)
        if self.train_src.num_samples < cfg.batch:
            raise ConfigError(
                f"parameter 'batch': the training set has {self.train_src.num_samples} samples, fewer than one global "
                f"batch of {cfg.batch}; lower batch or raise train_samples")
        model, self.variant = wl.build_model(cfg, info)
        model = model.to(dev)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model

        # FLOPs per sample from the model itself on real samples, on a throw-away copy so
        # that BatchNorm statistics of the real model are untouched.
        probe_x, probe_y = self.train_src.probe(2)
        self.flops = model_flops_per_sample(copy.deepcopy(model), probe_x, wl.loss, probe_y,
                                            forward=lambda m, x, y: wl.forward(m, x, y, 0, True))
        # gradient sizes in registration order: what DDP's buckets are made of (the scaling predictor's input)
        self.grad_param_bytes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
        self.device_name = sysinfo.device_name(dev)
        self.peak = peak_tflops(self.device_name, cfg.precision) if dev.type == "cuda" else None

        self.hvd = None
        if cfg.engine == "horovod":  # Horovod averages the gradients; the model itself is not wrapped
            from kernels.comm.horovod import Engine

            self.hvd = Engine(cfg)
            self.hvd.check_world(self.renv.global_rank, self.world)
            self.ddp = model
        else:
            # No buffer sync before each forward: BatchNorm statistics are per rank (each normalises its own
            # batch); DDP's default would broadcast rank 0's before every forward, a collective per step for nothing.
            # Every rank's buffers go into the checkpoint and are loaded after this wrap, so a resumed run continues
            # each rank's own. torch >= 2.13 names the setting forward_sync_buffers (and warns on the old name).
            no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                       else {"broadcast_buffers": False})
            self.ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                           bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                           **no_sync)
        # Weights are initialised from the common seed (and DDP broadcasts rank 0's anyway); from
        # here on each rank draws its own random numbers (dropout), or all ranks would drop the
        # same units of their different samples.
        torch.manual_seed(cfg.seed * 1_000_003 + 7919 * (self.renv.global_rank + 1))
        self.train_model = torch.compile(self.ddp) if cfg.compile else self.ddp
        self.steps_per_epoch = self.train_src.steps_per_epoch
        if cfg.profile_steps:
            end = cfg.profile_wait + cfg.profile_warmup + cfg.profile_steps
            total = cfg.epochs * self.steps_per_epoch
            if end > total:
                raise ConfigError(
                    f"parameter 'profile_steps': the profiled window ends at step {end} (profile_wait "
                    f"{cfg.profile_wait} + profile_warmup {cfg.profile_warmup} + profile_steps {cfg.profile_steps}) "
                    f"but the run has {total} steps ({cfg.epochs} epoch(s) of {self.steps_per_epoch}); no step would "
                    f"be profiled: lower profile_wait or profile_steps, or raise epochs")
        self.recipe = wl.build_optimizer(cfg, model, self.steps_per_epoch)
        if self.recipe.schedule_unit not in ("step", "epoch"):
            raise ValueError(f"workload {wl.name}: schedule_unit must be 'step' or 'epoch'")
        self.opt, self.sched = self.recipe.optimizer, self.recipe.scheduler
        if self.hvd is not None:
            self.opt = self.hvd.wrap(model, self.opt, cfg.micro_batches)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "fp16")
        self.autocast = (torch.autocast(dev.type, dtype=DTYPES[cfg.precision])
                         if cfg.precision in DTYPES else nullcontext())
        self.metric_cols = [c.removeprefix("eval_") for m in wl.metrics for c in m.columns("eval")]
        self.metric_root = [m.root for m in wl.metrics for _ in m.columns("eval")]
        self.data_info = info
        self.columns = records.metric_columns(wl.metrics)
        self.local = {"wait_ms": 0.0, "step_ms": 0.0, "steps": 0}  # this rank's own timed steps (I/O section)
        self.ckpt_costs: list[dict] = []  # rank 0: snapshot and write time of each checkpoint of this attempt
        self.ckpt_writer, self.ckpt_error = None, None

    def _check_free_space(self, run_dir: Path) -> None:
        """Before anything is written: room for two checkpoints (current and previous) of this model with
        up to two optimizer moments per parameter, and the record."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        need = 2 * 3 * sum(t.numel() * t.element_size() for t in tensors) + (16 << 20)
        probe, free = sysinfo.free_space(run_dir)
        if free < need:
            raise ConfigError(f"parameter 'results_dir': {probe} has {free / 2**20:,.0f} MiB free, this run needs "
                              f"about {need / 2**20:,.0f} MiB for its checkpoints and record; free space there or "
                              f"pass results_dir=<a directory with room>")

    def _decide(self) -> dict:
        """Rank 0: the run id, fresh or resume, the lock, and the checks a resume must pass."""
        cfg = self.cfg
        run_id = make_run_id(cfg)
        run_dir = cfg.results_root / run_id
        records.ensure_not_complete(run_dir)
        resume = ckpt.exists(run_dir)
        if not resume:
            self._check_free_space(run_dir)
        fresh = not run_dir.exists()
        self.lock = records.RunLock(run_dir)
        self.lock.acquire()
        decision = {"run_id": run_id, "resume": resume, "changes": [], "notes": [], "attempts": []}
        try:
            old = records.read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
            decision["attempts"] = list(old.get("attempts") or [])
            if old.get("status") == "running":  # its lock was stale: that attempt died without a word
                cause = "ended without recording why (killed, out of memory, or a node failure)"
                if decision["attempts"]:
                    decision["attempts"][-1].update(status="died", cause=cause)
                self.log(f"note: the previous attempt of {run_id} {cause}")
            if resume:
                state, used, notes = ckpt.load(run_dir)
                decision["notes"] = notes
                decision["changes"] = self._config_changes(state["config"])
                if len(state["rng"]) != self.world:
                    raise ConfigError(f"the checkpoint in {run_dir} was written by {len(state['rng'])} ranks, this "
                                      f"run has {self.world}; resume with gpus={len(state['rng'])}")
                self._resume_state = state
        except BaseException:
            self.lock.release()
            if fresh:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return decision

    # Parameters that do not change what a run computes: they may differ between attempts.
    OPERATIONAL = frozenset({"log_every", "timing_warmup_steps", "comm_probe_steps", "checkpoint_every",
                             "stop_after_steps", "timeout_min", "startup_timeout_min", "hang_timeout_min",
                             "sync_check_steps", "term_grace_s", "data_dir", "results_dir", "label", "run_id",
                             "launcher", "allow_config_change", "oversubscribe", "num_workers", "prefetch_factor",
                             "profile_steps", "profile_wait", "profile_warmup", "profile_with", "profile_memory",
                             "profile_shapes", "profile_dir", "profile_hta", "monitor_hz", "sync_debug_steps"})

    def _config_changes(self, old: dict) -> list[dict]:
        new = self.cfg.to_dict()
        changes = [{"parameter": k, "checkpoint": old.get(k), "now": new.get(k)}
                   for k in sorted(set(old) | set(new)) if k not in self.OPERATIONAL and old.get(k) != new.get(k)]
        if changes and not self.cfg.allow_config_change:
            listed = ", ".join(f"{c['parameter']} ({c['checkpoint']!r} in the checkpoint, {c['now']!r} now)"
                               for c in changes)
            raise ConfigError(f"resuming {self.cfg.results_root / make_run_id(self.cfg)} with changed parameters that "
                              f"alter the run: {listed}. Resume with the checkpoint's values, pass another run_id to "
                              f"start over, or allow_config_change=true to continue anyway (the change is recorded)")
        return changes

    def _open_record(self):
        """Decide run id, fresh vs resume; rank 0 takes the lock and creates the directory. All ranks agree."""
        cfg = self.cfg
        # where every rank runs (its GPU and the CPUs it may use), checked before anything is written
        self.rank_facts = all_gather_object({
            "host": sysinfo.host(), "node": os.environ.get("SLURMD_NODENAME", sysinfo.host()),
            "device": self.device_name, "threads": torch.get_num_threads(), "global_rank": self.renv.global_rank,
            "local_rank": self.renv.local_rank, "gpu_uuid": gpu_uuid(self.device),
            "cpus": sysinfo.cpu_list(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None})
        check_distinct_gpus(self.rank_facts)
        decision = None
        self._resume_state = None
        if self.is_rank0:
            try:
                decision = self._decide()
            except ConfigError as e:
                decision = {"error": str(e)}
            except Exception as e:  # every rank must hear of it, or they wait at the broadcast
                decision = {"error": f"{type(e).__name__}: {e}"}
        decision = broadcast_object(decision)
        if "error" in decision:
            raise ConfigError(decision["error"])
        self.run_id = decision["run_id"]
        self.run_dir = cfg.results_root / self.run_id
        self.config_changes = decision["changes"]
        self.state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "rows": [], "timing": _zero_timing(),
                      "started_utc": utc_now(), "resumed_from_step": 0, "partial_sums": None}
        self.attempts = decision["attempts"] + [{"started_utc": utc_now(), "status": "running",
                                                  "host": sysinfo.host(), "slurm_job": os.environ.get("SLURM_JOB_ID"),
                                                  "resumed_from_step": 0}]
        if decision["resume"]:
            state = self._resume_state
            if state is None:
                state, _, _ = ckpt.load(self.run_dir)
            self._resume_state = None
            self.model.load_state_dict(state["model"])
            mine_buffers = (state.get("rank_buffers") or [None] * self.world)[self.renv.global_rank]
            if mine_buffers:  # this rank's own BatchNorm statistics (DDP does not broadcast buffers)
                with torch.no_grad():
                    for k, v in self.model.named_buffers():
                        v.copy_(mine_buffers[k])
            self.opt.load_state_dict(state["optimizer"])
            if self.hvd is not None:
                self.hvd.broadcast_state(self.opt)
            self.scaler.load_state_dict(state["scaler"])
            self.sched.load_state_dict(state["scheduler"])
            ckpt.set_rng_state(state["rng"][self.renv.global_rank])
            for k in ("epoch", "step_in_epoch", "global_step", "rows", "timing", "started_utc"):
                self.state[k] = state[k]
            partial = state.get("partial_sums")  # one list of sums per rank: each rank resumes its own
            self.state["partial_sums"] = partial[self.renv.global_rank] if partial else None
            mine = (state.get("io") or [None] * self.world)[self.renv.global_rank]
            if mine:
                self.local = {k: mine.get(k, 0) for k in self.local}
                if hasattr(self.train_src, "restore"):
                    self.train_src.restore(mine.get("source"))
            self.state["resumed_from_step"] = self.attempts[-1]["resumed_from_step"] = state["global_step"]
            for note in decision["notes"]:
                self.log(f"warning: {note}; resumed from the previous checkpoint")
            for c in self.config_changes:
                self.log(f"warning: {c['parameter']} changed from {c['checkpoint']!r} to {c['now']!r} "
                         f"(allow_config_change); recorded in config.json")
            self.log(f"resuming {self.run_id} from epoch {state['epoch'] + 1} step {state['step_in_epoch']} "
                     f"(global step {state['global_step']})")
        hosts = self.rank_facts
        if self.is_rank0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.owns_record = True
            records.write_json(self.run_dir / "config.json", self._config_record(hosts))
            self._write_summary("running")
        dist.barrier()
        self.watchdog.beat()

    def _config_record(self, ranks: list[dict]) -> dict:
        cfg = self.cfg
        return {
            "schema_version": records.SCHEMA_VERSION,
            "run_id": self.run_id,
            "params": cfg.to_dict(),
            "derived": {
                "world_size": self.world, "per_rank_batch": cfg.per_rank_batch,
                "micro_batch": cfg.per_rank_batch // cfg.micro_batches,
                "steps_per_epoch": self.steps_per_epoch, "train_samples_used": self.train_src.num_samples,
                "test_samples_used": self.eval_src.num_samples,
                "dropped_per_epoch": self.train_src.dropped_per_epoch, "data_source": self.train_src.describe(),
                "backend": self.backend, "device_type": self.device.type, "launch_source": self.renv.source,
                "model_variant": self.variant, "tf32": self.device.type == "cuda",
                **self.flops, "peak_tflops": self.peak,
                "nodes": len({r["node"] for r in ranks}),
                **(self.hvd.facts() if self.hvd is not None else {"engine": "ddp"}),
            },
            "git": sysinfo.git_info(),
            "versions": sysinfo.software_versions(),
            "hosts": sorted({r["host"] for r in ranks}),
            "nodes": sorted({r["node"] for r in ranks}),
            "devices": sorted({r["device"] for r in ranks}),
            "ranks": ranks,
            "slurm": sysinfo.slurm_ids(),
            "config_changes": self.config_changes,
            "system": sysinfo.node_facts(),
            "lab": sysinfo.lab_ids(),
            "command": sys.argv,
            "started_utc": self.state["started_utc"],
        }

    # ----------------------------------------------------------------- loop
    def run(self) -> str:
        try:
            self._prepare()
            self.watchdog.beat()
            self._open_record()
            self._start_monitor()
            status = self._train()
            if self.is_rank0:
                self._wait_checkpoint()  # a stopped or finished run's last checkpoint is on disk before its record
            probe = self._comm_probe() if status == "complete" else {}
            self.profile = self._collect_profile(probe)
            self.io = self._io_summary(all_gather_object(self._io_state()))
            self.workload_report = self._workload_report()
            self._stop_monitor()
            self._write_summary(status, probe, error=self.stop_note if status == "preempted" else None)
            if status == "complete":  # the lines Horovod's synthetic benchmark prints, for scripts that grep them
                from kernels.comm.horovod import seed_lines

                t = self.state["timing"]["step_ms"]
                for line in seed_lines([self.cfg.batch * 1e3 / x for x in t if x > 0], self.world,
                                       self.device.type == "cuda"):
                    self.log(line)
            self.log(f"{status}: {self.run_dir}")
            return status
        except BaseException as e:
            if self.is_rank0 and self.owns_record:
                self._write_summary("failed", error=f"{type(e).__name__}: {e}")
                traceback.print_exc()
            raise
        finally:
            self.watchdog.stopped = True
            self._stop_monitor()
            writer = getattr(self, "ckpt_writer", None)
            if writer is not None:  # an error path: let a write in progress finish (its file is atomic either way)
                writer.join()
            if self.lock is not None:
                self.lock.release()
            close = getattr(getattr(self, "train_src", None), "close", None)
            if close is not None:
                close()  # reader threads and open shards

    @property
    def trace_dir(self) -> Path:
        return Path(self.cfg.profile_dir) / self.run_id if self.cfg.profile_dir else self.run_dir / "traces"

    # ------------------------------------------------------- monitor, profile
    def _start_monitor(self) -> None:
        """Local rank 0 of each node samples its node (GPUs and host) into monitor/<node>.csv."""
        self.monitor = None
        if self.cfg.monitor_hz and self.renv.local_rank == 0:
            node = self.rank_facts[self.renv.global_rank]["node"]
            self.monitor = res_monitor.Monitor(self.run_dir / "monitor" / f"{node}.csv", node, self.cfg.monitor_hz)
            self.monitor.start()

    def _stop_monitor(self) -> None:
        mon, self.monitor = getattr(self, "monitor", None), None
        if mon is not None:
            mon.stop()

    def _collect_profile(self, probe: dict) -> dict | None:
        """Each rank analyses its own trace; rank 0 writes the breakdown files, runs HTA, returns the summary."""
        from kernels.profiling import breakdown, collect

        prof = getattr(self, "prof", None)
        if prof is None or not prof.active or prof.external:
            return None
        mine = None
        if prof.trace_path is not None:
            try:
                mine = breakdown.analyse(prof.trace_path)
                mine["rank"] = self.renv.global_rank
                mine["trace_path"] = str(prof.trace_path)
            except ValueError as e:
                self.log(f"profile: rank {self.renv.global_rank}'s trace could not be analysed: {e}")
        per_rank = all_gather_object(mine)
        if not self.is_rank0:
            return None
        got = [r for r in per_rank if r is not None]
        if not got:
            return {"status": "no trace: the profiled window did not complete"}
        if len(got) < len(per_rank):
            self.log(f"profile: {len(per_rank) - len(got)} rank(s) left no trace; the breakdown covers {len(got)}")
        traces = {r["rank"]: Path(r.pop("trace_path")) for r in got}
        out = collect.write(self.run_dir, got, traces, self.cfg.profile_hta, probe,
                            title=f"{self.run_id}: {self.world} rank(s) on {self.device_name}")
        self.log(f"profile: {out['steps']} step(s) x {len(got)} rank(s), {out['profiled_ms_per_step']:.1f} ms per "
                 f"step ({out['timeline']} timeline): " + ", ".join(
                     f"{c} {100 * v:.1f}%" for c, v in sorted(out["share"].items(), key=lambda kv: -kv[1])[:5]))
        self.log(f"profile: {out['comm_crosscheck']}; HTA {out['hta']['status']}")
        return {"status": "complete", **out}

    def _hung(self, why: str) -> None:
        """The watchdog's verdict: stacks to stderr, the record says failed, and the process ends."""
        print(f"rank {self.renv.global_rank}: {why}; Python stacks of every thread follow", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if self.is_rank0 and self.owns_record:
            try:
                self._write_summary("failed", error=f"hung: {why}")
            except Exception as e:  # the record is best effort here; the exit status is not
                print(f"could not record the hang: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_HUNG)

    def _agree(self, sums: torch.Tensor) -> str | None:
        """All ranks agree, in one small all-reduce, whether any was asked to stop or saw a non-finite loss.

        Called every sync_check_steps steps and at each epoch's end: the only host sync it
        adds is that one read of the result.
        """
        with self.prof.maybe("communication") if getattr(self, "prof", None) else nullcontext():
            return self._agree_flags(sums)

    def _agree_flags(self, sums: torch.Tensor) -> str | None:
        flags = torch.stack([torch.ones((), dtype=torch.float64, device=self.device) * (self.stops.pending() is not None),
                             (~torch.isfinite(sums[0])).double()])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, nonfinite = flags.tolist()
        if nonfinite:
            raise NonFiniteLoss(f"the training loss became non-finite by global step {self.state['global_step']} "
                                f"(epoch {self.state['epoch'] + 1}); lower lr, check the data, or use fp32")
        if stop:
            why = self.stops.request or "another rank's stop request"
            self.stop_note = (f"stopped by {why} at global step {self.state['global_step']} after a checkpoint; "
                              f"the same run_id resumes it (a requeued Slurm job does so by itself)")
            return "preempted"
        return None

    def _train(self) -> str:
        cfg = self.cfg
        timer = StepTimer(self.device)
        self.prof = prof = StepProfiler(cfg, self.device, self.renv.global_rank, self.trace_dir, self.log)
        profiled = (range(cfg.profile_wait, cfg.profile_wait + cfg.profile_warmup + cfg.profile_steps)
                    if cfg.profile_steps else range(0))
        self.train_window = [time.time(), None]
        self.syncs = (SyncCounter(cfg.timing_warmup_steps, cfg.sync_debug_steps)
                      if cfg.sync_debug_steps and self.device.type == "cuda" else None)
        try:
            return self._epochs(timer, prof, profiled)
        finally:
            prof.close()
            if self.syncs is not None:
                self.syncs.stop()
            self.train_window[1] = time.time()

    def _epochs(self, timer: StepTimer, prof: StepProfiler, profiled: range) -> str:
        cfg, st = self.cfg, self.state
        steps_this_attempt = 0  # warm-up (compilation, autotuning) recurs in every new process
        for epoch in range(st["epoch"], cfg.epochs):
            self.ddp.train()
            sums = self._zero_sums()
            start = st["step_in_epoch"]
            if start and st["partial_sums"]:  # an interrupted epoch: its loss and metric sums so far
                sums += torch.tensor(st["partial_sums"], dtype=torch.float64, device=self.device)
            st["partial_sums"] = None
            if self.device.type == "cuda":  # each epoch's row reports that epoch's peak
                torch.cuda.reset_peak_memory_stats(self.device)
            synchronize(self.device)
            t_epoch = time.perf_counter()
            batches = self.train_src.batches(epoch, start)
            step = start
            while True:
                if self.syncs is not None:
                    self.syncs.at_step(steps_this_attempt)
                timer.start()
                with prof.maybe("data"):
                    batch = next(batches, None)
                if batch is None:
                    break
                timer.data_ready()
                self._step(*batch, sums, st["global_step"])
                # profiled steps (the profiler's warm-up and active steps, and the trace export) are not timed
                timer.done(timed=steps_this_attempt >= cfg.timing_warmup_steps and steps_this_attempt not in profiled)
                prof.step()
                steps_this_attempt += 1
                st["global_step"] += 1
                step += 1
                self.watchdog.beat(step=True)
                if cfg.log_every and step % cfg.log_every == 0:
                    self.log(f"epoch {epoch + 1}/{cfg.epochs} step {step}/{self.steps_per_epoch} "
                             f"loss {float(sums[0] / max(float(sums[1]), 1)):.4f} lr {self.sched.get_last_lr()[0]:.4g}")
                if step < self.steps_per_epoch:
                    stop = self._agree(sums) if st["global_step"] % cfg.sync_check_steps == 0 else None
                    if stop is None and cfg.stop_after_steps and st["global_step"] >= cfg.stop_after_steps:
                        stop = "stopped"
                    if stop:
                        return self._stop_mid_epoch(epoch, step, sums, stop)
            synchronize(self.device)
            epoch_s = time.perf_counter() - t_epoch
            stop = self._agree(sums)  # the whole epoch's loss is finite, and nobody asked to stop
            if self.recipe.schedule_unit == "epoch":
                self.sched.step()
            wait, comp = timer.collect()
            t_eval = time.perf_counter()
            last = epoch + 1 == cfg.epochs
            due_eval = last or (cfg.eval_every and (epoch + 1) % cfg.eval_every == 0)
            ev = self._evaluate() if due_eval else self._no_eval()
            eval_s = time.perf_counter() - t_eval
            row = self._epoch_row(epoch, step - start, wait, comp, sums, ev, epoch_s, eval_s)
            st["rows"].append(row)
            st["epoch"], st["step_in_epoch"] = epoch + 1, 0
            if self.is_rank0:
                records.write_metrics(self.run_dir / "metrics.csv", st["rows"], self.columns)
            self.log(self._epoch_line(row))
            if not last and stop is None and cfg.stop_after_steps and st["global_step"] >= cfg.stop_after_steps:
                stop = "stopped"
            due = cfg.checkpoint_every and ((epoch + 1) % cfg.checkpoint_every == 0 or last)
            if due or (stop and not last):
                self._checkpoint()
            if stop and not last:
                signal.alarm(0)  # checkpointed: a pending SIGTERM deadline no longer applies
                self.log(self._stop_line(stop))
                return stop
        return "complete"

    def _stop_mid_epoch(self, epoch: int, step: int, sums: torch.Tensor, stop: str) -> str:
        synchronize(self.device)
        st = self.state
        st["epoch"], st["step_in_epoch"], st["partial_sums"] = epoch, step, sums.tolist()
        self._checkpoint()
        signal.alarm(0)
        self.log(self._stop_line(stop))
        return stop

    def _stop_line(self, stop: str) -> str:
        if stop == "stopped":
            return f"stopped after {self.state['global_step']} steps (stop_after_steps); re-run to resume"
        return f"preempted: {self.stop_note}"

    def _zero_sums(self) -> torch.Tensor:
        """[loss sum, samples, metric numerators ..., metric denominators ...] on the device."""
        return torch.zeros(2 + 2 * len(self.metric_cols), dtype=torch.float64, device=self.device)

    def _add_metrics(self, sums: torch.Tensor, out, y) -> None:
        """Add the workload's (numerator, denominator) sums for this batch, flattened in metric order."""
        got = self.wl.metric_sums(out, y)
        k, i = len(self.metric_cols), 0
        for m in self.wl.metrics:
            num, den = (torch.as_tensor(v, device=self.device, dtype=torch.float64).reshape(-1) for v in got[m.name])
            sums[2 + i:2 + i + m.size] += num.expand(m.size)
            sums[2 + k + i:2 + k + i + m.size] += den.expand(m.size)
            i += m.size

    def _metric_values(self, sums: torch.Tensor, prefix: str) -> dict:
        k = len(self.metric_cols)
        num, den = sums[2:2 + k].tolist(), sums[2 + k:].tolist()
        return {f"{prefix}_{c}": ((a / b) ** 0.5 if root else a / b) if b else None
                for c, root, a, b in zip(self.metric_cols, self.metric_root, num, den)}

    def _zero_grad(self) -> None:
        """With gradient_as_bucket_view the gradients ARE DDP's bucket memory: zero them in place (a memset) rather
        than free them, which would make the next backward allocate new gradients and DDP copy them into the buckets
        again. Without bucket views, set_to_none (no memset). Horovod's optimizer takes no argument."""
        if self.hvd is not None:
            self.opt.zero_grad()
        else:
            self.opt.zero_grad(set_to_none=not self.cfg.gradient_as_bucket_view)

    def _step(self, x, y, sums, global_step: int) -> None:
        cfg, wl = self.cfg, self.wl
        self._zero_grad()
        mb = cfg.micro_batches
        for i, (xm, ym) in enumerate(zip(_chunks(x, mb), _chunks(y, mb))):
            # Gradients are all-reduced once per step, on the last micro-batch.
            # (Horovod's optimizer counts the micro-batches itself: backward_passes_per_step)
            sync = self.ddp.no_sync() if i < mb - 1 and self.hvd is None else nullcontext()
            with sync:
                with self.prof.maybe("forward"), self.autocast:
                    out = wl.forward(self.train_model, xm, ym, global_step, True)
                    loss = wl.loss(out, ym)
                with self.prof.maybe("backward"):  # DDP's all-reduce runs inside, as buckets fill
                    self.scaler.scale(loss / mb).backward()
            with torch.no_grad():
                n = _batch_len(ym)
                sums[0] += loss.detach().double() * n
                sums[1] += n
                self._add_metrics(sums, _detach(out), ym)
        early = self.hvd is not None and (self.recipe.clip_grad_norm or self.scaler.is_enabled())
        if early:  # Horovod: average the gradients before they are unscaled or clipped
            with self.prof.maybe("communication"):
                self.opt.synchronize()
        with self.prof.maybe("optimizer"):
            if self.recipe.clip_grad_norm:
                self.scaler.unscale_(self.opt)
                torch.nn.utils.clip_grad_norm_(self.ddp.parameters(), self.recipe.clip_grad_norm)
            with (self.opt.skip_synchronize() if early else nullcontext()):
                self.scaler.step(self.opt)
            self.scaler.update()
            if self.recipe.schedule_unit == "step":
                self.sched.step()

    def _no_eval(self) -> dict:
        """An epoch without evaluation (eval_every): its eval columns are empty."""
        return {"eval_loss": None, **{f"eval_{c}": None for c in self.metric_cols}}

    @torch.no_grad()
    def _evaluate(self) -> dict:
        model = self.model  # no DDP hooks: shards may differ by one batch between ranks
        model.eval()
        sums = self._zero_sums()
        for x, y in self.eval_src.batches():
            self.watchdog.beat()
            with self.autocast:
                out = self.wl.forward(model, x, y, self.state["global_step"], False)
                loss = self.wl.loss(out, y)
            n = _batch_len(y)
            sums[0] += loss.double() * n
            sums[1] += n
            self._add_metrics(sums, out, y)
        dist.all_reduce(sums)
        n = max(float(sums[1]), 1.0)
        return {"eval_loss": float(sums[0]) / n, **self._metric_values(sums, "eval")}

    def _epoch_row(self, epoch, steps, wait, comp, sums, ev, epoch_s, eval_s) -> dict:
        """One metrics.csv row. Throughput is the global batch over the MEDIAN step time of the
        epoch's timed steps, where a step's time is that of its slowest rank (it bounds a DDP step)."""
        cfg = self.cfg
        n_timed = len(wait)  # the same on every rank: same steps, same warm-up
        slowest, wait_mean = [], []
        if n_timed:
            per_step = torch.tensor([[w + c for w, c in zip(wait, comp)], wait], dtype=torch.float64,
                                    device=self.device)
            slow = per_step[0].clone()
            dist.all_reduce(slow, op=dist.ReduceOp.MAX)
            waits = per_step[1].clone()
            dist.all_reduce(waits)
            slowest, wait_mean = slow.tolist(), (waits / self.world).tolist()
        epoch_s_max, mem = all_reduce([epoch_s, peak_memory_gib(self.device)], self.device, op=dist.ReduceOp.MAX)
        dist.all_reduce(sums)
        n = max(float(sums[1]), 1.0)
        st = step_summary(slowest, cfg.batch)
        tput = st["samples_per_s"]
        per_dev = tput / self.world if tput else None
        tflops = per_dev * self.flops["train_flops_per_sample"] / 1e12 if per_dev else None
        kept = self.state["timing"]
        self.local["wait_ms"] += sum(wait)
        self.local["step_ms"] += sum(w + c for w, c in zip(wait, comp))
        self.local["steps"] += n_timed
        kept["step_ms"] += thin(slowest, STEP_SAMPLES_PER_EPOCH)
        kept["sum_step_ms"] += sum(slowest)
        kept["sum_wait_ms"] += sum(wait_mean)
        kept["timed_steps"] += n_timed
        mean_wait = sum(wait_mean) / n_timed if n_timed else None
        row = {
            "epoch": epoch + 1, "steps": steps, "timed_steps": n_timed, "samples": steps * cfg.batch,
            "epoch_s": round(epoch_s_max, 4), "eval_s": round(eval_s, 4),
            "samples_per_s": _r(tput), "samples_per_s_p10": _r(st["samples_per_s_p10"]),
            "samples_per_s_p90": _r(st["samples_per_s_p90"]), "samples_per_s_per_device": _r(per_dev),
            "step_ms_p50": _r(st["step_ms_p50"]), "step_ms_p10": _r(st["step_ms_p10"]),
            "step_ms_p90": _r(st["step_ms_p90"]), "step_ms_mean": _r(st["step_ms_mean"]),
            "data_wait_ms": _r(mean_wait),
            "compute_ms": _r(st["step_ms_mean"] - mean_wait if n_timed else None),
            "data_wait_frac": _r(sum(wait_mean) / sum(slowest) if n_timed and sum(slowest) else None, 5),
            "train_loss": float(sums[0]) / n, "eval_loss": ev["eval_loss"],
            "lr": self.sched.get_last_lr()[0], "peak_mem_gib": round(mem, 4),
            "tflops_per_device": _r(tflops, 5), "mfu": _r(mfu(per_dev, self.flops["train_flops_per_sample"], self.peak), 5),
        }
        row.update(self._metric_values(sums, "train"))
        row.update({k: v for k, v in ev.items() if k != "eval_loss"})
        return row

    def _epoch_line(self, row: dict) -> str:
        metrics = " ".join(f"eval_{c} {row[f'eval_{c}']:.4f}" for c in self.metric_cols
                           if row.get(f"eval_{c}") is not None)
        if row["samples_per_s"]:
            timing = (f"{row['samples_per_s']:,.1f} samples/s (median step {row['step_ms_p50']:.1f} ms, "
                      f"p10-p90 {row['step_ms_p10']:.1f}-{row['step_ms_p90']:.1f}; "
                      f"data wait {100 * (row['data_wait_frac'] or 0):.1f}%)")
        else:
            timing = "warm-up only: no timed steps this epoch"
        return (f"epoch {row['epoch']}/{self.cfg.epochs} done: train_loss {row['train_loss']:.4f} "
                + (f"eval_loss {row['eval_loss']:.4f} {metrics}" if row["eval_loss"] is not None else "(no evaluation)")
                + f" | {timing} | epoch {row['epoch_s']:.1f} s")

    def _checkpoint(self) -> None:
        """Every rank's RNG, I/O counters, partial sums and buffers (BatchNorm statistics are per rank) are gathered;
        rank 0 copies the state to host memory (the snapshot, timed) and writes it, in a background thread when
        checkpoint_async (the next save, a stop or the end of the run waits for that write; its time is recorded)."""
        self.watchdog.beat()
        rng = all_gather_object(ckpt.rng_state())  # every rank's, so each resumes its own stream
        io = all_gather_object(self._io_state())    # every rank's I/O counters, so the record covers all attempts
        partial = all_gather_object(self.state["partial_sums"])  # every rank's sums of an interrupted epoch
        buffers = all_gather_object({k: v.detach().cpu() for k, v in self.model.named_buffers()})
        if self.is_rank0:
            self._wait_checkpoint()  # the previous write, if still going: one write at a time
            st = self.state
            t0 = time.perf_counter()
            data = ckpt.serialise(rng, io=io, partial_sums=partial if partial[0] is not None else None,
                                  model=self.model.state_dict(), rank_buffers=buffers,
                                  optimizer=self.opt.state_dict(), scaler=self.scaler.state_dict(),
                                  scheduler=self.sched.state_dict(), epoch=st["epoch"],
                                  step_in_epoch=st["step_in_epoch"], global_step=st["global_step"], rows=st["rows"],
                                  timing=st["timing"], started_utc=st["started_utc"], config=self.cfg.to_dict())
            snap_ms = (time.perf_counter() - t0) * 1e3
            cost = {"epoch": st["epoch"], "global_step": st["global_step"], "bytes": len(data),
                    "snapshot_ms": round(snap_ms, 3), "write_ms": None, "async": self.cfg.checkpoint_async}
            self.ckpt_costs.append(cost)
            if self.cfg.checkpoint_async:
                self.ckpt_writer = threading.Thread(target=self._write_checkpoint, args=(data, cost), daemon=True,
                                                    name="lab-checkpoint")
                self.ckpt_writer.start()
            else:
                self._write_checkpoint(data, cost)
                self._wait_checkpoint()  # raises the write's error now
        if not self.cfg.checkpoint_async:
            dist.barrier()
        self.watchdog.beat()

    def _write_checkpoint(self, data: bytes, cost: dict) -> None:
        t0 = time.perf_counter()
        try:
            ckpt.write(self.run_dir, data)
        except BaseException as e:  # seen by the next _wait_checkpoint, on the training thread
            self.ckpt_error = e
        cost["write_ms"] = round((time.perf_counter() - t0) * 1e3, 3)

    def _wait_checkpoint(self) -> None:
        """Rank 0: the background write of the last checkpoint is finished (or its error raised)."""
        writer, self.ckpt_writer = getattr(self, "ckpt_writer", None), None
        if writer is not None:
            writer.join()
        err, self.ckpt_error = getattr(self, "ckpt_error", None), None
        if err is not None:
            raise RuntimeError(f"writing the checkpoint in {self.run_dir} failed: {type(err).__name__}: {err}") \
                from err

    def _comm_probe(self) -> dict:
        """Fwd+bwd with and without gradient all-reduce on one fixed batch, in pairs.

        The difference is the communication that backward did not hide. Each timed
        iteration starts after a barrier (no rank carries another's lateness into it);
        the two variants alternate in order, pair by pair, so drift (clocks, the page
        cache, a neighbour) falls on both; each pair's difference is averaged over the
        ranks. The result is the median difference with a distribution-free 90 %
        confidence interval of that median: when the interval holds zero (or lies
        below it) the exposed communication is "below noise", recorded as such with
        its upper bound, never as a negative number. Runs after training and after the
        last checkpoint; gradients are discarded, no optimizer step is taken.
        """
        n = self.cfg.comm_probe_steps
        if self.world == 1 or n == 0:
            return {}
        if self.hvd is not None:
            self.log("comm probe: skipped with engine=horovod (its gradient hooks cannot be switched off per step)")
            return {}
        # a fixed batch of this rank's size that does not go through the training stream (a streamed
        # source would read, and count, its first windows again)
        x, y = self.train_src.probe(self.cfg.per_rank_batch)
        self.ddp.train()

        def once(sync: bool) -> float:
            self._zero_grad()
            synchronize(self.device)
            dist.barrier()
            t0 = time.perf_counter()
            with (nullcontext() if sync else self.ddp.no_sync()):
                with self.autocast:
                    loss = self.wl.loss(self.wl.forward(self.train_model, x, y, 0, True), y)
                loss.backward()
            synchronize(self.device)
            return (time.perf_counter() - t0) * 1e3

        pairs = []
        for i in range(n + 2):  # two warm-up pairs
            first_sync = i % 2 == 1
            a = once(first_sync)
            b = once(not first_sync)
            if i >= 2:
                pairs.append((a, b) if first_sync else (b, a))
        self._zero_grad()
        sums = all_reduce([v for p in pairs for v in p], self.device)
        mean = [v / self.world for v in sums]
        sync_ms, nosync_ms = mean[0::2], mean[1::2]
        out = probe_result(sync_ms, nosync_ms)
        self.log(f"comm probe: fwd+bwd {out['comm_probe_sync_ms']:.2f} ms with all-reduce, "
                 f"{out['comm_probe_nosync_ms']:.2f} ms without (medians of {len(pairs)} pairs): " +
                 (f"{out['exposed_comm_ms']:.2f} ms exposed communication per step (90 % CI "
                  f"{out['exposed_comm_ci_ms'][0]:.2f} to {out['exposed_comm_ci_ms'][1]:.2f})"
                  if out["exposed_comm_status"] == "measured" else
                  f"exposed communication not distinguishable from zero (90 % CI "
                  f"{out['exposed_comm_ci_ms'][0]:.2f} to {out['exposed_comm_ci_ms'][1]:.2f} ms)"))
        return out

    # --------------------------------------------------------------- record
    def _write_summary(self, status: str, probe: dict | None = None, error: str | None = None) -> dict | None:
        if not self.is_rank0:
            return None
        st, rows, t = self.state, self.state["rows"], self.state["timing"]
        run_stats = step_summary(t["step_ms"], self.cfg.batch)
        tput = run_stats["samples_per_s"]
        per_dev = tput / self.world if tput else None
        tflops = per_dev * self.flops["train_flops_per_sample"] / 1e12 if per_dev else None
        steady = rows[1:] if len(rows) > 1 else rows  # the first epoch carries start-up effects
        summary = {
            "schema_version": records.SCHEMA_VERSION, "run_id": self.run_id, "status": status, "error": error,
            "started_utc": st["started_utc"], "finished_utc": utc_now() if status != "running" else None,
            "resumed_from_step": st["resumed_from_step"],
            "epochs_done": len(rows), "steps_done": st["global_step"], "world_size": self.world,
            "device_name": self.device_name,
            "throughput_stat": (f"global batch / median step time over {t['timed_steps']} timed steps "
                                f"(slowest rank per step)") if t["timed_steps"] else "no timed steps",
            "timed_steps": t["timed_steps"],
            "samples_per_s": _r(tput), "samples_per_s_p10": _r(run_stats["samples_per_s_p10"]),
            "samples_per_s_p90": _r(run_stats["samples_per_s_p90"]),
            "samples_per_s_mean": _r(t["timed_steps"] * self.cfg.batch * 1e3 / t["sum_step_ms"]
                                     if t["sum_step_ms"] else None),
            "samples_per_s_per_device": _r(per_dev),
            "step_ms_p50": _r(run_stats["step_ms_p50"]), "step_ms_p10": _r(run_stats["step_ms_p10"]),
            "step_ms_p90": _r(run_stats["step_ms_p90"]),
            "step_ms_mean": _r(t["sum_step_ms"] / t["timed_steps"] if t["timed_steps"] else None),
            "epoch_s_median": _r(median(r["epoch_s"] for r in steady) if steady else None),
            "data_wait_frac": _r(t["sum_wait_ms"] / t["sum_step_ms"] if t["sum_step_ms"] else None, 5),
            "final_eval_loss": rows[-1]["eval_loss"] if rows else None,
            "peak_mem_gib": max((r["peak_mem_gib"] for r in rows), default=None),
            **self.flops, "peak_tflops": self.peak, "tflops_per_device": _r(tflops, 5),
            "mfu": _r(mfu(per_dev, self.flops["train_flops_per_sample"], self.peak), 5),
            "comm_probe_sync_ms": None, "comm_probe_nosync_ms": None, "exposed_comm_ms": None,
            "exposed_comm_status": None, "exposed_comm_ci_ms": None, "comm_probe_pairs": None,
            "requeues": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "checkpoints": checkpoint_summary(getattr(self, "ckpt_costs", [])),
            "host_syncs_per_step": getattr(getattr(self, "syncs", None), "per_step", None),
            "grad_param_bytes": self.grad_param_bytes,
        }
        summary.update(probe or {})
        summary["device_type"] = self.device.type
        prof = getattr(self, "profile", None)
        summary["profile"] = prof
        mon = None
        if status != "running" and self.cfg.monitor_hz:
            try:
                merged = res_monitor.merge(self.run_dir)
                window = getattr(self, "train_window", None)
                mon = res_monitor.summarise(merged, tuple(window) if window and window[1] else None)
            except Exception as e:  # the monitor's files must never cost the run its record
                mon = {"error": f"{type(e).__name__}: {e}"}
        summary["monitor"] = mon
        summary["bottleneck"] = (verdict.decide(summary, mon, prof if prof and prof.get("share") else None)
                                 if status != "running" else None)
        io = getattr(self, "io", None)  # the run's headline beside the I/O figures, for the I/O tables
        summary["io"] = {**io, "samples_per_s": summary["samples_per_s"]} if io else None
        shared, ranks = getattr(self, "workload_report", (None, None))
        summary["workload"], summary["ranks"] = shared, ranks
        for c in self.metric_cols:
            summary[f"final_eval_{c}"] = rows[-1][f"eval_{c}"] if rows else None
        self.attempts[-1].update(status=status, finished_utc=summary["finished_utc"], cause=error,
                                 steps_done=st["global_step"])
        summary["attempts"] = self.attempts
        records.write_json(self.run_dir / "summary.json", summary)
        return summary


    def _workload_report(self) -> tuple[dict | None, list[dict]]:
        """(rank 0's shared part of the workload's report, one entry per rank: its memory and its own part)."""
        mine = self.wl.report(self.model, self.data_info) if self.wl.report is not None else {}
        entry = {"rank": self.renv.global_rank, "host": sysinfo.host(),
                 "peak_mem_gib": round(peak_memory_gib(self.device), 4), **(mine.get("rank") or {})}
        ranks = all_gather_object(entry)
        return mine.get("shared"), sorted(ranks, key=lambda r: r["rank"])

    # ------------------------------------------------------------------ I/O
    def _io_state(self) -> dict:
        stats = self.train_src.stats() if hasattr(self.train_src, "stats") else {}
        return {"rank": self.renv.global_rank, "host": sysinfo.host(), "device_name": self.device_name,
                **self.local, "source": stats}

    def _io_summary(self, ranks: list[dict]) -> dict:
        """The record's I/O section: per rank and in total (see results/README.md)."""
        train_s = sum(r["epoch_s"] for r in self.state["rows"])
        per_rank = []
        for r in sorted(ranks, key=lambda r: r["rank"]):
            src = r["source"] or {}
            b, t = src.get("bytes_read"), src.get("read_s")
            per_rank.append({
                "rank": r["rank"], "host": r["host"], "device_name": r["device_name"],
                "samples": src.get("samples"), "bytes_read": b, "read_s": _r(t, 4),
                "read_calls": src.get("read_calls"),
                "read_mb_s": _r(b / t / 1e6 if b and t else None),
                "data_wait_frac": _r(r["wait_ms"] / r["step_ms"] if r["step_ms"] else None, 5),
                "bytes_by_epoch": src.get("bytes_by_epoch"),
            })
        first = (ranks[0]["source"] or {}) if ranks else {}
        data_bytes = first.get("data_bytes")
        streamed = [p["bytes_read"] for p in per_rank if p["bytes_read"] is not None]
        total = sum(streamed) if streamed and len(streamed) == len(per_rank) else None
        by_epoch: dict[str, int] = {}
        for p in per_rank:
            for e, v in (p["bytes_by_epoch"] or {}).items():
                by_epoch[e] = by_epoch.get(e, 0) + v
        waits = [p["data_wait_frac"] for p in per_rank if p["data_wait_frac"] is not None]
        return {
            "source": first.get("source") or self.train_src.describe().get("source"),
            "cache": first.get("cache"), "data_bytes": data_bytes, "train_s": _r(train_s, 4),
            "bytes_read": total,
            "read_ratio_max_epoch": _r(max(by_epoch.values()) / data_bytes if by_epoch and data_bytes else None, 5),
            "read_mb_s": _r(total / train_s / 1e6 if total and train_s else None),
            "storage_mb_s": _r(sum(p["read_mb_s"] for p in per_rank) if total and all(p["read_mb_s"] for p in per_rank)
                               else None),
            "data_wait_frac_max": _r(max(waits) if waits else None, 5),
            "data_wait_frac_min": _r(min(waits) if waits else None, 5),
            "ranks": per_rank,
        }


# Step times kept per epoch for the run's median (evenly strided beyond this): enough for a
# stable median and p10/p90, small enough for the checkpoint of a 100k-step epoch.
STEP_SAMPLES_PER_EPOCH = 4096


def _zero_timing() -> dict:
    return {"step_ms": [], "sum_step_ms": 0.0, "sum_wait_ms": 0.0, "timed_steps": 0}

def _chunks(batch, n: int):
    """`n` micro-batches of a tensor, or of each tensor of a tuple/list (zipped back into tuples)."""
    if n == 1:
        return [batch]
    if isinstance(batch, (tuple, list)):
        return list(zip(*(t.chunk(n) for t in batch)))
    return list(batch.chunk(n))


def _batch_len(y) -> int:
    return (y[0] if isinstance(y, (tuple, list)) else y).shape[0]


def _detach(out):
    return tuple(o.detach() for o in out) if isinstance(out, (tuple, list)) else out.detach()


def _r(v, nd: int = 3):
    return None if v is None else round(float(v), nd)


def probe_result(sync_ms: list[float], nosync_ms: list[float]) -> dict:
    """The comm probe's record: medians, the paired differences' median and its 90 % CI, and whether it is
    distinguishable from zero (the CI's lower end above zero)."""
    diffs = [a - b for a, b in zip(sync_ms, nosync_ms)]
    ci = median_ci(diffs, level=0.90)  # the sign test's order-statistic interval (the full range when too few pairs)
    d = ci["median"]
    lo, hi = (ci["ci_lo"], ci["ci_hi"]) if ci["ci_lo"] is not None else (d, d)
    resolved = lo > 0
    return {"comm_probe_sync_ms": round(median(sync_ms), 4), "comm_probe_nosync_ms": round(median(nosync_ms), 4),
            "comm_probe_pairs": len(diffs),
            "exposed_comm_ms": round(d, 4) if resolved else None,
            "exposed_comm_status": "measured" if resolved else "below noise",
            "exposed_comm_ci_ms": [round(lo, 4), round(hi, 4)]}


def checkpoint_summary(costs: list[dict]) -> dict | None:
    """summary.json's `checkpoints`: how many this attempt wrote, and what they cost the training loop
    (the snapshot, always on the training thread) and the disk (the write, in the background when async)."""
    if not costs:
        return None
    snaps = [c["snapshot_ms"] for c in costs]
    writes = [c["write_ms"] for c in costs if c["write_ms"] is not None]
    return {"count": len(costs), "async": costs[-1]["async"], "bytes": costs[-1]["bytes"],
            "snapshot_ms_median": round(median(snaps), 3), "snapshot_ms_max": round(max(snaps), 3),
            "write_ms_median": round(median(writes), 3) if writes else None,
            "write_ms_max": round(max(writes), 3) if writes else None}


class SyncCounter:
    """Counts host-device synchronisations over steps [first, first + n) with torch.cuda.set_sync_debug_mode('warn'),
    which warns at every synchronising call (.item(), .tolist(), a blocking copy, ...). The result per step goes to
    summary.json's host_syncs_per_step; a loop that keeps the GPU fed has close to none."""

    def __init__(self, first: int, n: int):
        import warnings

        self.first, self.n, self.per_step, self._w = first, n, None, warnings
        self._cm, self._log = None, None

    def at_step(self, step: int) -> None:
        """Called before each step of this attempt (0-based)."""
        self._steps = step - self.first  # steps completed inside the window so far
        if step == self.first and self._cm is None and self.per_step is None:
            self._cm = self._w.catch_warnings(record=True)
            self._log = self._cm.__enter__()
            self._w.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        elif step == self.first + self.n:
            self.stop()

    def stop(self) -> None:
        if self._cm is None:
            return
        torch.cuda.set_sync_debug_mode("default")
        self._cm.__exit__(None, None, None)
        count = sum(1 for w in self._log if "synchroniz" in str(w.message).lower())
        steps = min(self.n, max(1, getattr(self, "_steps", self.n)))
        self.per_step, self._cm = round(count / steps, 3), None
