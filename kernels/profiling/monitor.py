"""The resource monitor: one sampler thread per node, in every run, off the training path.

Local rank 0 of each node samples at `monitor_hz` (at most 5 Hz: NVML refreshes
utilisation every 1/6 to 1 s) and appends rows to monitor/<node>.csv, flushed each
sample, so a run that dies still leaves what was measured; at the end rank 0 merges
the nodes' files into monitor.csv (a `node` column) and summarises them.

Columns: unix time, seconds since the sampler started, node, gpu (index; empty on a
CPU-only node), GPU utilisation %, memory used MiB, power W, temperature C, SM clock
MHz (nvidia-ml-py; empty, never zero, where there is no GPU or NVML cannot say),
compute processes on that GPU that are not ranks of this run, then the host's CPU
utilisation % (all cores), memory used GiB, network and disk bytes since the sampler
started (psutil), and the cores' worth of CPU time per second this run's processes
used (its ranks on this host, their children such as loader workers, and their
launchers) and everything else on the host used (foreign work). One row per GPU per
sample; one row per sample on a node without GPUs. kernels/profiling/monitor_csv.py
merges and summarises the files.

Contention (`contention`): a run shared its cores or GPUs with foreign work when, over
the training window, foreign processes used at least FOREIGN_MIN_CORES cores of the
cores this run's ranks may run on (their affinity) while those were near full (this
run's use plus the foreign use at least BUSY_SHARE of them), when a GPU of the run had
compute processes that are not its ranks, or when the allocation put more compute
threads on a host than the ranks there may run on.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path

from kernels.base import files
from kernels.base.sysinfo import cpu_set

MAX_HZ = 5.0
COLUMNS = (
    "unix_s",
    "t_s",
    "node",
    "gpu",
    "gpu_util_pct",
    "gpu_mem_used_mib",
    "gpu_power_w",
    "gpu_temp_c",
    "sm_clock_mhz",
    "gpu_foreign_procs",
    "cpu_util_pct",
    "host_mem_used_gib",
    "net_rx_bytes",
    "net_tx_bytes",
    "disk_read_bytes",
    "disk_write_bytes",
    "own_cpu_cores",
    "foreign_cpu_cores",
)
FOREIGN_MIN_CORES = 0.25  # foreign CPU use below this is the operating system's own noise
BUSY_SHARE = 0.75  # ... and it takes cores from the run only on a host this full


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


class CpuShare:
    """Cores' worth of CPU time per second since the last call: all processes' on the watched cores (the ranks'
    affinity, else the host's), and this run's processes' (the given rank pids, their descendants and their
    parents, the launchers)."""

    def __init__(self, pids: list[int], cpus: set[int] | None = None):
        import psutil

        self.psutil = psutil
        self.ranks = [p for p in (self._proc(pid) for pid in pids) if p is not None]
        self.cpus = sorted(cpus) if cpus else None  # only these cores count (the ranks' affinity), else all
        self.seen: dict[int, float] = {}
        self.t, self.busy = time.monotonic(), self._busy()
        self.own()

    def _proc(self, pid: int):
        try:
            return self.psutil.Process(pid)
        except self.psutil.Error:
            return None

    def _busy(self) -> float:
        per = self.psutil.cpu_times(percpu=True)
        cores = [per[i] for i in self.cpus if i < len(per)] if self.cpus else per
        return sum(getattr(c, k, 0.0) for c in cores for k in ("user", "nice", "system", "irq", "softirq"))

    def own(self) -> set[int]:
        """This run's process ids now; updates the CPU seconds seen per process."""
        procs = {}
        for r in self.ranks:
            try:
                for p in [r, *r.children(recursive=True), r.parent()]:
                    if p is not None:
                        procs[p.pid] = p
            except self.psutil.Error:
                continue
        self.delta = 0.0
        for pid, p in procs.items():
            try:
                c = p.cpu_times()
            except self.psutil.Error:
                continue
            total = c.user + c.system
            self.delta += total - self.seen.get(pid, 0.0)  # a process new since the last call: all of it
            self.seen[pid] = total
        return set(procs)

    def sample(self) -> tuple[set[int], float, float]:
        """(own pids, own cores, foreign cores) since the last sample."""
        now, busy = time.monotonic(), self._busy()
        own_pids = self.own()
        dt = max(now - self.t, 1e-3)
        own, host = max(0.0, self.delta) / dt, max(0.0, busy - self.busy) / dt
        self.t, self.busy = now, busy
        return own_pids, own, max(0.0, host - own)


