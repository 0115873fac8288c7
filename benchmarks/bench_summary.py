"""Every speed target beside what this machine measured: the last step of `make bench`.

`python benchmarks/bench_summary.py` reads the headline figures that the benchmarks stored in
results/bench/headlines-<cpu>.json (benchtable.headline) and prints one table: the measure, its
target, the figure with its spread, met or missed, and the table it comes from. A benchmark not
yet run on this machine is named with the command that measures it. The figures are one run's
only when they share a git commit; otherwise the page says which commits they come from. The
page goes to results/bench/summary-<cpu>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels.base import sysinfo  # noqa: E402

NOTEBOOK_MAX_S = 3.0
COLD_STREAM_MIN_PCT = 80.0
SEED_FLOOR, SEED_GOAL = 1.0, 1.15
# DCRNN lab / public on a CPU: the 3x target is retired. In a profile of one lab step the dense products, which
# both pipelines compute, took 3.8 s of the 5.2 s that 3x would allow, at MKL's rate for those shapes (README.md
# at 663560d, the DCRNN benchmark). On a GPU, issue 50's target is 5x (make bench-gpu).
DCRNN_CPU_BOUND = "- (3x retired on a CPU: the dense products alone take 3.8 s of the 5.2 s it allows)"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def notebook_rows(h: dict) -> list[tuple]:
    return [
        (
            "notebook run over the CLI, extra wall s (median of paired runs)",
            f"<= {NOTEBOOK_MAX_S:g} s",
            f"{h['overhead_s']:.2f} s ({h['overhead_min_s']:.2f}-{h['overhead_max_s']:.2f}; CLI {h['cli_s']:.2f} s)",
            _verdict(h["overhead_s"] <= NOTEBOOK_MAX_S),
        )
    ]


def io_rows(h: dict) -> list[tuple]:
    rows = []
    for cache in ("cold", "warm"):
        f = h[cache]
        for kind in ("records", "normalised"):
            target = f">= {COLD_STREAM_MIN_PCT:g} %" if cache == "cold" else "none (page cache)"
            verdict = _verdict(f[f"{kind}_pct"] >= COLD_STREAM_MIN_PCT) if cache == "cold" else "-"
            rows.append(
                (
                    f"streamed {kind} / sequential read, {cache}",
                    target,
                    f"{f[f'{kind}_pct']:.0f} % ({f[f'{kind}_mb_s']:,.0f} of {f['sequential_mb_s']:,.0f} MB/s)",
                    verdict,
                )
            )
    return rows


def seed_rows(h: dict) -> list[tuple]:
    rows = []
    for key in sorted(k for k in h if k.startswith("ranks_")):
        f = h[key]
        verdict = (
            "**missed**"
            if f["ratio"] < SEED_FLOOR
            else "floor met, **goal missed**"
            if f["ratio"] < SEED_GOAL
            else "met"
        )
        rows.append(
            (
                f"lab / seed-style loop, {key[6:]} rank(s) (median of {f['repeats']} paired repeats)",
                f">= {SEED_FLOOR:.2f}x (goal {SEED_GOAL:.2f}x)",
                f"{f['ratio']:.2f}x ({f['min']:.2f}-{f['max']:.2f})",
                verdict,
            )
        )
    return rows


def dcrnn_rows(h: dict) -> list[tuple]:
    return [
        (
            f"DCRNN lab / public pipeline per step (median of {h['steps']} steps)",
            DCRNN_CPU_BOUND,
            f"{h['speedup']:.2f}x",
            "-",
        )
    ]


def comm_rows(h: dict) -> list[tuple]:
    return [
        (
            f"MPI all-reduce, lab / C loop at {r['bytes']:,} B",
            "-" if r["target"] is None else f"<= {r['target']:.2f}x",
            f"{r['lab_over_c']:.2f}x",
            "-" if r["target"] is None else _verdict(r["lab_over_c"] <= r["target"]),
        )
        for r in h["rows"]
    ]


SECTIONS = (
    ("notebook", "bench_notebook.py", notebook_rows),
    ("io", "bench_io.py", io_rows),
    ("seed", "bench_seed.py", seed_rows),
    ("dcrnn", "bench_dcrnn.py", dcrnn_rows),
    ("comm", "bench_comm.py", comm_rows),
)


def page(data: dict) -> list[str]:
    lines = benchtable.header(f"Speed targets on this machine ({sysinfo.cpu_name()})")
    lines += ["| measure | target | this machine | verdict | device, table |", "|---|---|---|---|---|"]
    missing = []
    for key, script, rows in SECTIONS:
        if key not in data:
            missing.append(f"`python benchmarks/{script}`")
            continue
        h = data[key]
        for measure, target, figure, verdict in rows(h):
            lines.append(f"| {measure} | {target} | {figure} | {verdict} | {h['device']}, {h['table']} |")
    commits = sorted({(h["git"] or "n/a") for h in data.values()})
    lines.append("")
    if missing:
        lines.append("Not measured on this machine yet: " + ", ".join(missing) + ".")
    if len(commits) == 1:
        lines.append(f"All figures come from one commit, {commits[0]}.")
    elif commits:
        lines.append(
            f"These figures come from {len(commits)} commits ({', '.join(c[:7] for c in commits)}), not one "
            "run: `make bench` measures them all at one commit."
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    path = benchtable.headlines_path(args.out)
    if not path.exists():
        raise SystemExit(
            f"error: no headline figures at {path}: run `make bench` (or one of benchmarks/bench_*.py) "
            "on this machine first"
        )
    data = json.loads(path.read_text())
    benchtable.write(page(data), args.out, sysinfo.cpu_device_name(), prefix="summary-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
