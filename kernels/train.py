"""Command line: `lab train --gpus 2 --dataset digits ...` (also `python -m kernels.train`).

Parameters are those of kernels/base/params.py and the workloads' (`--help` lists them);
kernels/launch/ranks.py starts the ranks through kernels/launch/launchers.py (`--launcher auto|none|local|srun`).
Everything is validated before a process is spawned or a file is written; bad
input exits with status 2 and a message naming the parameter.
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback

from kernels.base import files
from kernels.launch.config import resolve, table
from kernels.base.errors import ConfigError, os_error_line
from kernels.launch.launchers import EXIT_INTERRUPTED, leave
from kernels.launch.ranks import prepare, start
from kernels.base.params import PER_DEVICE, PER_WORKLOAD, unknown_name_error


def _default_text(p, workloads) -> str:
    if p.default is PER_WORKLOAD:
        return "per workload: " + ", ".join(f"{w.name} {w.defaults[p.name]!r}" for w in workloads)
    if p.default is PER_DEVICE:
        return "true with CUDA, false on CPU"
    return repr(p.default)


def build_parser(workload: str | None = None) -> argparse.ArgumentParser:
    """The CLI: common parameters, then one group per workload (and `workload`'s, for a plug-in)."""
    from kernels.workloads import get_workload, registered

    wls = registered()
    if workload and workload not in {w.name for w in wls}:
        wls.append(get_workload(workload))
    p = argparse.ArgumentParser(
        prog="lab train",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    groups = {"common": p.add_argument_group("common parameters")}
    for wl in wls:
        groups[wl.name] = p.add_argument_group(
            f"workload {wl.name}: {wl.title}", f"data sets: {', '.join(wl.datasets)}; used with --workload {wl.name}"
        )
    for prm in table(workload):
        kw = {"nargs": "?", "const": "true"} if prm.type is bool else {}
        choices = f" {{{','.join(prm.choices)}}}" if prm.choices else ""
        groups[prm.group].add_argument(
            f"--{prm.name}",
            dest=prm.name,
            default=argparse.SUPPRESS,
            metavar=prm.type.__name__.upper(),
            help=f"{prm.doc}{choices} (default: {_default_text(prm, wls)})".replace("%", "%%"),
            **kw,
        )  # argparse formats help with %
    return p


def parse_args(argv: list[str]) -> dict:
    seen = set()
    for a in argv:  # argparse keeps the last of a repeated flag; a repeated flag is more likely a mistake
        if a.startswith("--") and len(a) > 2:
            name = a[2:].split("=", 1)[0]
            if name in seen:
                raise ConfigError(f"parameter '{name}' is given twice on the command line; give it once")
            seen.add(name)
    workload = None
    for i, a in enumerate(argv):  # a plug-in workload's parameters join the parser
        if a == "--workload" and i + 1 < len(argv):
            workload = argv[i + 1]
        elif a.startswith("--workload="):
            workload = a.split("=", 1)[1]
    known, rest = build_parser(workload if workload and ":" in workload else None).parse_known_args(argv)
    if rest:
        name = rest[0].lstrip("-").split("=")[0].replace("-", "_")
        raise unknown_name_error(name, where=f" on the command line ({rest[0]})", known=[p.name for p in table()])
    return vars(known)


def rank_failure(e: BaseException) -> int:
    """A rank's exception, in one line where one line says it all; the rank's exit status."""
    from kernels.run import guards  # imported by the rank's loop already; the driver never imports torch

    if isinstance(e, guards.Terminated):  # a second Ctrl-C, or TERM with no step boundary in time
        print(f"stopped: {e}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED if guards.INTERRUPTED else 1
    left = guards.peer_left(e)
    if files.disk_full_at(e):  # the record says so too (kernels/base/files.py)
        print(
            f"failed: {files.failure_text(e)}; free space there and run the same command again to resume",
            file=sys.stderr,
            flush=True,
        )
    elif left:  # the rank that left says why; this one's traceback would only bury it
        print(
            f"failed: another rank left during a collective ({left}); its output says why", file=sys.stderr, flush=True
        )
    else:
        traceback.print_exc()
    return 1


def _single_rank() -> bool:
    """A rank started by hand, alone (not by a launcher, which prints the record's path itself)."""
    from kernels.base.dist import rank_env  # imports torch: only a rank, which has it already, asks

    return rank_env().source == "single"


def main(argv: list[str] | None = None) -> int:
    # Until a rank installs its handlers (after importing torch), a USR1 from the scheduler must not
    # kill it; the batch script's stop file carries the request to the first check.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    argv = sys.argv[1:] if argv is None else argv
    is_rank = False
    try:
        cfg = resolve(parse_args(argv))
        launcher, cfg = prepare(cfg)
        is_rank = launcher == "none"
        rc = start(launcher, cfg)
    except ConfigError as e:
        if not getattr(e, "said_by_rank0", False):
            print(f"error: {e}", file=sys.stderr, flush=True)
        rc = 2
    except BaseException as e:
        if is_rank:
            rc = rank_failure(e)
        elif isinstance(e, OSError) and os_error_line(e):  # a folder the driver may not write (data_dir, ...)
            print(os_error_line(e), file=sys.stderr, flush=True)
            rc = 2
        else:
            raise
    else:
        if rc == 0 and (not is_rank or _single_rank()):
            print(f"record: {cfg.results_root / cfg.run_id}", flush=True)
    if is_rank:
        leave(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
