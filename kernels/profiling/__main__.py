"""python -m kernels.profiling wrapper nsys|ncu [--print]   the rank prefix of an Nsight wrapper
python -m kernels.profiling breakdown RUN_DIR [...]          (re)compute a run's breakdown from its traces
python -m kernels.profiling nsys-summary RUN_DIR [...]       Nsight Systems reports -> <run>/nsys/summary.json
python -m kernels.profiling nsys-summary --pending RUNS_DIR  the same for every run not summarised yet
python -m kernels.profiling ncu-summary RUN_DIR [...]        Nsight Compute reports -> <run>/ncu/summary.json
python -m kernels.profiling ncu-summary --pending RUNS_DIR   the same for every run not summarised yet"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.profiling", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wrapper", help="print the command prefix that runs each rank under nsys or ncu")
    w.add_argument("tool", choices=("nsys", "ncu"))
    w.add_argument("--print", action="store_true", help="print the prefix even when the tool is not on PATH")
    b = sub.add_parser("breakdown", help="time by category and top operators from a run's traces")
    b.add_argument("run_dir", type=Path, nargs="+")
    for tool, what in (("nsys", "Nsight Systems"), ("ncu", "Nsight Compute")):
        n = sub.add_parser(f"{tool}-summary", help=f"read a run's {what} reports back into its record")
        n.add_argument("run_dir", type=Path, nargs="*")
        n.add_argument("--pending", type=Path, help="every run under this folder with reports and no summary yet")
    args = ap.parse_args(argv)
    if args.cmd.endswith("-summary"):
        return read_back(args.cmd, args.run_dir, args.pending)
    if args.cmd == "wrapper":
        from kernels.profiling import tools

        err = tools.missing(args.tool)
        if err and not args.print:
            print(f"error: {err}", file=sys.stderr)
            return 127
        try:
            print(shlex.join(tools.prefix(args.tool)))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    from kernels.profiling import breakdown

    rc = 0
    for run in args.run_dir:
        traces = sorted((run / "traces").glob("*.pt.trace.json*")) if run.is_dir() else [run] if run.is_file() else []
        if not traces:
            print(
                f"error: {run} has no traces/*.pt.trace.json.gz (a run directory of a run with profile_steps > 0, "
                f"or a trace file)",
                file=sys.stderr,
            )
            rc = 2
            continue
        try:
            per = [breakdown.analyse(t) for t in traces]
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 2
            continue
        comb = breakdown.combine(per)
        print(
            f"{run}: {comb['ranks']} rank(s), {comb['steps']} profiled steps, "
            f"{comb['profiled_ms_per_step']:.2f} ms per step ({comb['timeline']} timeline)"
        )
        for c, s in sorted(comb["share"].items(), key=lambda kv: -kv[1]):
            lo, hi = comb["share_range"][c]
            print(
                f"  {c:<24} {comb['ms_per_step'][c]:9.2f} ms  {100 * s:5.1f} %  (ranks {100 * lo:.1f}-{100 * hi:.1f} %)"
            )
        print("  top operators by self time per step:")
        for o in comb["top_ops"][:10]:
            print(f"    {o['self_ms_per_step']:9.3f} ms  {o['category']:<22} {o['name']}")
    return rc


def read_back(cmd: str, run_dirs: list[Path], pending_in: Path | None) -> int:
    """nsys-summary | ncu-summary: the reports of these runs (and of every pending run) into their records."""
    from kernels.base.errors import ConfigError, exit_status
    from kernels.profiling import ncu, nsight, reports

    kind = nsight.NSYS if cmd == "nsys-summary" else ncu.NCU

    def body() -> None:
        runs = list(run_dirs) + (reports.pending(pending_in, kind) if pending_in else [])
        if not runs and not pending_in:
            raise ConfigError(f"{cmd}: give RUN_DIR(s), or --pending RUNS_DIR")
        for run in runs:
            path = reports.summarize(run, kind)
            print(f"wrote {path}")

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
