"""The bottleneck verdict of a run, from measured shares; the thresholds live here and nowhere else.

The seed studies' targets: the data loader idle < 5 % of the step, communication
< 20 % of the step, GPU utilisation > 80 %. A run is

- `data`:          the share of the step spent waiting for the next batch is above DATA_WAIT;
- `communication`: exposed communication (the comm probe's, when it resolved a value, else the
                   trace's communication share) is above COMM;
- `host-bound (launch)`: on a GPU, the device is busy less than UTILISATION of the time (NVML
                   utilisation over the timed steps, else the device trace's non-idle share), and its idle
                   time is mostly not explained by data wait or communication: the host cannot enqueue
                   kernels as fast as the device runs them. This is decided FIRST: a step whose device
                   idles 77 % of the time while the host spends 6 % of it enqueueing the on-device
                   augmentation is launch-bound, not data-bound (H200, ResNet-18 bf16: the data phase
                   is the host launching ~20 small kernels, not waiting for input);
- `compute`:       none of the above: the step is spent computing (with MFU as its quality, where a
                   peak is known);
- `unknown`:       no timed steps, or no measured share to decide from.

When both data and communication exceed their limits, the larger share (relative to its limit) wins
and the other is named in the evidence.
"""

from __future__ import annotations

DATA_WAIT = 0.05  # data-wait share of the step
COMM = 0.20  # exposed communication share of the step
UTILISATION = 0.80  # device busy share (GPU utilisation)

THRESHOLDS = {"data_wait_frac": DATA_WAIT, "comm_frac": COMM, "device_util": UTILISATION}
LAUNCH = "host-bound (launch)"
VERDICTS = ("data", "communication", "compute", LAUNCH, "unknown")


def comm_share(summary: dict, profile: dict | None) -> tuple[float | None, str | None]:
    """(exposed communication / step, where it came from): the probe when it resolved a value, else the trace."""
    step = summary.get("step_ms_p50")
    status = summary.get("exposed_comm_status")
    if summary.get("world_size", 1) <= 1:
        return 0.0, "one rank: no communication"
    if step and status == "measured" and summary.get("exposed_comm_ms") is not None:
        return summary["exposed_comm_ms"] / step, "comm probe"
    if step and status == "below noise":
        return 0.0, "comm probe (not distinguishable from zero)"
    if profile and profile.get("share"):
        return profile["share"].get("communication", 0.0), f"trace ({profile.get('timeline', 'host')} timeline)"
    return None, None


def device_util(summary: dict, monitor: dict | None, profile: dict | None) -> tuple[float | None, str | None]:
    if monitor and monitor.get("gpu_util_mean_pct") is not None:
        return monitor["gpu_util_mean_pct"] / 100, "NVML GPU utilisation (mean over the training loop)"
    if profile and profile.get("gpu_kernels"):
        return 1 - profile["share"].get("idle", 0.0), "device trace: share of the profiled steps not idle"
    return None, None


def launch_bound(wait: float | None, comm: float | None, util: float | None, util_src: str | None) -> str | None:
    """The reason a GPU step is host-bound (launch), or None: the device is busy < UTILISATION, and of its idle
    time less than half is explained by data wait and exposed communication together."""
    if util is None or util >= UTILISATION:
        return None
    idle, explained = 1 - util, (wait or 0.0) + (comm or 0.0)
    if explained >= idle / 2:
        return None
    return (
        f"the GPU is busy only {100 * util:.0f} % of the time ({util_src}) < {100 * UTILISATION:.0f} %; of its "
        f"{100 * idle:.0f} % idle, data wait ({'unmeasured' if wait is None else f'{100 * wait:.1f} %'}) and "
        f"exposed communication ({'unmeasured' if comm is None else f'{100 * comm:.1f} %'}) explain "
        f"{100 * explained:.1f} points: the host does not launch kernels as fast as the GPU runs them"
    )


def decide(summary: dict, monitor: dict | None = None, profile: dict | None = None) -> dict:
    """{verdict, reason, evidence, thresholds} for one run's summary (and its monitor and profile summaries)."""
    ev: dict = {
        "data_wait_frac": summary.get("data_wait_frac"),
        "mfu": summary.get("mfu"),
        "device_type": "cuda" if monitor and monitor.get("gpus") else summary.get("device_type"),
    }
    comm, comm_src = comm_share(summary, profile)
    util, util_src = device_util(summary, monitor, profile)
    ev.update(
        comm_frac=None if comm is None else round(comm, 5),
        comm_source=comm_src,
        device_util=None if util is None else round(util, 5),
        device_util_source=util_src,
    )
    out = {"thresholds": dict(THRESHOLDS), "evidence": ev}
    if not summary.get("timed_steps"):
        return {**out, "verdict": "unknown", "reason": "no timed steps: nothing to decide from"}
    wait = summary.get("data_wait_frac")
    gpu = ev["device_type"] == "cuda" or (profile or {}).get("gpu_kernels")
    launch = launch_bound(wait, comm, util, util_src) if gpu else None
    if launch is not None:
        return {**out, "verdict": LAUNCH, "reason": launch}
    over = []
    if wait is not None and wait > DATA_WAIT:
        over.append(("data", wait / DATA_WAIT, f"data wait {100 * wait:.1f} % of the step > {100 * DATA_WAIT:.0f} %"))
    if comm is not None and comm > COMM:
        over.append(
            (
                "communication",
                comm / COMM,
                f"exposed communication {100 * comm:.1f} % of the step ({comm_src}) > {100 * COMM:.0f} %",
            )
        )
    if over:
        over.sort(key=lambda t: -t[1])
        reason = "; ".join(t[2] for t in over)
        return {**out, "verdict": over[0][0], "reason": reason}
    if wait is None and comm is None:
        return {**out, "verdict": "unknown", "reason": "neither data wait nor communication was measured"}
    below = [
        f"data wait {100 * wait:.1f} % <= {100 * DATA_WAIT:.0f} %" if wait is not None else "data wait unmeasured",
        f"communication {100 * comm:.1f} % <= {100 * COMM:.0f} %" if comm is not None else "communication unmeasured",
    ]
    tail = (
        f"; GPU busy {100 * util:.0f} % ({util_src})"
        if gpu and util is not None
        else "; the device computes through the step"
        if not gpu
        else "; GPU utilisation not measured"
    )
    if summary.get("mfu") is not None:
        tail += f"; MFU {100 * summary['mfu']:.1f} %"
    return {**out, "verdict": "compute", "reason": "; ".join(below) + tail}
