"""`make demo`: the first runs, and a scale run again while other work shared its cores.

Runs notebooks/01_train on 1 and on 2 ranks, then notebooks/02_profile on 2, with the demo's parameters (the
Makefile passes them, and one OpenMP thread per rank at every scale). A training run whose record says it was
contended (foreign work used its cores: summary.json's `contention`, kernels/profiling/monitor.py) is run again,
at most `--reruns` times, after the other scales (1, 2, then the contended ones again in that order). A quiet
re-run then measures the point and the analysis leaves the contended repeat out of it (kernels/analysis/trust.py:
superseded); a point still contended after the last try is set aside by the analysis, with the reason and the
command that re-runs it. The profiled run is not re-run: it is no scaling point, and its record says whether it
was contended.

    python -m kernels.notebook.demo [--reruns N] -p NAME VALUE ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernels.notebook import runner as notebooks
from kernels.records import schema as records
from kernels.base.files import results_home

# (notebook, ranks, extra Papermill arguments, re-run while contended)
RUNS = (("01_train", 1, (), True), ("01_train", 2, (), True), ("02_profile", 2, ("-p", "profile_wait", "5"), False))


def contention_of(runs_dir: Path, before: set[Path]) -> str | None:
    """The evidence of contention of the record a run added to runs_dir (None when quiet or unmeasured)."""
    new = sorted(set(runs_dir.iterdir()) - before) if runs_dir.is_dir() else []
    for d in new:
        path = d / "summary.json"
        summary = records.read_json(path) if path.exists() else {}
        contention = summary.get("contention") or {}
        if contention.get("contended"):
            return "; ".join(contention.get("evidence") or ["contended"])
    return None


def run_scales(scales: list[tuple[str, int, list[str]]], reruns: int, runs_dir: Path, out=sys.stdout) -> int:
    """The demo's training scales [(notebook, ranks, arguments)], each run once in order, then in rounds the
    ones whose last run was contended, in the same order (1, 2, then 1, 2 again: a load that passes touches
    every scale, not only the repeats of one), at most `reruns` rounds. The first failing runner's exit status,
    else 0."""
    todo = list(scales)
    for attempt in range(reruns + 1):
        still = []
        for notebook, gpus, args in todo:
            before = set(runs_dir.iterdir()) if runs_dir.is_dir() else set()
            rc = notebooks.run(notebooks.NOTEBOOK_DIR / f"{notebook}.ipynb", ["-p", "gpus", str(gpus), *args])
            if rc:
                return rc
            why = contention_of(runs_dir, before)
            if why is None:
                continue
            where = f"demo: {notebook} on {gpus} rank(s) shared its cores with other work ({why})"
            if attempt < reruns:
                still.append((notebook, gpus, args))
                print(
                    f"{where}; running it again after the other scales ({attempt + 1} of {reruns})",
                    file=out,
                    flush=True,
                )
            else:
                tries = f" in all {reruns + 1} tries" if reruns else ""
                print(f"{where}{tries}; the analysis sets the point aside and says why", file=out, flush=True)
        todo = still
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.notebook.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--reruns", type=int, default=1, help="times a contended training run is run again (0: never)")
    args, papermill = ap.parse_known_args(argv)
    if args.reruns < 0:
        print(f"error: --reruns {args.reruns}: give 0 or more", file=sys.stderr)
        return 2
    runs_dir = results_home() / "runs"
    for rerun in (True, False):  # the training scales with their re-runs, then the profiled run once
        scales = [(notebook, gpus, [*papermill, *extra]) for notebook, gpus, extra, again in RUNS if again == rerun]
        rc = run_scales(scales, args.reruns if rerun else 0, runs_dir)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
