"""python -m kernels.profiling wrapper nsys|ncu [--print]   the rank prefix of an Nsight wrapper
python -m kernels.profiling breakdown RUN_DIR [...]          (re)compute a run's breakdown from its traces"""

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
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
