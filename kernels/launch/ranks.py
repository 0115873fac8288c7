"""Starting ranks: the rank environment, local processes, srun lines, horovodrun, and what their exits mean.

Shared by every command that starts ranks: the training CLI (kernels/train.py), the
communication benchmark (kernels/comm/bench.py), the notebooks' runner, study and submit.
Launchers:
- none:  this process is one rank (under torchrun or srun, which set the rank variables);
- local: spawn `gpus` rank processes on this machine (gloo on CPU, nccl on GPUs);
- srun:  start the ranks with srun inside the current Slurm allocation;
- auto:  none in a torchrun or srun rank, srun inside an allocation (batch
         script, salloc), in-process for gpus=1, else local.
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

from kernels.records import schema as records
from kernels.base import sysinfo
from kernels.launch.config import check_environment, settled
from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT
from kernels.base.params import RunConfig
from kernels.records.schema import ensure_not_complete

LAUNCHER_ENV = "LAB_LAUNCHER"  # set by this module's local launcher, so the record names it


PREPARED_ENV = "LAB_PREPARED_RUN"  # the run id the driver resolved and checked, set for its ranks (prepare)
RANK_WRAPPER_ENV = "LAB_RANK_WRAPPER"  # a command prefix for every srun rank (the Nsight wrappers set it)


def choose_launcher(cfg: RunConfig, environ=None) -> str:
    env = os.environ if environ is None else environ
    if cfg.launcher != "auto":
        return cfg.launcher
    if ("RANK" in env and "WORLD_SIZE" in env) or "SLURM_STEP_ID" in env or "HOROVOD_RANK" in env:
        return "none"  # started by torchrun, srun or horovodrun: this process is one rank
    if "SLURM_JOB_ID" in env:
        return "srun"  # a batch script or salloc shell: spread the ranks over the allocation
    return "none" if cfg.gpus == 1 else "local"


def worker_command(cfg: RunConfig) -> list[str]:
    return [sys.executable, "-m", "kernels.train", *settled(cfg, launcher="none").cli_args()]


# libkineto (torch.profiler) prints these at every profiler start and stop, whatever KINETO_LOG_LEVEL says
KINETO_MARK = re.compile(r"(?:USDT|STAGE):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \w+\.cpp:\d+\] ")


def _pump(stream, prefix: str, sink) -> None:
    """A rank's output into the log, line by line, with its prefix; the profiler library's marks left out."""
    for line in iter(stream.readline, ""):
        if KINETO_MARK.match(line):
            continue
        sink.write(prefix + line)
        sink.flush()
    stream.close()


def _thread_env(cfg: RunConfig, ranks_here: int) -> dict:
    """OMP threads per CPU rank: share the cores instead of oversubscribing them."""
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = sysinfo.threads_per_rank(ranks_here)
    return env


EXIT_PREEMPTED = 75   # the ranks checkpointed and stopped on request (USR1/TERM): resumable (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # the same after Ctrl-C (SIGINT; 128 + 2, as a shell reports it)


FAILURE_GRACE_S = 10  # after a rank failed, the others get this long to leave before SIGKILL


def _prepared(cfg) -> dict:
    """The environment that tells a training rank its driver has resolved and checked its run (prepare)."""
    return {PREPARED_ENV: cfg.run_id} if isinstance(cfg, RunConfig) else {}


def _die_with_parent() -> None:
    """In a rank, before exec: the kernel kills it when the launcher dies, however the launcher dies."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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


