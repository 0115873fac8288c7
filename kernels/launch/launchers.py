"""Launchers: how any rank program's ranks start, whatever the program (the training rank or the communication
benchmark's), and what their exits mean.

A launch is described by one small value, `RankJob`: how many ranks, the command each runs, where the record goes,
how long a stop may take and what extra environment the ranks get. kernels/launch/ranks.py makes one for a training
run, kernels/comm/bench.py for a benchmark; both start it through the functions here.
Launchers (choose_launcher):
- none:   this process is one rank (under torchrun, srun, mpirun or horovodrun, which set the rank variables);
- local:  spawn the ranks as processes on this machine (gloo on CPU, nccl on GPUs);
- srun:   start the ranks with srun inside the current Slurm allocation;
- mpirun: MPI ranks (the communication benchmark's MPI backend), here or over the allocation it runs in;
- auto:   none in a rank's environment, mpirun for an MPI program, srun inside an allocation (batch script,
          salloc), in-process for one rank, else local.
A launcher marks a record its ranks left "running" as failed when they die without a word.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kernels.base import sysinfo
from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT
from kernels.records import schema as records

LAUNCHER_ENV = "LAB_LAUNCHER"  # set by the local launchers, so the record names them
RANK_WRAPPER_ENV = "LAB_RANK_WRAPPER"  # a command prefix for every srun rank (the Nsight wrappers set it)
# variables that say "this process is a rank": torchrun's pair, srun's step, horovodrun's, Open MPI's and PMI's
RANK_ENV = ("SLURM_STEP_ID", "HOROVOD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
EXIT_PREEMPTED = 75  # the ranks checkpointed and stopped on request (USR1/TERM): resumable (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # the same after Ctrl-C (SIGINT; 128 + 2, as a shell reports it)
FAILURE_GRACE_S = 10  # after a rank failed, the others get this long to leave before SIGKILL
# libkineto (torch.profiler) prints these at every profiler start and stop, whatever KINETO_LOG_LEVEL says
KINETO_MARK = re.compile(r"(?:USDT|STAGE):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \w+\.cpp:\d+\] ")


@dataclass(frozen=True)
class RankJob:
    """One launch: `ranks` processes of `command`, whose record goes to `run_dir`; on a stop they get
    `term_grace_s` to checkpoint; `env` is added to every rank's environment."""

    ranks: int
    command: tuple[str, ...]
    run_dir: Path
    term_grace_s: float = 10.0
    env: dict = field(default_factory=dict, hash=False)


def in_rank_env(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return ("RANK" in env and "WORLD_SIZE" in env) or any(k in env for k in RANK_ENV)


def choose_launcher(requested: str, ranks: int, environ=None, mpi: bool = False) -> str:
    """The launcher for `requested` (a launcher parameter's value, perhaps auto) and `ranks` ranks."""
    env = os.environ if environ is None else environ
    if requested != "auto":
        return requested
    if in_rank_env(env):
        return "none"  # started by torchrun, srun, mpirun or horovodrun: this process is one rank
    if mpi:
        return "mpirun"  # Open MPI's and MPICH's mpirun place ranks over a Slurm allocation by themselves
    if "SLURM_JOB_ID" in env:
        return "srun"  # a batch script or salloc shell: spread the ranks over the allocation
    return "none" if ranks == 1 else "local"


def pump(stream, prefix: str, sink) -> None:
    """A rank's output into the log, line by line, with its prefix; the profiler library's marks left out."""
    for line in iter(stream.readline, ""):
        if KINETO_MARK.match(line):
            continue
        sink.write(prefix + line)
        sink.flush()
    stream.close()


def thread_env(ranks_here: int) -> dict:
    """OMP threads per CPU rank: share the cores instead of oversubscribing them."""
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = sysinfo.threads_per_rank(ranks_here)
    return env


def _rank_start(cores: list[int] | None) -> None:
    """In a rank, before exec: the kernel kills it when the launcher dies, however the launcher dies; and it runs
    on `cores` when the launcher binds the ranks."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if cores:
        os.sched_setaffinity(0, cores)


def core_sets(ranks: int, environ=None) -> list[list[int]] | None:
    """With LAB_CPU_BIND=cores, one disjoint share of this process's usable cores per local rank, so that ranks
    do not migrate over each other's cores (what srun's --cpu-bind=cores does on a cluster); None when the local
    ranks are not bound (the default), the OS cannot bind, or there are fewer cores than ranks."""
    env = os.environ if environ is None else environ
    if env.get("LAB_CPU_BIND") != "cores" or not hasattr(os, "sched_setaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    per = len(usable) // ranks
    return [usable[r * per : (r + 1) * per] for r in range(ranks)] if per else None


def _span(cores: list[int]) -> str:
    """0-3 for a run of cores, else the list."""
    if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def exit_cause(code: int) -> str:
    """A rank's exit status in words (Popen gives -N for a signal, shells and srun 128+N)."""
    if code == EXIT_INTERRUPTED:
        return "checkpointed and stopped after Ctrl-C (SIGINT)"
    if code < 0 or 128 < code < 128 + 65:
        try:
            return f"was killed by signal {signal.Signals(-code if code < 0 else code - 128).name}"
        except ValueError:
            pass
    if code == EXIT_PREEMPTED:
        return "checkpointed and stopped on request (preempted)"
    return f"exited with status {code}"