def _foreign_gpu_procs(nvml, handle, own: set[int]):
    """Compute processes on a GPU that are not this run's. Inside a container NVML may report the host's pids,
    none of which match: then one process is taken to be the rank that uses this GPU."""
    procs = _nvml(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if procs is None:
        return None
    pids = {p.pid for p in procs}
    mine = len(pids & own) or min(1, len(pids))
    return len(pids) - mine


class Monitor(threading.Thread):
    def __init__(self, path: Path, node: str, hz: float, pids: list[int] | None = None, cpus: set[int] | None = None):
        super().__init__(daemon=True, name="lab-monitor")
        if not 0 < hz <= MAX_HZ:
            raise ValueError(f"monitor_hz must be in (0, {MAX_HZ}], got {hz}")
        self.path, self.node, self.period = Path(path), node, 1.0 / hz
        self.pids = list(pids or [os.getpid()])  # this run's ranks on this host
        self.cpus = cpus  # the cores they may run on
        self.stop_event = threading.Event()
        self.samples = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._sample()
        except OSError as e:  # a full disk ends the sampling, not the run (the run's own writes report it)
            self.error = f"{type(e).__name__}: {e}"

    def _sample(self) -> None:
        import psutil

        nvml, gpus = _gpu_handles(os.environ.get("CUDA_VISIBLE_DEVICES"))
        net0, disk0 = psutil.net_io_counters(), psutil.disk_io_counters()
        psutil.cpu_percent(None)  # the first call has no interval; it starts the measurement
        share = CpuShare(self.pids, self.cpus)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        nxt = t0 + self.period
        with files.create(self.path, newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            while not self.stop_event.wait(max(0.0, nxt - time.monotonic())):
                now = time.monotonic()
                # on the grid of the period; after a late wake-up (a busy machine) at least half a period to the
                # next sample: missed samples are skipped, never made up in a burst
                nxt = max(nxt + self.period, now + self.period / 2)
                net, disk = psutil.net_io_counters(), psutil.disk_io_counters()
                own_pids, own, foreign = share.sample()
                host = [
                    round(psutil.cpu_percent(None), 1),
                    round(psutil.virtual_memory().used / 2**30, 3),
                    net.bytes_recv - net0.bytes_recv if net else "",
                    net.bytes_sent - net0.bytes_sent if net else "",
                    disk.read_bytes - disk0.read_bytes if disk and disk0 else "",
                    disk.write_bytes - disk0.write_bytes if disk and disk0 else "",
                    round(own, 3),
                    round(foreign, 3),
                ]
                head = [round(time.time(), 3), round(now - t0, 3), self.node]
                if not gpus:
                    w.writerow(head + ["", "", "", "", "", "", ""] + host)
                for i, h in gpus:
                    util = _nvml(nvml.nvmlDeviceGetUtilizationRates, h)
                    mem = _nvml(nvml.nvmlDeviceGetMemoryInfo, h)
                    power = _nvml(nvml.nvmlDeviceGetPowerUsage, h)
                    temp = _nvml(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
                    clock = _nvml(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
                    foreign_gpu = _foreign_gpu_procs(nvml, h, own_pids)
                    w.writerow(
                        head
                        + [
                            i,
                            "" if util is None else util.gpu,
                            "" if mem is None else round(mem.used / 2**20, 1),
                            "" if power is None else round(power / 1e3, 2),
                            "" if temp is None else temp,
                            "" if clock is None else clock,
                            "" if foreign_gpu is None else foreign_gpu,
                        ]
                        + host
                    )
                f.flush()
                self.samples += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def rank_cpus(ranks: list[dict], key: str, value: str) -> set[int]:
    """The cores the ranks with ranks[i][key] == value may run on (the union of their CPU affinities)."""
    out: set[int] = set()
    for r in ranks:
        if r.get(key) == value:
            out |= cpu_set(r.get("cpus"))
    return out


def oversubscribed(ranks: list[dict], host_cores: int | None) -> list[str]:
    """Hosts where the ranks' compute threads outnumber the cores they may run on (their CPU affinity, else the
    host's cores): the run competes with itself."""
    by_host: dict[str, list[dict]] = {}
    for r in ranks:
        by_host.setdefault(r.get("host") or "", []).append(r)
    out = []
    for h, rs in sorted(by_host.items()):
        cores = len(rank_cpus(ranks, "host", h)) or host_cores
        threads = sum(int(r.get("threads") or 1) for r in rs)
        if cores and threads > cores:
            out.append(f"{len(rs)} rank(s) run {threads} compute threads on {cores} core(s) of {h}")
    return out


def contention(mon: dict | None, ranks: list[dict], host_cores: int | None) -> dict:
    """summary.json's `contention`: did the run share its cores or GPUs with foreign work, and the evidence.
    contended is None when nothing could be measured (monitor off and the allocation fine)."""
    evidence = oversubscribed(ranks, host_cores)
    measured = bool(evidence)
    foreign, own = (mon or {}).get("foreign_cpu_cores_mean"), (mon or {}).get("own_cpu_cores_mean")
    if foreign is not None:
        measured = True
        node = mon.get("foreign_cpu_node")
        cores = len(rank_cpus(ranks, "node", node)) or host_cores
        full = cores and (own or 0) + foreign >= BUSY_SHARE * cores
        if foreign >= FOREIGN_MIN_CORES and full:
            evidence.append(
                f"foreign processes used {foreign:.2f} of the {cores} cores of this run on "
                f"{node} beside this run's {own or 0:.2f} (mean over training)"
            )
    gpu = (mon or {}).get("gpu_foreign_procs_max")
    if gpu is not None:
        measured = True
        if gpu > 0:
            evidence.append(f"{gpu} compute process(es) that are not ranks of this run shared its GPUs")
    return {
        "contended": bool(evidence) if measured else None,
        "evidence": evidence,
        "rule": f"foreign CPU >= {FOREIGN_MIN_CORES} cores of the run's cores while they are >= {BUSY_SHARE:.0%} "
        f"busy, a foreign GPU process, or more compute threads than cores",
    }
