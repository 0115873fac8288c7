"""Slurm accounting in the run record: what `sacct` says about the job that ran it.

In a Slurm job (slurm/papermill_run.sbatch), the notebook runner (kernels/notebook/runner.py) stores it when the
notebook has ended: it asks `sacct` for the job and its steps (state, elapsed time, nodes, tasks, the steps' peak
resident memory, the energy the cluster measured) and writes `sacct.json` into the record the notebook produced.
The job itself is still running then (its batch step is the script), so the job's row says RUNNING; the steps
(the ranks' sruns) are finished and carry their final figures. A requeued or resubmitted run keeps one entry per
job id. After the job, the final view can replace it:

    python -m kernels.slurm.accounting store JOB_ID [RECORD_DIR ...]

(without directories: every record under results/runs/ and results/comm/ whose config.json names the job).

A cluster without accounting storage (sacct answers "accounting storage is disabled") or without sacct gets
an entry that says so, `available: false` with sacct's own words: it is noted, never an error. Values a cluster
does not gather (MaxRSS without jobacct_gather, energy without acct_gather_energy) are empty, not zero.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from kernels.base.files import RecordError, results_home
from kernels.records.schema import read_json, write_json

FILE = "sacct.json"
# sacct --format fields, in order; ConsumedEnergyRaw is joules, ElapsedRaw seconds
FIELDS = (
    "JobID",
    "JobName",
    "State",
    "ExitCode",
    "Start",
    "End",
    "ElapsedRaw",
    "NNodes",
    "NTasks",
    "AllocCPUS",
    "MaxRSS",
    "MaxRSSNode",
    "ConsumedEnergyRaw",
)
UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _bytes(text: str) -> int | None:
    """sacct's memory figure ('123456K', '1.5G', '0', '') in bytes; empty when not gathered."""
    text = text.strip()
    if not text:
        return None
    scale = UNITS.get(text[-1].upper(), 1)
    number = text[:-1] if text[-1].upper() in UNITS else text
    return int(round(float(number) * scale))


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse(out: str) -> list[dict]:
    """Rows of `sacct --parsable2 --noheader --format=<FIELDS>` output."""
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(FIELDS):
            raise ValueError(f"sacct printed {len(values)} fields, expected {len(FIELDS)}: {line!r}")
        v = dict(zip(FIELDS, values))
        rows.append(
            {
                "job_id": v["JobID"],
                "name": v["JobName"],
                "state": v["State"],
                "exit_code": v["ExitCode"],
                "start": v["Start"],
                "end": v["End"],
                "elapsed_s": _int(v["ElapsedRaw"]),
                "nodes": _int(v["NNodes"]),
                "tasks": _int(v["NTasks"]),
                "cpus": _int(v["AllocCPUS"]),
                "max_rss_bytes": _bytes(v["MaxRSS"]),
                "max_rss_node": v["MaxRSSNode"] or None,
                "energy_j": _int(v["ConsumedEnergyRaw"]),
            }
        )
    return rows


def _sacct(cmd: list[str]) -> tuple[list[dict] | None, str]:
    """(rows, "") from one sacct command, or (None, why not)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "sacct did not answer within 60 s"
    if p.returncode != 0:
        said = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return None, f"sacct exited {p.returncode}: {said[0] if said else 'no message'}"
    try:
        rows = parse(p.stdout)
    except ValueError as e:
        return None, str(e)
    return (rows, "") if rows else (None, f"sacct knows no job {cmd[cmd.index('-j') + 1]}")


def query(job: str) -> dict:
    """What sacct says about `job`: {available, source, command, rows} or {available: false, note}.

    The accounting database first (jobs and steps); on a cluster without one, the job-completion log (`sacct -c`:
    jobs only, and only once they have ended)."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if not shutil.which("sacct"):
        return {"job": job, "queried_utc": now, "available": False, "note": "sacct is not installed on this host"}
    fields = ["-j", job, "--parsable2", "--noheader", "--format=" + ",".join(FIELDS)]
    notes = []
    for source, cmd in (("accounting database", ["sacct", *fields]), ("job completion log", ["sacct", "-c", *fields])):
        rows, why = _sacct(cmd)
        if rows:
            return {
                "job": job,
                "queried_utc": now,
                "available": True,
                "source": source,
                "command": " ".join(cmd),
                "rows": rows,
            }
        notes.append(f"{source}: {why}")
    return {"job": job, "queried_utc": now, "available": False, "note": "; ".join(notes)}


def records_of(job: str, results: Path) -> list[Path]:
    """The record directories (runs/ and comm/) whose config.json names Slurm job `job`."""
    out = []
    for config in sorted([*results.glob("runs/*/config.json"), *results.glob("comm/*/config.json")]):
        try:
            slurm = read_json(config).get("slurm") or {}
        except (RecordError, OSError):
            continue  # a damaged neighbour is the analysis' to report, not the job's to fail on
        if str(slurm.get("slurm_job_id")) == str(job):
            out.append(config.parent)
    return out


def store(job: str, dirs: list[Path]) -> dict:
    """Write `job`'s accounting into sacct.json of each record directory; returns the entry."""
    entry = query(job)
    for d in dirs:
        path = d / FILE
        try:
            jobs = read_json(path).get("jobs", {}) if path.exists() else {}
        except RecordError:
            jobs = {}  # a damaged accounting file is rewritten from sacct rather than kept
        write_json(path, {"jobs": {**jobs, str(job): entry}})
    return entry


def describe(entry: dict) -> str:
    """One line for the job log."""
    if not entry.get("available"):
        return f"not available ({entry.get('note')}); noted in the record"
    rows = entry["rows"]
    job = rows[0]
    rss = [r["max_rss_bytes"] for r in rows if r["max_rss_bytes"] is not None]
    energy = [r["energy_j"] for r in rows if r["energy_j"] is not None]
    return "; ".join(
        [
            f"job {job['job_id']} {job['state']}, elapsed {job['elapsed_s']} s on {job['nodes']} node(s), "
            f"{len(rows) - 1} step(s)",
            f"max RSS {max(rss) / 2**30:.2f} GiB" if rss else "max RSS not gathered by this cluster",
            f"energy {sum(energy)} J" if energy else "energy not measured by this cluster",
        ]
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.slurm.accounting", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("store", help="store sacct's view of JOB in the records that job wrote")
    s.add_argument("job", help="the Slurm job id (SLURM_JOB_ID)")
    s.add_argument(
        "dirs", nargs="*", type=Path, help="record directories (default: those under --results that name the job)"
    )
    s.add_argument("--results", type=Path, default=None, help="results folder (default: $LAB_RESULTS or results/)")
    args = ap.parse_args(argv)
    results = args.results or results_home()
    dirs = args.dirs or records_of(args.job, results)
    missing = [d for d in dirs if not (d / "config.json").is_file()]
    if missing:
        print(f"error: {missing[0]} is not a record directory (no config.json)", file=sys.stderr)
        return 2
    if not dirs:
        print(f"sacct: job {args.job} wrote no record under {results}; nothing stored")
        return 0
    print(f"sacct: {describe(store(args.job, dirs))} -> {FILE} in {', '.join(map(str, dirs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
