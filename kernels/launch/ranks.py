"""A training run's launch: the driver's checks and the run id (prepare), the training rank's command line and
environment (job), and the start through the chosen launcher (kernels/launch/launchers.py), horovodrun for
engine=horovod. Used by the training CLI (kernels/train.py), the notebooks' runner, study and submit.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

from kernels.base.params import RunConfig
from kernels.launch.config import check_environment, settled
from kernels.launch.launchers import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    FAILURE_GRACE_S,
    LAUNCHER_ENV,
    RankJob,
    pump,
    check_allocation,
    choose_launcher,
    mark_if_died,
    run_srun,
    spawn_local,
    srun_command,
    thread_env,
)
from kernels.records import schema as records
from kernels.records.schema import ensure_not_complete

PREPARED_ENV = "LAB_PREPARED_RUN"  # the run id the driver resolved and checked, set for its ranks (prepare)


def worker_command(cfg: RunConfig) -> list[str]:
    return [sys.executable, "-m", "kernels.train", *settled(cfg, launcher="none").cli_args()]


def rank_job(cfg: RunConfig) -> RankJob:
    """The training run's ranks as a launch: its PREPARED_ENV tells each rank that the driver has resolved and
    checked the run."""
    return RankJob(
        cfg.gpus,
        tuple(worker_command(cfg)),
        cfg.results_root / cfg.run_id,
        cfg.term_grace_s,
        {PREPARED_ENV: cfg.run_id},
    )


def prepare(cfg: RunConfig, launcher: str | None = None) -> tuple[str, RunConfig]:
    """Validate against this machine and fix the run id, before anything starts. A rank its driver prepared (the
    driver names the run in PREPARED_ENV) checks only what is its own: its device, cores, software and data."""
    from kernels.run.ids import make_run_id

    launcher = launcher or choose_launcher(cfg.launcher, cfg.gpus)
    if launcher == "none" and cfg.run_id and os.environ.get(PREPARED_ENV) == cfg.run_id:
        check_environment(cfg, ranks_on_this_node=1, rank_only=True)
        return launcher, cfg
    if launcher == "srun":
        check_allocation(cfg.gpus)
    ranks_here = 1 if launcher in ("none", "srun") else cfg.gpus
    check_environment(cfg, ranks_on_this_node=ranks_here)
    # the ranks get the resolved run id and results folder, not whatever their environment would give
    cfg = settled(cfg, run_id=make_run_id(cfg), launcher=launcher, results_dir=str(cfg.results_root))
    records.refuse_foreign(cfg.results_root, cfg.results_root / cfg.run_id)
    ensure_not_complete(cfg.results_root / cfg.run_id)
    if launcher != "none":  # fail fast, before starting ranks, when a live run holds the directory
        records.RunLock(cfg.results_root / cfg.run_id).check()
    return launcher, cfg


def spawn_horovodrun(cfg: RunConfig, ranks: RankJob, stdout=None) -> int:
    """engine=horovod on this machine: horovodrun starts the ranks (Gloo controller); the lab's process group
    meets at MASTER_ADDR/MASTER_PORT, which horovodrun passes on to every rank."""
    from kernels.engines.horovod import horovodrun_command
    from kernels.base.ports import free_port

    stdout = stdout or sys.stdout
    extra = {
        **thread_env(cfg.gpus),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
        LAUNCHER_ENV: "horovodrun",
        **ranks.env,
    }
    cmd = horovodrun_command(cfg, list(ranks.command))
    print("launcher: " + shlex.join(cmd), file=stdout, flush=True)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, **extra},
        start_new_session=True,
    )
    try:
        pump(proc.stdout, "", stdout)
        rc = proc.wait()
    finally:  # interrupted: horovodrun and its ranks go with us
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=FAILURE_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    mark_if_died(ranks.run_dir, rc, "horovodrun", stdout)
    return rc


def steps_past_stop(cfg: RunConfig) -> int | None:
    """The steps a stopped or preempted record already has when that reaches stop_after_steps (the stop point is
    absolute: the same command run again must not add a step each time), else None."""
    summary = cfg.results_root / cfg.run_id / "summary.json"
    if not cfg.stop_after_steps or not summary.exists():
        return None
    try:
        s = records.read_json(summary)
    except records.RecordError:
        return None  # the run's own start reports a damaged record
    done = int(s.get("steps_done") or 0)
    return done if s.get("status") in ("stopped", "preempted") and done >= cfg.stop_after_steps else None


def start(launcher: str, cfg: RunConfig, stdout=None) -> int:
    done = steps_past_stop(cfg)  # every rank of a launch reads the same record: all go on, or none
    if done is not None:
        print(
            f"run {cfg.run_id} has already done {done} steps, stop_after_steps={cfg.stop_after_steps}: nothing to "
            f"do (a larger stop_after_steps goes further, 0 runs to the end)",
            file=stdout or sys.stdout,
            flush=True,
        )
        return 0
    if launcher == "none":
        from kernels import ddp_core
        from kernels.run import guards

        if ddp_core.run(cfg) != "preempted":
            return 0
        return EXIT_INTERRUPTED if guards.INTERRUPTED else EXIT_PREEMPTED
    ranks = rank_job(cfg)
    if launcher == "local":
        return spawn_horovodrun(cfg, ranks, stdout) if cfg.engine == "horovod" else spawn_local(ranks, stdout)
    if cfg.engine == "horovod":  # srun starts MPI ranks: Horovod's MPI controller
        return run_srun(ranks, stdout, srun_command(ranks, extra=[f"--mpi={os.environ.get('LAB_SRUN_MPI', 'pmix')}"]))
    return run_srun(ranks, stdout)