def spawn_local(job: RankJob, stdout=None) -> int:
    """Start the job's rank processes here; stream their output; end them all if one fails.

    The ranks die with the launcher (PR_SET_PDEATHSIG), so none is ever orphaned. The
    launcher's own SIGTERM is forwarded (the ranks checkpoint within term_grace_s); a
    rank that does not leave in time, or is stopped (SIGSTOP), is killed.
    """
    from kernels.base.ports import free_port

    stdout = stdout or sys.stdout
    port = free_port()
    extra, cores = thread_env(job.ranks), core_sets(job.ranks)
    for k, v in extra.items():
        print(f"launcher: {k}={v} (set for each rank)", file=stdout, flush=True)
    if cores:
        bound = "; ".join(f"rank {r} on cores {_span(c)}" for r, c in enumerate(cores))
        print(f"launcher: LAB_CPU_BIND=cores: {bound}", file=stdout, flush=True)
    procs = []
    for rank in range(job.ranks):
        env = {
            **os.environ,
            **extra,
            "RANK": str(rank),
            "WORLD_SIZE": str(job.ranks),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(job.ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
            LAUNCHER_ENV: "local",
            **job.env,
        }
        procs.append(
            subprocess.Popen(
                job.command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                preexec_fn=partial(_rank_start, cores and cores[rank]),
            )
        )
    pumps = [
        threading.Thread(target=pump, args=(p.stdout, "" if r == 0 else f"[rank {r}] ", stdout), daemon=True)
        for r, p in enumerate(procs)
    ]
    for t in pumps:
        t.start()
    stop = {"signal": None, "now": False}
    previous = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum, frame):  # TERM or a first Ctrl-C: the ranks checkpoint; a second Ctrl-C: stop now
            stop["now"] = signum == signal.SIGINT and stop["signal"] == signal.SIGINT
            stop["signal"] = signum

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = _wait_all(procs, stdout, stop, job.term_grace_s + 15)
    finally:  # an error here: take the ranks down with us
        _terminate(procs, FAILURE_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop["signal"] == signal.SIGINT and rc in (0, EXIT_PREEMPTED):
        rc = EXIT_INTERRUPTED if rc else 0
    for t in pumps:
        t.join(timeout=5)
    mark_if_died(job.run_dir, rc, "the local launcher", stdout)
    return 128 - rc if rc < 0 else rc  # a rank killed by signal N: 128+N, as a shell reports it


def mark_if_died(run_dir, rc: int, seen_by: str, stdout) -> None:
    """A launcher whose ranks ended badly marks a record they left 'running' as failed, with the cause."""
    if rc not in (0, EXIT_PREEMPTED, EXIT_INTERRUPTED) and records.mark_failed(
        run_dir, f"a rank {exit_cause(rc)} (seen by {seen_by})"
    ):
        print(f"launcher: marked {run_dir} failed", file=stdout, flush=True)


def _terminate(procs: list, grace_s: float) -> None:
    """SIGTERM (and SIGCONT, so that a stopped rank can act on it) to every live rank; SIGKILL after grace_s."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
        p.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait_all(procs: list, stdout, stop: dict | None = None, stop_grace_s: float = 75) -> int:
    """Wait for every rank; on the first failure end the others. Returns the first non-zero status.

    A SIGTERM to the launcher (stop['signal']) is forwarded to the ranks, which then checkpoint;
    they get stop_grace_s before they are killed.
    """
    rc = 0
    remaining = set(range(len(procs)))
    forwarded = None
    while remaining:
        if stop and stop["signal"] and forwarded is None:
            print(
                f"launcher: got {signal.Signals(stop['signal']).name}; asking the ranks to checkpoint and stop",
                file=stdout,
                flush=True,
            )
            for r in remaining:
                procs[r].send_signal(signal.SIGTERM)
            forwarded = time.monotonic()
        if forwarded is not None and (stop["now"] or time.monotonic() - forwarded > stop_grace_s):
            # a second Ctrl-C: the ranks, which got it too, record why and leave; whoever has not in 3 s is killed
            _terminate([procs[r] for r in remaining], 3 if stop["now"] else 0)
        for r in list(remaining):
            code = procs[r].poll()
            if code is None:
                continue
            remaining.discard(r)
            if code != 0 and rc == 0:
                rc = code
                if code not in (EXIT_PREEMPTED, EXIT_INTERRUPTED):
                    print(f"launcher: rank {r} {exit_cause(code)}; ending the other ranks", file=stdout, flush=True)
                    _terminate([procs[o] for o in remaining], FAILURE_GRACE_S)
        if remaining:
            try:
                procs[next(iter(remaining))].wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    return rc


def geometry(gpus: int, per_node: int) -> tuple[int, int]:
    """(nodes, tasks per node) for `gpus` ranks on nodes of `per_node` GPUs (or rank slots)."""
    if gpus < 1 or per_node < 1:
        raise ConfigError(f"parameter 'gpus': need gpus >= 1 and gpus_per_node >= 1 (got {gpus}, {per_node})")
    if gpus <= per_node:
        return 1, gpus
    if gpus % per_node:
        lo, hi = gpus - gpus % per_node, gpus - gpus % per_node + per_node
        raise ConfigError(
            f"parameter 'gpus': {gpus} ranks do not fill nodes of {per_node} evenly; "
            f"use gpus={lo} or {hi} (or fewer than {per_node} on one node)"
        )
    return gpus // per_node, per_node


def sbatch_geometry_args(gpus: int, per_node: int, with_gpus: bool = True) -> list[str]:
    nodes, tasks = geometry(gpus, per_node)
    args = [f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    return args + ([f"--gpus-per-node={tasks}"] if with_gpus else [])


def allocation_nodes(env) -> int:
    """Nodes of the current Slurm allocation (1 outside one)."""
    return int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)


def check_allocation(ranks: int, environ=None) -> None:
    """The current Slurm allocation can hold `ranks` ranks (and GPUs, on GPU nodes); else say what to ask for."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env:
        raise ConfigError(
            "parameter 'launcher': srun needs a Slurm allocation (no SLURM_JOB_ID); "
            "submit with sbatch/salloc, or use launcher=local"
        )
    nodes = allocation_nodes(env)
    slots = int(env.get("SLURM_NTASKS") or nodes)
    gpus_on_node = int(env.get("SLURM_GPUS_ON_NODE") or 0)
    short = []
    if ranks > slots:
        short.append(f"{slots} task slot(s) (SLURM_NTASKS)")
    if gpus_on_node and ranks > nodes * gpus_on_node:
        short.append(f"{nodes * gpus_on_node} GPU(s) ({nodes} node(s) x SLURM_GPUS_ON_NODE={gpus_on_node})")
    if short:
        per_node = gpus_on_node or int(env.get("SLURM_NTASKS_PER_NODE") or 0) or max(1, slots // nodes)
        try:
            hint = "sbatch " + " ".join(sbatch_geometry_args(ranks, per_node, with_gpus=bool(gpus_on_node)))
        except ConfigError as e:
            hint = str(e)
        raise ConfigError(
            f"parameter 'gpus': gpus={ranks} but the allocation (job {env['SLURM_JOB_ID']}, "
            f"{nodes} node(s)) has only {' and '.join(short)}; resubmit with `{hint} ...` "
            f"or use `lab submit notebooks/01_train.ipynb --gpus {ranks} --gpus-per-node {per_node} "
            "...`"
        )


def srun_command(job: RankJob, environ=None, extra=()) -> list[str]:
    """The srun line that starts the job's ranks over the current allocation (`extra`: more srun options, such
    as --mpi for an MPI program).

    With LAB_CONTAINER set (an Apptainer image), every rank runs inside it.
    """
    env = os.environ if environ is None else environ
    nodes = min(allocation_nodes(env), job.ranks)
    # --kill-on-bad-exit: one rank that fails ends the step; --wait: ranks still running a minute after
    # another ended (a hang) are ended too
    cmd = ["srun", f"--ntasks={job.ranks}", f"--nodes={nodes}", "--kill-on-bad-exit=1", "--wait=60", "--export=ALL"]
    if job.ranks % nodes == 0:
        cmd.append(f"--ntasks-per-node={job.ranks // nodes}")
    # Since Slurm 22.05 srun does not inherit the job's --cpus-per-task: without it each rank would get one core,
    # shared with its data workers and threads. Bound to cores, so ranks do not migrate over each other's.
    cpus = env.get("SLURM_CPUS_PER_TASK")
    if cpus:
        cmd += [f"--cpus-per-task={cpus}", f"--cpu-bind={env.get('LAB_CPU_BIND', 'cores')}"]
    cmd += list(extra)
    worker = list(job.command)
    if env.get("LAB_CONTAINER"):  # the same wrapper as the batch script: binds and --nv decided in one place
        worker = [str(PROJECT_ROOT / "apptainer" / "run.sh"), "exec", "python3", *worker[1:]]
    if env.get(RANK_WRAPPER_ENV):  # a profiler around each rank (slurm/profile_nsys.sbatch, profile_ncu.sbatch)
        worker = shlex.split(env[RANK_WRAPPER_ENV]) + worker
    return cmd + worker


def run_srun(job: RankJob, stdout=None, cmd: list[str] | None = None) -> int:
    """Run a launcher's command line (srun by default; mpirun for MPI ranks), printing it and streaming its
    output; returns its exit status."""
    stdout = stdout or sys.stdout
    cmd = cmd or srun_command(job)
    print("launcher: " + shlex.join(cmd), file=stdout, flush=True)
    # the rendezvous port: one random free port for every rank (srun passes the environment on), unless set;
    # LAB_RUN_DIR: where a rank wrapper (nsys -o %q{LAB_RUN_DIR}/...) puts its reports
    from kernels.base.ports import free_port

    port = {} if os.environ.get("MASTER_PORT") else {"MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **port, "LAB_RUN_DIR": str(job.run_dir), **job.env},
    )
    pump(proc.stdout, "", stdout)
    rc = proc.wait()
    mark_if_died(job.run_dir, rc, cmd[0], stdout)  # ranks killed without a word (NCCL's watchdog) leave no "running"
    return rc


def leave(rc: int) -> None:
    """End a rank process without interpreter teardown.

    Its record is written and its output flushed; what is left are C++ objects of
    torch.distributed (gloo threads, the store) that, destroyed in arbitrary order at
    interpreter exit, can abort a run that completed ("terminate called without an
    active exception"; seen in about 1 of 40 two-rank runs, always with no Python frame
    left). Skipping that teardown is what makes the exit status trustworthy.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
