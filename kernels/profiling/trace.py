"""The loop's profiling hooks: phase ranges, the torch.profiler schedule, the Nsight capture window.

    prof = StepProfiler(cfg, device, rank, job, trace_dir)
    with prof.phase("data"): batch = next(it)      # record_function + NVTX (on CUDA)
    ...
    prof.step()                                    # after every training step
    prof.close()                                   # stops a window still open

Schedule (global steps of this attempt): `profile_wait` steps skipped (warm-up:
compilation, autotuning, the page cache), `profile_warmup` steps traced and
thrown away (the profiler's own start-up), then `profile_steps` active steps.
With profile_with=torch the active steps are recorded by torch.profiler (CPU,
and CUDA activities on GPUs) into one Chrome/Perfetto trace per rank,
traces/rank<R>-<job>.pt.trace.json.gz, which carries `distributedInfo` (the
rank, for Holistic Trace Analysis). With profile_with=external (Nsight Systems or
Compute wrap the ranks) no torch.profiler runs (CUPTI has one user at a time):
cudaProfilerStart/Stop mark the same active window for `nsys --capture-range=
cudaProfilerApi`, and the NVTX ranges are emitted on every step.
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from kernels.base import files

PHASES = ("data", "forward", "backward", "optimizer", "communication")


def trace_name(rank: int, job: str) -> str:
    return f"rank{rank}-{job}.pt.trace.json.gz"


def job_tag(environ=None) -> str:
    """j<job id> (j<array job>_<task> in an array) under Slurm, as the executed notebooks are named; else local."""
    from kernels.base.sysinfo import job_tag as slurm_tag

    env = os.environ if environ is None else environ
    return f"j{slurm_tag(env)}" if "SLURM_JOB_ID" in env else "local"


class StepProfiler:
    def __init__(self, cfg, device: torch.device, rank: int, trace_dir: Path | None, log=print):
        self.cfg, self.device, self.rank, self.log = cfg, device, rank, log
        self.active = cfg.profile_steps > 0
        self.external = self.active and cfg.profile_with == "external"
        self.cuda = device.type == "cuda"
        self.nvtx = self.cuda and (self.active or cfg.profile_with == "external")
        self.trace_dir = Path(trace_dir) if trace_dir else None
        self.first = cfg.profile_wait + cfg.profile_warmup  # the first active step (0-based, this attempt)
        self.n = 0
        self.prof = None
        self.trace_path: Path | None = None
        self.window_s: float | None = None
        self._t0 = None
        if self.active and not self.external:
            from torch.profiler import ProfilerActivity, profile, schedule

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.prof = profile(
                activities=acts,
                record_shapes=cfg.profile_shapes,
                profile_memory=cfg.profile_memory,
                with_stack=False,
                acc_events=False,
                schedule=schedule(wait=cfg.profile_wait, warmup=cfg.profile_warmup, active=cfg.profile_steps, repeat=1),
                on_trace_ready=self._save,
            )
            self.prof.start()

    # ------------------------------------------------------------- phases
    @contextmanager
    def phase(self, name: str):
        """One phase of a step: a record_function range (in the torch trace) and an NVTX range (Nsight)."""
        if self.nvtx:
            torch.cuda.nvtx.range_push(f"lab:{name}")
        try:
            if self.prof is not None:
                with torch.profiler.record_function(f"lab:{name}"):
                    yield
            else:
                yield
        finally:
            if self.nvtx:
                torch.cuda.nvtx.range_pop()

    def maybe(self, name: str):
        return self.phase(name) if (self.prof is not None or self.nvtx) else nullcontext()

    # -------------------------------------------------------------- steps
    def step(self) -> None:
        """After each training step: advance the schedule (the trace is written when the window closes)."""
        if not self.active:
            return
        if self.n == self.first:
            self._t0 = time.perf_counter()
            if self.external and self.cuda:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()  # cudaProfilerStart: nsys --capture-range=cudaProfilerApi starts
        self.n += 1
        if self.prof is not None and self.n <= self.first + self.cfg.profile_steps:
            self.prof.step()
        if self.n == self.first + self.cfg.profile_steps:
            if self.external and self.cuda:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            self.window_s = time.perf_counter() - self._t0

    @property
    def done(self) -> bool:
        return not self.active or self.n >= self.first + self.cfg.profile_steps

    def close(self) -> None:
        """End of training: stop a profiler whose window did not complete (its partial trace is not kept)."""
        if self.prof is not None:
            prof, self.prof = self.prof, None
            if self.n < self.first + self.cfg.profile_steps:
                self.log(
                    f"profile: the run ended after {self.n} steps of this attempt, before the profiled window "
                    f"({self.cfg.profile_wait} wait + {self.cfg.profile_warmup} warm-up + "
                    f"{self.cfg.profile_steps} active steps) closed; no trace is kept"
                )
                prof.on_trace_ready = None
            try:
                prof.stop()
            except Exception as e:  # a profiler that never started records nothing; say so and go on
                self.log(f"profile: stopping the profiler failed ({type(e).__name__}: {e})")

    def _save(self, prof) -> None:
        """on_trace_ready: the Chrome trace, gzipped, written under a private temporary folder and renamed into
        place (files.replacing)."""
        final = self.trace_dir / trace_name(self.rank, job_tag())
        with files.replacing(final) as tmp:
            raw = tmp.with_name("trace.json")
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        self.trace_path = final
