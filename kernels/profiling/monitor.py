"""The resource monitor: one sampler thread per node, in every run, off the training path.

Local rank 0 of each node samples at `monitor_hz` (at most 5 Hz: NVML refreshes
utilisation every 1/6 to 1 s) and appends rows to monitor/<node>.csv, flushed each
sample, so a run that dies still leaves what was measured; at the end rank 0 merges
the nodes' files into monitor.csv (a `node` column) and summarises them.

Columns: unix time, seconds since the sampler started, node, gpu (index; empty on a
CPU-only node), GPU utilisation %, memory used MiB, power W, temperature C, SM clock
MHz (nvidia-ml-py; empty, never zero, where there is no GPU or NVML cannot say),
then the host's CPU utilisation % (all cores), memory used GiB, and network and disk
bytes since the sampler started (psutil). One row per GPU per sample; one row per
sample on a node without GPUs.
"""
from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path

MAX_HZ = 5.0
COLUMNS = ("unix_s", "t_s", "node", "gpu", "gpu_util_pct", "gpu_mem_used_mib", "gpu_power_w", "gpu_temp_c",
           "sm_clock_mhz", "cpu_util_pct", "host_mem_used_gib", "net_rx_bytes", "net_tx_bytes",
           "disk_read_bytes", "disk_write_bytes")


def _gpu_handles(visible: str | None):
    """NVML handles of the GPUs this node's ranks use (CUDA_VISIBLE_DEVICES when set), or [] without NVML."""
    try:
        import pynvml
    except ImportError:
        return None, []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU node
        return None, []
    n = pynvml.nvmlDeviceGetCount()
    idx = list(range(n))
    if visible:
        picked = []
        for tok in visible.split(","):
            tok = tok.strip()
            if tok.isdigit() and int(tok) < n:
                picked.append(int(tok))
            elif tok.startswith(("GPU-", "MIG-")):
                for i in range(n):
                    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                    if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(tok):
                        picked.append(i)
        idx = picked or idx
    return pynvml, [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in idx]


def _nvml(call, *args):
    try:
        return call(*args)
    except Exception:  # not supported on this GPU (e.g. power on some boards): empty, not zero
        return None


