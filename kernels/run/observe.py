"""Observing a run without changing it: step timers, host syncs, the profiler window, the resource monitor.

The loop calls `Observers` at fixed points (run start, training, epoch start, step start, data
ready, step end) and runs each phase inside `phase(name)`; what they measure goes to the record.
Profiled steps (the profiler's warm-up and active steps, and the trace export) and the first
timing_warmup_steps of every process start are not timed.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from kernels.base.dist import all_gather_object
from kernels.profiling import monitor as res_monitor
from kernels.profiling import monitor_csv
from kernels.profiling.trace import StepProfiler
from kernels.base.errors import ConfigError
from kernels.base.timers import StepTimer, synchronize


class Observers:
    def __init__(self, cfg, device: torch.device, rank: int, local_rank: int, log):
        self.cfg, self.device, self.rank, self.local_rank, self.log = cfg, device, rank, local_rank, log
        self.timer = StepTimer(device)
        self.prof: StepProfiler | None = None
        self.syncs: SyncCounter | None = None
        self.monitor = None
        self.train_window: list | None = None
        self.run_dir: Path | None = None  # the record's, from run_start
        self.run_id: str | None = None
        self.ranks: list[dict] = []  # the record's gathered rank list, from run_start
        self.steps = 0  # steps of this attempt: warm-up (compilation, autotuning) recurs in every new process
        c = cfg
        self.profiled = (
            range(c.profile_wait, c.profile_wait + c.profile_warmup + c.profile_steps) if c.profile_steps else range(0)
        )

    # ------------------------------------------------------------------ hooks
    def run_start(self, run_dir: Path, run_id: str, ranks: list[dict]) -> None:
        """Local rank 0 of each node samples its node (GPUs and host) into monitor/<node>.csv, telling this run's
        processes on its host (ranks: the record's gathered list, with pid and affinity) from foreign ones."""
        me = ranks[self.rank]
        if self.cfg.monitor_hz and self.local_rank == 0:
            pids = [r["pid"] for r in ranks if r["host"] == me["host"]]
            self.monitor = res_monitor.Monitor(
                run_dir / "monitor" / f"{me['node']}.csv",
                me["node"],
                self.cfg.monitor_hz,
                pids,
                res_monitor.rank_cpus(ranks, "host", me["host"]),
            )
            self.monitor.start()
        self.run_dir, self.run_id, self.ranks = run_dir, run_id, ranks

    @contextmanager
    def training(self):
        """Around the epochs: the profiler window, the host-sync counter and the training loop's time span."""
        self._training_start()
        try:
            yield
        finally:
            self._training_end()

    def check_window(self, total_steps: int, steps_per_epoch: int) -> None:
        """The profiled window lies inside the run (checked before anything is written)."""
        c, end = self.cfg, self.profiled.stop
        if self.profiled and end > total_steps:
            raise ConfigError(
                f"parameter 'profile_steps': the profiled window ends at step {end} (profile_wait {c.profile_wait} + "
                f"profile_warmup {c.profile_warmup} + profile_steps {c.profile_steps}) but the run has {total_steps} "
                f"steps ({c.epochs} epoch(s) of {steps_per_epoch}); no step would be profiled: lower profile_wait or "
                f"profile_steps, or raise epochs"
            )

    def epoch_start(self) -> float:
        """Each epoch's row reports that epoch's peak memory; its clock starts with the device idle."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        synchronize(self.device)
        return time.perf_counter()

    def _training_start(self) -> None:
        cfg = self.cfg
        trace_dir = Path(cfg.profile_dir) / self.run_id if cfg.profile_dir else self.run_dir / "traces"
        self.prof = StepProfiler(cfg, self.device, self.rank, trace_dir, self.log)
        self.train_window = [time.time(), None]
        self.syncs = (
            SyncCounter(cfg.timing_warmup_steps, cfg.sync_debug_steps)
            if cfg.sync_debug_steps and self.device.type == "cuda"
            else None
        )

    def phase(self, name: str):
        """A profiler range around a phase of the step (data, forward, backward, optimizer, communication)."""
        return self.prof.maybe(name)

    def step_start(self) -> None:
        if self.steps == self.cfg.timing_warmup_steps and self.train_window is not None:
            self.train_window[0] = time.time()  # utilisation over the timed steps: compile and capture left out
        if self.syncs is not None:
            self.syncs.at_step(self.steps)
        self.timer.start()

    def data_ready(self) -> None:
        self.timer.data_ready()

    def step_end(self) -> None:
        self.timer.done(timed=self.steps >= self.cfg.timing_warmup_steps and self.steps not in self.profiled)
        self.prof.step()
        self.steps += 1

    def epoch_timings(self) -> tuple[list[float], list[float]]:
        """This epoch's timed steps on this rank: (data wait ms, compute ms) per step."""
        return self.timer.collect()

    def _training_end(self) -> None:
        if self.prof is not None:
            self.prof.close()
        if self.syncs is not None:
            self.syncs.stop()
        if self.train_window is not None:
            self.train_window[1] = time.time()

    def stop_monitor(self) -> None:
        mon, self.monitor = self.monitor, None
        if mon is not None:
            mon.stop()

    # ------------------------------------------------------------------ results
    def sync_facts(self) -> dict:
        """summary.json's host_syncs_per_step and host_sync_sites (empty without sync_debug_steps on a GPU)."""
        c = self.syncs
        return {
            "host_syncs_per_step": c.per_step if c is not None else None,
            "host_sync_sites": c.sites if c is not None else None,
        }

    def monitor_summary(self, run_dir: Path) -> dict | None:
        """summary.json's `monitor`, over the training loop only (after the run), with the run's `contention`.
        Rank 0 only: it writes the summary, and a second rank merging beside it would rewrite monitor.csv while
        rank 0 reads it (a run's summary once said 'EmptyDataError')."""
        if self.rank != 0:
            return None
        mon = None
        if self.cfg.monitor_hz:
            try:
                merged = monitor_csv.merge(run_dir)
                window = self.train_window
                mon = monitor_csv.summarise(merged, tuple(window) if window and window[1] else None)
            except Exception as e:  # the monitor's files must never cost the run its record
                mon = {"error": f"{type(e).__name__}: {e}"}
        return {**(mon or {}), "contention": res_monitor.contention(mon, self.ranks, os.cpu_count())}

    def collect_profile(self, probe: dict, world: int, device_name: str) -> dict | None:
        """Each rank analyses its own trace; rank 0 writes the breakdown files, runs HTA, returns the summary."""
        from kernels.profiling import breakdown, collect

        prof = self.prof
        if prof is None or not prof.active or prof.external:
            return None
        mine = None
        if prof.trace_path is not None:
            try:
                mine = breakdown.analyse(prof.trace_path)
                mine["rank"] = self.rank
                mine["trace_path"] = str(prof.trace_path)
            except ValueError as e:
                self.log(f"profile: rank {self.rank}'s trace could not be analysed: {e}")
        per_rank = all_gather_object(mine)
        if not self.rank == 0:
            return None
        got = [r for r in per_rank if r is not None]
        if not got:
            return {"status": "no trace: the profiled window did not complete"}
        if len(got) < len(per_rank):
            self.log(f"profile: {len(per_rank) - len(got)} rank(s) left no trace; the breakdown covers {len(got)}")
        traces = {r["rank"]: Path(r.pop("trace_path")) for r in got}
        out = collect.write(
            self.run_dir,
            got,
            traces,
            self.cfg.profile_hta,
            probe,
            title=f"{self.run_id}: {world} rank(s) on {device_name}",
        )
        self.log(
            f"profile: {out['steps']} step(s) x {len(got)} rank(s), {out['profiled_ms_per_step']:.1f} ms per "
            f"step ({out['timeline']} timeline): "
            + ", ".join(f"{c} {100 * v:.1f}%" for c, v in sorted(out["share"].items(), key=lambda kv: -kv[1])[:5])
        )
        self.log(f"profile: {out['comm_crosscheck']}; HTA {out['hta']['status']}")
        return {"status": "complete", **out}


def is_sync_warning(message: str) -> bool:
    """A warning of torch.cuda.set_sync_debug_mode('warn') about a synchronising call ("called a synchronizing
    CUDA operation"), not its once-per-process notice that the mode "is a prototype feature and does not yet
    detect all synchronizing operations", which a looser match counted as one sync per window (an H200 run's
    0.05 per 20 steps, torch 2.11)."""
    return "called a synchronizing" in message.lower()


class SyncCounter:
    """Counts host-device synchronisations over steps [first, first + n) with torch.cuda.set_sync_debug_mode('warn'),
    which warns at every synchronising call (.item(), .tolist(), a blocking copy, ...). The result per step goes to
    summary.json's host_syncs_per_step; a loop that keeps the GPU fed has close to none."""

    def __init__(self, first: int, n: int):
        import warnings

        self.first, self.n, self.per_step, self._w = first, n, None, warnings
        self._cm, self._log, self.sites = None, None, {}

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
        hits = [w for w in self._log if is_sync_warning(str(w.message))]
        steps = min(self.n, max(1, getattr(self, "_steps", self.n)))
        self.per_step, self._cm = round(len(hits) / steps, 3), None
        for w in hits:  # where each sync was asked for: the Python line that made it
            site = f"{Path(w.filename).name}:{w.lineno}"
            self.sites[site] = self.sites.get(site, 0) + 1
