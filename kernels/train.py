"""Command line: `python -m kernels.train --gpus 2 --dataset digits ...`.

Parameters are those of kernels/params.py (`--help` lists them). Launchers:
- none:  this process is one rank (under torchrun or srun, which set the rank variables);
- local: spawn `gpus` rank processes on this machine (gloo on CPU, nccl on GPUs);
- srun:  start the ranks with srun inside the current Slurm allocation;
- auto:  none under torchrun's variables, in-process for gpus=1, else local.
Everything is validated before a process is spawned or a file is written; bad
input exits with status 2 and a message naming the parameter.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

from kernels.records import ensure_not_complete
from kernels.params import PARAMS, ConfigError, RunConfig, check_environment, resolve, unknown_name_error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernels.train", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    for prm in PARAMS:
        kw = {"nargs": "?", "const": "true"} if prm.type is bool else {}
        choices = f" {{{','.join(prm.choices)}}}" if prm.choices else ""
        p.add_argument(f"--{prm.name}", dest=prm.name, default=argparse.SUPPRESS, metavar=prm.type.__name__.upper(),
                       help=f"{prm.doc}{choices} (default: {prm.default!r})", **kw)
    return p


def parse_args(argv: list[str]) -> dict:
    known, rest = build_parser().parse_known_args(argv)
    if rest:
        name = rest[0].lstrip("-").split("=")[0].replace("-", "_")
        raise unknown_name_error(name, where=f" on the command line ({rest[0]})")
    return vars(known)


def choose_launcher(cfg: RunConfig, environ=None) -> str:
    env = os.environ if environ is None else environ
    if cfg.launcher != "auto":
        return cfg.launcher
    if "RANK" in env and "WORLD_SIZE" in env:
        return "none"
    return "none" if cfg.gpus == 1 else "local"


def worker_command(cfg: RunConfig) -> list[str]:
    return [sys.executable, "-m", "kernels.train", *cfg.replace(launcher="none").cli_args()]


def _pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, ""):
        sink.write(prefix + line)
        sink.flush()
    stream.close()


def _thread_env(cfg: RunConfig, ranks_here: int) -> dict:
    """OMP threads per CPU rank: share the cores instead of oversubscribing them."""
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks_here))
    return env


def spawn_local(cfg: RunConfig, stdout=None) -> int:
    """Start cfg.gpus rank processes here; stream their output; stop all if one fails."""
    from kernels.dist import free_port

    stdout = stdout or sys.stdout
    port = free_port()
    extra = _thread_env(cfg, cfg.gpus)
    for k, v in extra.items():
        print(f"launcher: {k}={v} (set for each rank)", file=stdout, flush=True)
    procs = []
    for rank in range(cfg.gpus):
        env = {**os.environ, **extra, "RANK": str(rank), "WORLD_SIZE": str(cfg.gpus), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(cfg.gpus), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen(worker_command(cfg), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1))
    pumps = [threading.Thread(target=_pump, args=(p.stdout, "" if r == 0 else f"[rank {r}] ", stdout), daemon=True)
             for r, p in enumerate(procs)]
    for t in pumps:
        t.start()
    rc = 0
    remaining = set(range(len(procs)))
    while remaining:
        for r in list(remaining):
            code = procs[r].poll()
            if code is None:
                continue
            remaining.discard(r)
            if code != 0 and rc == 0:
                rc = code
                print(f"launcher: rank {r} exited with status {code}; stopping the other ranks", file=stdout,
                      flush=True)
                for other in remaining:
                    procs[other].terminate()
        if remaining:
            try:
                procs[next(iter(remaining))].wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    for t in pumps:
        t.join(timeout=5)
    return rc


def srun_command(cfg: RunConfig, environ=None) -> list[str]:
    """The srun line that starts cfg.gpus ranks over the current allocation."""
    env = os.environ if environ is None else environ
    nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    nodes = min(nodes, cfg.gpus)
    cmd = ["srun", f"--ntasks={cfg.gpus}", f"--nodes={nodes}", "--kill-on-bad-exit=1", "--export=ALL"]
    if cfg.gpus % nodes == 0:
        cmd.append(f"--ntasks-per-node={cfg.gpus // nodes}")
    return cmd + worker_command(cfg)


def run_srun(cfg: RunConfig, stdout=None) -> int:
    stdout = stdout or sys.stdout
    if "SLURM_JOB_ID" not in os.environ:
        raise ConfigError("parameter 'launcher': srun needs a Slurm allocation (no SLURM_JOB_ID); "
                          "submit with sbatch/salloc, or use launcher=local")
    cmd = srun_command(cfg)
    print("launcher: " + shlex.join(cmd), file=stdout, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _pump(proc.stdout, "", stdout)
    return proc.wait()


def launch(cfg: RunConfig, stdout=None) -> tuple[int, Path]:
    """Validate, fix the run id, start the ranks. Returns (exit status, run directory)."""
    from kernels.ddp_core import make_run_id

    launcher = choose_launcher(cfg)
    ranks_here = 1 if launcher in ("none", "srun") else cfg.gpus
    check_environment(cfg, ranks_on_this_node=ranks_here)
    cfg = cfg.replace(run_id=make_run_id(cfg))
    run_dir = cfg.results_root / cfg.run_id
    ensure_not_complete(run_dir)
    if launcher == "none":
        from kernels import ddp_core

        ddp_core.run(cfg)
        return 0, run_dir
    if launcher == "local":
        return spawn_local(cfg, stdout), run_dir
    return run_srun(cfg, stdout), run_dir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = resolve(parse_args(argv))
        rc, run_dir = launch(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    from kernels.dist import rank_env

    is_worker = choose_launcher(cfg) == "none" and rank_env().source != "single"
    if rc == 0 and not is_worker:
        print(f"record: {run_dir}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