class Monitor(threading.Thread):
    def __init__(self, path: Path, node: str, hz: float):
        super().__init__(daemon=True, name="lab-monitor")
        if not 0 < hz <= MAX_HZ:
            raise ValueError(f"monitor_hz must be in (0, {MAX_HZ}], got {hz}")
        self.path, self.node, self.period = Path(path), node, 1.0 / hz
        self.stop_event = threading.Event()
        self.samples = 0

    def run(self) -> None:
        import psutil

        nvml, gpus = _gpu_handles(os.environ.get("CUDA_VISIBLE_DEVICES"))
        net0, disk0 = psutil.net_io_counters(), psutil.disk_io_counters()
        psutil.cpu_percent(None)  # the first call has no interval; it starts the measurement
        self.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        nxt = t0 + self.period
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            while not self.stop_event.wait(max(0.0, nxt - time.monotonic())):
                now = time.monotonic()
                # on the grid of the period; after a late wake-up (a busy machine) at least half a period to the
                # next sample: missed samples are skipped, never made up in a burst
                nxt = max(nxt + self.period, now + self.period / 2)
                net, disk = psutil.net_io_counters(), psutil.disk_io_counters()
                host = [round(psutil.cpu_percent(None), 1), round(psutil.virtual_memory().used / 2**30, 3),
                        net.bytes_recv - net0.bytes_recv if net else "", net.bytes_sent - net0.bytes_sent if net else "",
                        disk.read_bytes - disk0.read_bytes if disk and disk0 else "",
                        disk.write_bytes - disk0.write_bytes if disk and disk0 else ""]
                head = [round(time.time(), 3), round(now - t0, 3), self.node]
                if not gpus:
                    w.writerow(head + ["", "", "", "", "", ""] + host)
                for i, h in gpus:
                    util = _nvml(nvml.nvmlDeviceGetUtilizationRates, h)
                    mem = _nvml(nvml.nvmlDeviceGetMemoryInfo, h)
                    power = _nvml(nvml.nvmlDeviceGetPowerUsage, h)
                    temp = _nvml(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
                    clock = _nvml(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
                    w.writerow(head + [i, "" if util is None else util.gpu,
                                       "" if mem is None else round(mem.used / 2**20, 1),
                                       "" if power is None else round(power / 1e3, 2), "" if temp is None else temp,
                                       "" if clock is None else clock] + host)
                f.flush()
                self.samples += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def merge(run_dir: Path) -> Path | None:
    """monitor/<node>.csv of every node into monitor.csv (sorted by time); None when nothing was sampled."""
    import pandas as pd

    parts = sorted((Path(run_dir) / "monitor").glob("*.csv"))
    frames = []
    for p in parts:
        try:
            frames.append(pd.read_csv(p, keep_default_na=True))
        except (pd.errors.EmptyDataError, pd.errors.ParserError):
            continue
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    df = pd.concat(frames).sort_values(["unix_s", "node"])
    out = Path(run_dir) / "monitor.csv"
    df.to_csv(out, index=False)
    return out


def summarise(path: Path | None, window: tuple[float, float] | None = None) -> dict | None:
    """summary.json's `monitor`: samples and rate, GPU utilisation mean/p95, peak memory, energy, CPU use.

    window: (unix start, unix end) of the training loop: only those samples count (not start-up or the
    analysis after it); energy integrates each GPU's power over time (trapezoids) within it.
    """
    import pandas as pd

    if path is None or not Path(path).exists():
        return None
    df = pd.read_csv(path)
    if window is not None:
        df = df[(df["unix_s"] >= window[0]) & (df["unix_s"] <= window[1])]
    if df.empty:
        return {"samples": 0}
    host = df.drop_duplicates(["node", "unix_s"])
    span = host.groupby("node")["t_s"].agg(lambda s: s.max() - s.min())
    per_node = host.groupby("node").size()
    hz = float(((per_node - 1) / span.where(span > 0)).median()) if (span > 0).any() else None
    gpu = df.dropna(subset=["gpu_util_pct"])
    out = {"samples": int(len(host)), "nodes": int(host["node"].nunique()), "hz": _r(hz),
           "gpus": int(gpu.groupby(["node", "gpu"]).ngroups) if len(gpu) else 0,
           "gpu_util_mean_pct": _r(gpu["gpu_util_pct"].mean()) if len(gpu) else None,
           "gpu_util_p95_pct": _r(gpu["gpu_util_pct"].quantile(0.95)) if len(gpu) else None,
           "gpu_mem_peak_mib": _r(df["gpu_mem_used_mib"].max()) if df["gpu_mem_used_mib"].notna().any() else None,
           "gpu_power_mean_w": _r(df["gpu_power_w"].mean()) if df["gpu_power_w"].notna().any() else None,
           "energy_j": None,
           "cpu_util_mean_pct": _r(host["cpu_util_pct"].mean()), "cpu_util_p95_pct": _r(host["cpu_util_pct"].quantile(0.95)),
           "host_mem_peak_gib": _r(host["host_mem_used_gib"].max()),
           "net_bytes": _sum_last(host, ("net_rx_bytes", "net_tx_bytes")),
           "disk_bytes": _sum_last(host, ("disk_read_bytes", "disk_write_bytes"))}
    pw = df.dropna(subset=["gpu_power_w"])
    if len(pw):
        energy = 0.0
        for _, g in pw.groupby(["node", "gpu"]):
            g = g.sort_values("unix_s")
            t, p = g["unix_s"].to_numpy(), g["gpu_power_w"].to_numpy()
            energy += float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1])).sum())
        out["energy_j"] = _r(energy)
    return out


def _sum_last(host, cols) -> int | None:
    """Bytes moved over the window, summed over nodes (the counters count from each sampler's start)."""
    total = 0
    for _, g in host.groupby("node"):
        g = g.sort_values("unix_s")
        for c in cols:
            v = g[c].dropna()
            if len(v) < 2:
                return None
            total += int(v.iloc[-1] - v.iloc[0])
    return total


def _r(v, nd: int = 3):
    try:
        import math

        return None if v is None or math.isnan(float(v)) else round(float(v), nd)
    except (TypeError, ValueError):
        return None
