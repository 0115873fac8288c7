"""What a step and an epoch add up to: loss and metric sums on the device, the epoch's row, its log line.

Sums stay on the device as one float64 vector, [loss sum, samples, metric numerators ...,
metric denominators ...], so a step adds to them without a host sync; an epoch reduces them
over ranks once. Throughput is the global batch over the MEDIAN step time of the epoch's timed
steps, where a step's time is that of its slowest rank (it bounds a DDP step).
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist

from kernels.base.dist import all_reduce
from kernels.base.flops import mfu
from kernels.base.stats import step_summary, thin

# Step times kept per epoch for the run's median (evenly strided beyond this): enough for a
# stable median and p10/p90, small enough for the checkpoint of a 100k-step epoch.
STEP_SAMPLES_PER_EPOCH = 4096


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def zero_timing() -> dict:
    return {"step_ms": [], "sum_step_ms": 0.0, "sum_wait_ms": 0.0, "timed_steps": 0}


def rounded(v, nd: int = 3):
    return None if v is None else round(float(v), nd)


def batch_len(y) -> int:
    return (y[0] if isinstance(y, (tuple, list)) else y).shape[0]


def detach(out):
    return tuple(o.detach() for o in out) if isinstance(out, (tuple, list)) else out.detach()


def _add(into: torch.Tensor, v) -> None:
    """into += v, where v is a tensor (on the device: no copy) or a Python number (a kernel argument). A number
    turned into a device tensor first would be a blocking host-to-device copy, a sync in every step."""
    if isinstance(v, torch.Tensor):
        into += v.to(torch.float64).reshape(-1).expand(into.shape[0])
    else:
        into += float(v)


class MetricSums:
    """The workload's metrics as sums: zero, add a batch, turn into values."""

    def __init__(self, workload, device: torch.device):
        self.wl, self.device = workload, device
        self.cols = [c.removeprefix("eval_") for m in workload.metrics for c in m.columns("eval")]
        self.root = [m.root for m in workload.metrics for _ in m.columns("eval")]

    def zeros(self) -> torch.Tensor:
        """[loss sum, samples, metric numerators ..., metric denominators ...] on the device."""
        return torch.zeros(2 + 2 * len(self.cols), dtype=torch.float64, device=self.device)

    def add(self, sums: torch.Tensor, loss: torch.Tensor, out, y) -> None:
        """A batch's mean loss (weighted by its samples) and the workload's (numerator, denominator) sums."""
        n = batch_len(y)
        sums[0] += loss.double() * n
        sums[1] += n
        got = self.wl.metric_sums(out, y)
        k, i = len(self.cols), 0
        for m in self.wl.metrics:
            num, den = got[m.name]
            _add(sums[2 + i : 2 + i + m.size], num)
            _add(sums[2 + k + i : 2 + k + i + m.size], den)
            i += m.size

    def values(self, sums: torch.Tensor, prefix: str) -> dict:
        k = len(self.cols)
        num, den = sums[2 : 2 + k].tolist(), sums[2 + k :].tolist()
        return {
            f"{prefix}_{c}": ((a / b) ** 0.5 if root else a / b) if b else None
            for c, root, a, b in zip(self.cols, self.root, num, den)
        }

    def no_eval(self) -> dict:
        """An epoch without evaluation (eval_every): its eval columns are empty."""
        return {"eval_loss": None, **{f"eval_{c}": None for c in self.cols}}


def slowest_steps(wait: list[float], comp: list[float], device, world: int) -> tuple[list[float], list[float]]:
    """(each timed step's time on its slowest rank, each step's data wait averaged over ranks)."""
    if not wait:
        return [], []
    per_step = torch.tensor([[w + c for w, c in zip(wait, comp)], wait], dtype=torch.float64, device=device)
    slow = per_step[0].clone()
    dist.all_reduce(slow, op=dist.ReduceOp.MAX)
    waits = per_step[1].clone()
    dist.all_reduce(waits)
    return slow.tolist(), (waits / world).tolist()


