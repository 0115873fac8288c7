"""What a run pays for going through its notebook: `make bench` or `python benchmarks/bench_notebook.py`.

The same short run (ResNet-18 at width 16 on the embedded digits, 2 ranks, 1 epoch) is started both ways in
alternation, `lab train` (the CLI) and `lab run notebooks/01_train.ipynb` (Papermill, the executed notebook and its
HTML kept), each in a fresh results folder; wall time is measured from process start to exit. The table gives each
pair, the medians and the overhead as the median of the paired differences, and splits the notebook's time into
its phases from Papermill's own per-cell timestamps and the runner's printed milestones: runner start and
parameter check, kernel start, each cell, and the executed notebook's filing and HTML.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels.base import sysinfo  # noqa: E402

RUN = {
    "dataset": "digits",
    "gpus": 2,
    "epochs": 1,
    "batch": 64,
    "width": 16,
    "precision": "fp32",
    "lr": 0.05,
    "comm_probe_steps": 0,
}
# a code cell of 01_train by what its source holds
CELL_NAMES = (
    ("_names_before_parameters = set", "names before the parameters"),
    ("resolve_notebook_parameters(globals()", "resolve: imports, parameter check"),
    ("launch_from_notebook(cfg)", "launch: the ranks"),
    ("read_run(run_dir)", "the run record's tables"),
    ("table(metrics)", "metrics table"),
    ("plt.subplots", "plots"),
)


def cell_name(cell: dict) -> str:
    tags = cell["metadata"].get("tags") or []
    if "injected-parameters" in tags or "parameters" in tags:
        return "injected parameters" if "injected-parameters" in tags else "parameters"
    src = "".join(cell["source"])
    return next((name for key, name in CELL_NAMES if key in src), src.strip().splitlines()[0][:40])


TREE = ROOT  # the checkout whose lab is timed (--tree: another commit's, for a before/after)


def timed(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(start, wall seconds, stdout) of one command; raises with its last lines when it fails."""
    t0 = time.time()
    p = subprocess.run(cmd, cwd=TREE, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({p.returncode}):\n" + "\n".join((p.stdout + p.stderr).splitlines()[-15:])
        )
    return t0, wall, p.stdout


def cli(env: dict) -> float:
    cmd = [sys.executable, "-m", "kernels.cli", "train"]
    for k, v in RUN.items():
        cmd += [f"--{k}", str(v)]
    return timed(cmd, env)[1]


def notebook(env: dict, results: Path) -> tuple[float, dict[str, float]]:
    """Wall time of `lab run` and its phases (seconds)."""
    cmd = [sys.executable, "-m", "kernels.cli", "run", "notebooks/01_train.ipynb"]
    for k, v in RUN.items():
        cmd += ["-p", k, str(v)]
    t0, wall, _ = timed(cmd, env)
    (executed,) = list((results / "runs").glob("*/01_train-*.ipynb"))
    nb = json.loads(executed.read_text())
    stamp = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()  # noqa: E731
    meta = nb["metadata"]["papermill"]
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    starts = [stamp(c["metadata"]["papermill"]["start_time"]) for c in cells]
    ends = [stamp(c["metadata"]["papermill"]["end_time"]) for c in cells]
    phases = {
        "runner start, parameter check, Papermill start": stamp(meta["start_time"]) - t0,
        "kernel start": starts[0] - stamp(meta["start_time"]),
    }
    for c, s, e in zip(cells, starts, ends):
        phases[f"cell: {cell_name(c)}"] = e - s
    phases["after the last cell: kernel stop, filing, HTML"] = t0 + wall - ends[-1]
    return wall, phases


def _commit(tree: Path) -> str:
    p = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="pairs (default 5: the ranks' own time varies from run to run by as much as the overhead)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    args = ap.parse_args()
    global TREE
    TREE = args.tree.resolve()
    rows, phases = [], []
    for i in range(args.repeats):
        pair = {}
        for side in ("cli", "notebook") if i % 2 == 0 else ("notebook", "cli"):  # alternate who goes first
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "LAB_RESULTS": tmp, "PYTHONUNBUFFERED": "1"}
                if side == "cli":
                    pair["cli"] = cli(env)
                else:
                    pair["notebook"], ph = notebook(env, Path(tmp))
                    phases.append(ph)
            print(f"pair {i + 1}: {side} {pair[side]:.2f} s", flush=True)
        rows.append(pair)
    over = [r["notebook"] - r["cli"] for r in rows]
    lines = benchtable.header("A run through its notebook against the CLI")
    if TREE != ROOT:
        lines += [f"Timed checkout: {TREE} (git {_commit(TREE)}).", ""]
    lines += [
        "`lab train` and `lab run notebooks/01_train.ipynb` with "
        f"{' '.join(f'{k}={v}' for k, v in RUN.items())}, "
        f"alternating, {args.repeats} pairs; wall seconds from start to exit.",
        "",
        "| pair | CLI (s) | notebook (s) | overhead (s) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {i + 1} | {r['cli']:.2f} | {r['notebook']:.2f} | {o:.2f} |" for i, (r, o) in enumerate(zip(rows, over))
    ]
    lines += [
        f"| median | {statistics.median(r['cli'] for r in rows):.2f} | "
        f"{statistics.median(r['notebook'] for r in rows):.2f} | **{statistics.median(over):.2f}** "
        f"({min(over):.2f}-{max(over):.2f}) |",
        "",
        "Where the notebook's time goes (median over the notebook runs; Papermill's per-cell timestamps):",
        "",
        "| phase | s |",
        "|---|---|",
    ]
    lines += [f"| {k} | {statistics.median(p[k] for p in phases):.2f} |" for k in phases[0]]
    dev = sysinfo.cpu_device_name()
    path = benchtable.write(lines, args.out, dev, prefix="notebook-")
    benchtable.headline(
        args.out,
        "notebook",
        dev,
        path,
        {
            "overhead_s": statistics.median(over),
            "overhead_min_s": min(over),
            "overhead_max_s": max(over),
            "cli_s": statistics.median(r["cli"] for r in rows),
            "pairs": args.repeats,
        },
    )


if __name__ == "__main__":
    main()
