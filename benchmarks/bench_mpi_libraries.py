"""Open MPI against MPICH on the same machine, side by side: `python benchmarks/bench_mpi_libraries.py`.

Each round runs `lab comm bench --backend mpi` once with each library (`--mpi_library openmpi`, then
`mpich`, the order alternating from round to round), on the same ranks, collectives, sizes and call counts;
both time their calls in the lab's C loop, built with each library's own compiler wrapper. A round's ratio is
MPICH's time over Open MPI's in that round, so the two runs of a ratio are minutes apart at most; the table
gives each library's median time over the rounds (min-max) and the median of the rounds' ratios (min-max).
Writes results/bench/comm-mpi-libraries-<device>.md and .json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels.base import sysinfo  # noqa: E402

LIBRARIES = ("openmpi", "mpich")


def run(library: str, args) -> dict:
    """{(op, bytes): us per call} of one run, and the library's own version line."""
    rec = benchtable.commbench(
        {
            "backend": "mpi",
            "mpi_library": library,
            "gpus": args.ranks,
            "ops": args.ops,
            "min_bytes": 8,
            "max_bytes": args.max_bytes,
            "factor": args.factor,
            "iters": args.iters,
            "repeats": 3,
            "launcher": "mpirun",
        }
    )
    times = {}  # out of place where the call has the form, else in place (MPI_Bcast, MPI_Reduce's root...)
    for r in rec["rows"]:
        form = "out" if r["time_us_out"] not in (None, "") else "in"
        if r[f"time_us_{form}"] not in (None, ""):
            times[(r["op"] + ("" if form == "out" else " (in place)"), int(r["size_bytes"]))] = float(
                r[f"time_us_{form}"]
            )
    return {
        "times": times,
        "version": rec["config"]["versions"].get("mpi_library", "?"),
        "timed_by": rec["summary"].get("timed_by", ""),
    }


def measure(args) -> tuple[dict, dict]:
    """({library: [times of each round]}, {library: (version, timed_by)})."""
    runs = {lib: [] for lib in LIBRARIES}
    about = {}
    for r in range(args.rounds):
        order = LIBRARIES if r % 2 == 0 else LIBRARIES[::-1]
        for lib in order:
            out = run(lib, args)
            runs[lib].append(out["times"])
            about[lib] = (out["version"], out["timed_by"])
        print(f"  round {r + 1}/{args.rounds} done ({' then '.join(order)})", flush=True)
    return runs, about


def table(args, runs: dict, about: dict) -> tuple[list[str], dict]:
    dev = sysinfo.cpu_device_name()
    lines = benchtable.header(f"MPI libraries: Open MPI against MPICH ({dev})")
    lines += [
        f"{args.ranks} ranks on this host; float32, out of place where the call has the form; {args.rounds} "
        f"rounds, each one run of `lab comm bench --backend mpi` per library, the order alternating. Libraries: "
        + "; ".join(f"{lib}: {about[lib][0]}, timed by {about[lib][1]}" for lib in LIBRARIES)
        + f". Each size: {args.iters} calls per loop, the median of 3 loops. Times: median over rounds (min-max); "
        "MPICH / Open MPI: median of the rounds' ratios (min-max).",
        "",
        "| collective | size (B) | Open MPI us | MPICH us | MPICH / Open MPI |",
        "|---|---:|---:|---:|---:|",
    ]
    record = {"device": dev, "ranks": args.ranks, "rounds": args.rounds, "libraries": about, "rows": []}
    keys = sorted(set.intersection(*(set(t) for lib in LIBRARIES for t in runs[lib])))
    for op, size in keys:
        o = [t[(op, size)] for t in runs["openmpi"]]
        m = [t[(op, size)] for t in runs["mpich"]]
        ratios = [b / a for a, b in zip(o, m)]

        def cell(v, fmt=".3f"):
            return f"{statistics.median(v):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"

        lines.append(f"| {op} | {size:,} | {cell(o)} | {cell(m)} | {cell(ratios, '.2f')} |")
        record["rows"].append({"op": op, "bytes": size, "openmpi_us": o, "mpich_us": m, "mpich_over_openmpi": ratios})
    return lines, record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", default="all_reduce,broadcast,all_gather")
    p.add_argument("--max_bytes", default="1M")
    p.add_argument("--factor", type=int, default=16, help="size step (8 B, 128 B, 2 KiB, 32 KiB, 512 KiB by 16)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=200, help="calls per timed loop; each size reports the median of 3")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = p.parse_args(argv)
    missing = [lib for lib in LIBRARIES if not shutil.which(f"mpirun.{lib}")]
    if missing:
        print(f"bench_mpi_libraries: not measured: no mpirun.{missing[0]} (Debian: apt-get install openmpi-bin mpich)")
        return 0
    runs, about = measure(args)
    lines, record = table(args, runs, about)
    benchtable.write(lines, args.out, record["device"], prefix="comm-mpi-libraries-", record=record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