def epoch_row(
    ep: dict,
    sums: torch.Tensor,
    ms: MetricSums,
    timing: dict,
    ev: dict,
    lr: float,
    flops: dict,
    peak: float | None,
    batch: int,
    world: int,
) -> dict:
    """One metrics.csv row; adds the epoch's slowest-rank step times to the run's `timing`.

    ep: epoch, steps, wait and comp (this rank's timed steps), epoch_s and eval_s."""
    wait, comp, device = ep["wait"], ep["comp"], ms.device
    n_timed = len(wait)  # the same on every rank: same steps, same warm-up
    slowest, wait_mean = slowest_steps(wait, comp, device, world)
    epoch_s_max, mem = all_reduce([ep["epoch_s"], peak_memory_gib(device)], device, op=dist.ReduceOp.MAX)
    dist.all_reduce(sums)
    n = max(float(sums[1]), 1.0)
    st = step_summary(slowest, batch)
    tput = st["samples_per_s"]
    per_dev = tput / world if tput else None
    tflops = per_dev * flops["train_flops_per_sample"] / 1e12 if per_dev else None
    timing["step_ms"] += thin(slowest, STEP_SAMPLES_PER_EPOCH)
    timing["sum_step_ms"] += sum(slowest)
    timing["sum_wait_ms"] += sum(wait_mean)
    timing["timed_steps"] += n_timed
    mean_wait = sum(wait_mean) / n_timed if n_timed else None
    row = {
        "epoch": ep["epoch"] + 1,
        "steps": ep["steps"],
        "timed_steps": n_timed,
        "samples": ep["steps"] * batch,
        "epoch_s": round(epoch_s_max, 4),
        "eval_s": round(ep["eval_s"], 4),
        "samples_per_s": rounded(tput),
        "samples_per_s_p10": rounded(st["samples_per_s_p10"]),
        "samples_per_s_p90": rounded(st["samples_per_s_p90"]),
        "samples_per_s_per_device": rounded(per_dev),
        "step_ms_p50": rounded(st["step_ms_p50"]),
        "step_ms_p10": rounded(st["step_ms_p10"]),
        "step_ms_p90": rounded(st["step_ms_p90"]),
        "step_ms_mean": rounded(st["step_ms_mean"]),
        "data_wait_ms": rounded(mean_wait),
        "compute_ms": rounded(st["step_ms_mean"] - mean_wait if n_timed else None),
        "data_wait_frac": rounded(sum(wait_mean) / sum(slowest) if n_timed and sum(slowest) else None, 5),
        "train_loss": float(sums[0]) / n,
        "eval_loss": ev["eval_loss"],
        "lr": lr,
        "peak_mem_gib": round(mem, 4),
        "tflops_per_device": rounded(tflops, 5),
        "mfu": rounded(mfu(per_dev, flops["train_flops_per_sample"], peak), 5),
    }
    row.update(ms.values(sums, "train"))
    row.update({k: v for k, v in ev.items() if k != "eval_loss"})
    return row


def epoch_line(row: dict, epochs: int, cols: list[str]) -> str:
    metrics = " ".join(f"eval_{c} {row[f'eval_{c}']:.4f}" for c in cols if row.get(f"eval_{c}") is not None)
    if row["samples_per_s"]:
        timing = (
            f"{row['samples_per_s']:,.1f} samples/s (median step {row['step_ms_p50']:.1f} ms, "
            f"p10-p90 {row['step_ms_p10']:.1f}-{row['step_ms_p90']:.1f}; "
            f"data wait {100 * (row['data_wait_frac'] or 0):.1f}%)"
        )
    else:
        timing = "warm-up only: no timed steps this epoch"
    return (
        f"epoch {row['epoch']}/{epochs} done: train_loss {row['train_loss']:.4f} "
        + (f"eval_loss {row['eval_loss']:.4f} {metrics}" if row["eval_loss"] is not None else "(no evaluation)")
        + f" | {timing} | epoch {row['epoch_s']:.1f} s"
    )
