"""The resource monitor's files read back: the nodes' CSVs merged into monitor.csv, and summary.json's `monitor`.

Plain csv and numpy, no pandas: rank 0 does this at the end of every run, where importing pandas alone took 0.35 s
of CPU on the project's 2-core VM. Columns are kernels.profiling.monitor.COLUMNS; an empty cell is a value the
sampler could not read (NaN here), never zero.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from kernels.base.files import atomic_write_bytes

TEXT = ("node",)  # every other column is a number


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of one CSV; a row cut short by a run that died mid-write is padded, a longer one dropped."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    if not lines:
        return [], []
    head = lines[0]
    rows = [r + [""] * (len(head) - len(r)) for r in lines[1:] if r and len(r) <= len(head)]
    return head, rows


def merge(run_dir: Path) -> Path | None:
    """monitor/<node>.csv of every node into monitor.csv (sorted by time, then node); None when nothing was
    sampled. Rows keep the text the samplers wrote."""
    head, rows = [], []
    for p in sorted((Path(run_dir) / "monitor").glob("*.csv")):
        h, r = _rows(p)
        if not r:
            continue
        if head and h != head:  # another version's columns: the first file's order, the others' cells by name
            r = [[dict(zip(h, row)).get(c, "") for c in head] for row in r]
        head = head or h
        rows += r
    if not rows:
        return None
    t, node = head.index("unix_s"), head.index("node")
    rows.sort(key=lambda r: (*_time_key(r[t]), r[node]))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([head, *rows])
    out = Path(run_dir) / "monitor.csv"
    atomic_write_bytes(out, buf.getvalue().encode(), "results_dir")  # whole or not at all, and no space kept on failure
    return out


def _time_key(text: str) -> tuple[bool, float]:
    """Sorts by time, a row without one last."""
    x = _float(text)
    return (True, 0.0) if math.isnan(x) else (False, x)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


class Samples:
    """The rows of a monitor.csv as columns: numbers as float arrays (NaN where empty), `node` as strings."""

    def __init__(self, cols: dict, n: int):
        self.cols, self.n = cols, n

    @classmethod
    def parse(cls, head: list[str], rows: list[list[str]]) -> "Samples":
        return cls(
            {
                c: [r[i] for r in rows] if c in TEXT else np.array([_float(r[i]) for r in rows], dtype=float)
                for i, c in enumerate(head)
            },
            len(rows),
        )

    def __contains__(self, col: str) -> bool:
        return col in self.cols

    def __getitem__(self, col: str):
        return self.cols[col]

    def take(self, keep) -> "Samples":
        """The rows where the boolean array `keep` is true."""
        return Samples(
            {c: [v for v, k in zip(a, keep) if k] if c in TEXT else a[keep] for c, a in self.cols.items()},
            int(np.count_nonzero(keep)),
        )

    def first_per(self, *keys: str) -> "Samples":
        """The first row of each distinct value of `keys` (a GPU node writes one row per GPU per sample)."""
        seen, keep = set(), np.zeros(self.n, dtype=bool)
        for i, k in enumerate(zip(*(self[c] for c in keys))):
            if k not in seen:
                seen.add(k)
                keep[i] = True
        return self.take(keep)

    def groups(self, *keys: str) -> dict[tuple, np.ndarray]:
        """Row indices per distinct value of `keys`, in the order of first appearance."""
        out: dict[tuple, list[int]] = {}
        for i, k in enumerate(zip(*(self[c] for c in keys))):
            out.setdefault(k, []).append(i)
        return {k: np.array(v) for k, v in out.items()}


def read(path: Path) -> Samples:
    return Samples.parse(*_rows(Path(path)))


def summarise(path: Path | None, window: tuple[float, float] | None = None) -> dict | None:
    """summary.json's `monitor`: samples and rate, GPU utilisation mean/p95, peak memory, energy, CPU use.

    window: (unix start, unix end) of the training loop: only those samples count (not start-up or the
    analysis after it); energy integrates each GPU's power over time (trapezoids) within it.
    """
    if path is None or not Path(path).exists():
        return None
    df = read(path)
    if window is not None and df.n:
        df = df.take((df["unix_s"] >= window[0]) & (df["unix_s"] <= window[1]))
    if not df.n:
        return {"samples": 0}
    host = df.first_per("node", "unix_s")
    gpu = df.take(~np.isnan(df["gpu_util_pct"]))
    return {
        "samples": host.n,
        "nodes": len(set(host["node"])),
        "hz": _r(_rate(host)),
        "gpus": len(gpu.groups("node", "gpu")),
        "gpu_util_mean_pct": _r(_mean(gpu["gpu_util_pct"])),
        "gpu_util_p95_pct": _r(_quantile(gpu["gpu_util_pct"], 95)),
        "gpu_mem_peak_mib": _r(_max(df["gpu_mem_used_mib"])),
        "gpu_power_mean_w": _r(_mean(df["gpu_power_w"])),
        "energy_j": _energy(df),
        "cpu_util_mean_pct": _r(_mean(host["cpu_util_pct"])),
        "cpu_util_p95_pct": _r(_quantile(host["cpu_util_pct"], 95)),
        "host_mem_peak_gib": _r(_max(host["host_mem_used_gib"])),
        "net_bytes": _sum_last(host, ("net_rx_bytes", "net_tx_bytes")),
        "disk_bytes": _sum_last(host, ("disk_read_bytes", "disk_write_bytes")),
        **_shares(host, gpu),
    }


def _rate(host: Samples) -> float | None:
    """Samples per second on each node (rows - 1 over its time span), the median over the nodes with a span."""
    rates = []
    for idx in host.groups("node").values():
        t = host["t_s"][idx]
        span = np.nanmax(t) - np.nanmin(t) if not np.isnan(t).all() else math.nan
        if span > 0:
            rates.append((len(idx) - 1) / span)
    return float(np.median(rates)) if rates else None


def _present(a: np.ndarray) -> np.ndarray:
    return a[~np.isnan(a)]


def _mean(a: np.ndarray) -> float | None:
    a = _present(a)
    return math.fsum(a) / len(a) if len(a) else None  # exact sums, as pandas (Kahan) nearly has them


def _max(a: np.ndarray) -> float | None:
    a = _present(a)
    return float(a.max()) if len(a) else None


def _quantile(a: np.ndarray, q: float) -> float | None:
    a = _present(a)
    return float(np.percentile(a, q)) if len(a) else None


def _energy(df: Samples) -> float | None:
    """Joules: each GPU's power integrated over its samples' times (trapezoids), summed; None without power."""
    pw = df.take(~np.isnan(df["gpu_power_w"]))
    if not pw.n:
        return None
    energy = 0.0
    for idx in pw.groups("node", "gpu").values():
        order = idx[np.argsort(pw["unix_s"][idx], kind="stable")]
        t, p = pw["unix_s"][order], pw["gpu_power_w"][order]
        energy += float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1])).sum())
    return _r(energy)


def _shares(host: Samples, gpu: Samples) -> dict:
    """The busiest node's mean foreign CPU use and this run's own (cores), and the most foreign GPU processes."""
    out = {
        "own_cpu_cores_mean": None,
        "foreign_cpu_cores_mean": None,
        "foreign_cpu_node": None,
        "gpu_foreign_procs_max": None,
    }
    if "foreign_cpu_cores" in host and len(_present(host["foreign_cpu_cores"])):
        means = {
            k[0]: (_mean(host["own_cpu_cores"][i]), _mean(host["foreign_cpu_cores"][i]))
            for k, i in host.groups("node").items()
        }
        node = max((n for n in sorted(means) if means[n][1] is not None), key=lambda n: means[n][1])  # a tie: first
        out.update(
            own_cpu_cores_mean=_r(means[node][0]), foreign_cpu_cores_mean=_r(means[node][1]), foreign_cpu_node=str(node)
        )
    if "gpu_foreign_procs" in gpu and len(_present(gpu["gpu_foreign_procs"])):
        out["gpu_foreign_procs_max"] = int(_max(gpu["gpu_foreign_procs"]))
    return out


def _sum_last(host: Samples, cols) -> int | None:
    """Bytes moved over the window, summed over nodes (the counters count from each sampler's start)."""
    total = 0
    for idx in host.groups("node").values():
        order = idx[np.argsort(host["unix_s"][idx], kind="stable")]
        for c in cols:
            v = _present(host[c][order])
            if len(v) < 2:
                return None
            total += int(v[-1] - v[0])
    return total


def _r(v, nd: int = 3):
    try:
        return None if v is None or math.isnan(float(v)) else round(float(v), nd)
    except (TypeError, ValueError):
        return None