def spawn_local(cfg: RunConfig, stdout=None, command: list[str] | None = None, run_dir=None) -> int:
    """Start cfg.gpus rank processes here; stream their output; end them all if one fails.

    The ranks die with the launcher (PR_SET_PDEATHSIG), so none is ever orphaned. The
    launcher's own SIGTERM is forwarded (the ranks checkpoint within term_grace_s); a
    rank that does not leave in time, or is stopped (SIGSTOP), is killed. `command` and `run_dir`
    serve other rank programs (the communication benchmark): cfg then needs only `gpus` and `term_grace_s`.
    """
    from kernels.base.ports import free_port

    stdout = stdout or sys.stdout
    port = free_port()
    extra = _thread_env(cfg, cfg.gpus)
    for k, v in extra.items():
        print(f"launcher: {k}={v} (set for each rank)", file=stdout, flush=True)
    procs = []
    for rank in range(cfg.gpus):
        env = {**os.environ, **extra, "RANK": str(rank), "WORLD_SIZE": str(cfg.gpus), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(cfg.gpus), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONUNBUFFERED": "1", LAUNCHER_ENV: "local", **_prepared(cfg)}
        procs.append(subprocess.Popen(command or worker_command(cfg), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1, preexec_fn=_die_with_parent))
    pumps = [threading.Thread(target=_pump, args=(p.stdout, "" if r == 0 else f"[rank {r}] ", stdout), daemon=True)
             for r, p in enumerate(procs)]
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
        rc = _wait_all(procs, stdout, stop, cfg.term_grace_s + 15)
    finally:  # an error here: take the ranks down with us
        _terminate(procs, FAILURE_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop["signal"] == signal.SIGINT and rc in (0, EXIT_PREEMPTED):
        rc = EXIT_INTERRUPTED if rc else 0
    for t in pumps:
        t.join(timeout=5)
    mark_if_died(run_dir or cfg.results_root / cfg.run_id, rc, "the local launcher", stdout)
    return 128 - rc if rc < 0 else rc  # a rank killed by signal N: 128+N, as a shell reports it


def mark_if_died(run_dir, rc: int, seen_by: str, stdout) -> None:
    """A launcher whose ranks ended badly marks a record they left 'running' as failed, with the cause."""
    if rc not in (0, EXIT_PREEMPTED, EXIT_INTERRUPTED) and records.mark_failed(run_dir, f"a rank {exit_cause(rc)} "
                                                                                        f"(seen by {seen_by})"):
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
            print(f"launcher: got {signal.Signals(stop['signal']).name}; asking the ranks to checkpoint and stop",
                  file=stdout,
                  flush=True)
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
        raise ConfigError(f"parameter 'gpus': {gpus} ranks do not fill nodes of {per_node} evenly; "
                          f"use gpus={lo} or {hi} (or fewer than {per_node} on one node)")
    return gpus // per_node, per_node


def sbatch_geometry_args(gpus: int, per_node: int, with_gpus: bool = True) -> list[str]:
    nodes, tasks = geometry(gpus, per_node)
    args = [f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    return args + ([f"--gpus-per-node={tasks}"] if with_gpus else [])


def allocation_nodes(env) -> int:
    """Nodes of the current Slurm allocation (1 outside one)."""
    return int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)


def check_allocation(cfg: RunConfig, environ=None) -> None:
    """The current Slurm allocation can hold cfg.gpus ranks (and GPUs, on GPU nodes); else say what to ask for."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env:
        raise ConfigError("parameter 'launcher': srun needs a Slurm allocation (no SLURM_JOB_ID); "
                          "submit with sbatch/salloc, or use launcher=local")
    nodes = allocation_nodes(env)
    slots = int(env.get("SLURM_NTASKS") or nodes)
    gpus_on_node = int(env.get("SLURM_GPUS_ON_NODE") or 0)
    short = []
    if cfg.gpus > slots:
        short.append(f"{slots} task slot(s) (SLURM_NTASKS)")
    if gpus_on_node and cfg.gpus > nodes * gpus_on_node:
        short.append(f"{nodes * gpus_on_node} GPU(s) ({nodes} node(s) x SLURM_GPUS_ON_NODE={gpus_on_node})")
    if short:
        per_node = gpus_on_node or int(env.get("SLURM_NTASKS_PER_NODE") or 0) or max(1, slots // nodes)
        try:
            hint = "sbatch " + " ".join(sbatch_geometry_args(cfg.gpus, per_node, with_gpus=bool(gpus_on_node)))
        except ConfigError as e:
            hint = str(e)
        raise ConfigError(f"parameter 'gpus': gpus={cfg.gpus} but the allocation (job {env['SLURM_JOB_ID']}, "
                          f"{nodes} node(s)) has only {' and '.join(short)}; resubmit with `{hint} ...` "
                          f"or use `lab submit notebooks/01_train.ipynb --gpus {cfg.gpus} --gpus-per-node {per_node} "
                          "...`")


def srun_command(cfg: RunConfig, environ=None, command: list[str] | None = None, extra=()) -> list[str]:
    """The srun line that starts cfg.gpus ranks over the current allocation (running `command`, default the
    training rank; `extra`: more srun options, such as --mpi for an MPI program).

    With LAB_CONTAINER set (an Apptainer image), every rank runs inside it.
    """
    env = os.environ if environ is None else environ
    nodes = min(allocation_nodes(env), cfg.gpus)
    # --kill-on-bad-exit: one rank that fails ends the step; --wait: ranks still running a minute after
    # another ended (a hang) are ended too
    cmd = ["srun", f"--ntasks={cfg.gpus}", f"--nodes={nodes}", "--kill-on-bad-exit=1", "--wait=60", "--export=ALL"]
    if cfg.gpus % nodes == 0:
        cmd.append(f"--ntasks-per-node={cfg.gpus // nodes}")
    # Since Slurm 22.05 srun does not inherit the job's --cpus-per-task: without it each rank would get one core,
    # shared with its data workers and threads. Bound to cores, so ranks do not migrate over each other's.
    cpus = env.get("SLURM_CPUS_PER_TASK")
    if cpus:
        cmd += [f"--cpus-per-task={cpus}", f"--cpu-bind={env.get('LAB_CPU_BIND', 'cores')}"]
    cmd += list(extra)
    worker = command or worker_command(cfg)
    if env.get("LAB_CONTAINER"):  # the same wrapper as the batch script: binds and --nv decided in one place
        worker = [str(PROJECT_ROOT / "apptainer" / "run.sh"), "exec", "python3", *worker[1:]]
    if env.get(RANK_WRAPPER_ENV):  # a profiler around each rank (slurm/profile_nsys.sbatch, profile_ncu.sbatch)
        worker = shlex.split(env[RANK_WRAPPER_ENV]) + worker
    return cmd + worker


def run_srun(cfg: RunConfig, stdout=None, cmd: list[str] | None = None) -> int:
    """Run a launcher's command line (srun by default; mpirun for MPI ranks), printing it and streaming its
    output; returns its exit status."""
    stdout = stdout or sys.stdout
    cmd = cmd or srun_command(cfg)
    print("launcher: " + shlex.join(cmd), file=stdout, flush=True)
    # the rendezvous port: one random free port for every rank (srun passes the environment on), unless set;
    # LAB_RUN_DIR: where a rank wrapper (nsys -o %q{LAB_RUN_DIR}/...) puts its reports
    from kernels.base.ports import free_port

    port = {} if os.environ.get("MASTER_PORT") else {"MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **port, **_prepared(cfg),
                                 **({"LAB_RUN_DIR": str(cfg.results_root / cfg.run_id)}
                                    if isinstance(cfg, RunConfig) else {})})
    _pump(proc.stdout, "", stdout)
    rc = proc.wait()
    if isinstance(cfg, RunConfig):  # a training run (not a commbench): ranks killed without a word (NCCL's
        mark_if_died(cfg.results_root / cfg.run_id, rc, cmd[0], stdout)  # watchdog aborts) leave no "running"
    return rc


def prepare(cfg: RunConfig, launcher: str | None = None) -> tuple[str, RunConfig]:
    """Validate against this machine and fix the run id, before anything starts. A rank its driver prepared (the
    driver names the run in PREPARED_ENV) checks only what is its own: its device, cores, software and data."""
    from kernels.run.ids import make_run_id

    launcher = launcher or choose_launcher(cfg)
    if launcher == "none" and cfg.run_id and os.environ.get(PREPARED_ENV) == cfg.run_id:
        check_environment(cfg, ranks_on_this_node=1, rank_only=True)
        return launcher, cfg
    if launcher == "srun":
        check_allocation(cfg)
    ranks_here = 1 if launcher in ("none", "srun") else cfg.gpus
    check_environment(cfg, ranks_on_this_node=ranks_here)
    # the ranks get the resolved run id and results folder, not whatever their environment would give
    cfg = settled(cfg, run_id=make_run_id(cfg), launcher=launcher, results_dir=str(cfg.results_root))
    records.refuse_foreign(cfg.results_root, cfg.results_root / cfg.run_id)
    ensure_not_complete(cfg.results_root / cfg.run_id)
    if launcher != "none":  # fail fast, before starting ranks, when a live run holds the directory
        records.RunLock(cfg.results_root / cfg.run_id).check()
    return launcher, cfg


def spawn_horovodrun(cfg: RunConfig, stdout=None) -> int:
    """engine=horovod on this machine: horovodrun starts the ranks (Gloo controller); the lab's process group
    meets at MASTER_ADDR/MASTER_PORT, which horovodrun passes on to every rank."""
    from kernels.engines.horovod import horovodrun_command
    from kernels.base.ports import free_port

    stdout = stdout or sys.stdout
    extra = {**_thread_env(cfg, cfg.gpus), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
             "PYTHONUNBUFFERED": "1", LAUNCHER_ENV: "horovodrun", **_prepared(cfg)}
    cmd = horovodrun_command(cfg, worker_command(cfg))
    print("launcher: " + shlex.join(cmd), file=stdout, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, **extra}, start_new_session=True)
    try:
        _pump(proc.stdout, "", stdout)
        rc = proc.wait()
    finally:  # interrupted: horovodrun and its ranks go with us
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=FAILURE_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    mark_if_died(cfg.results_root / cfg.run_id, rc, "horovodrun", stdout)
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
        print(f"run {cfg.run_id} has already done {done} steps, stop_after_steps={cfg.stop_after_steps}: nothing to "
              f"do (a larger stop_after_steps goes further, 0 runs to the end)", file=stdout or sys.stdout, flush=True)
        return 0
    if launcher == "none":
        from kernels import ddp_core
        from kernels.run import guards

        if ddp_core.run(cfg) != "preempted":
            return 0
        return EXIT_INTERRUPTED if guards.INTERRUPTED else EXIT_PREEMPTED
    if launcher == "local":
        return spawn_horovodrun(cfg, stdout) if cfg.engine == "horovod" else spawn_local(cfg, stdout)
    if cfg.engine == "horovod":  # srun starts MPI ranks: Horovod's MPI controller
        return run_srun(cfg, stdout, srun_command(cfg, extra=[f"--mpi={os.environ.get('LAB_SRUN_MPI', 'pmix')}"]))
    return run_srun(cfg, stdout)


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
