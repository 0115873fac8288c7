"""Where a profiled step's time goes: categories and top operators from a Chrome/Perfetto trace.

A torch.profiler trace holds, per thread, nested host events (ProfilerStep#N, the
lab's phase ranges `lab:data` ... `lab:optimizer`, aten operators, autograd nodes,
c10d/gloo/NCCL collectives) and, on GPUs, device kernels and copies per stream.

Host timeline (every trace; the timeline that bounds a CPU step): the thread that
holds the ProfilerStep#N ranges. Every microsecond of those steps is given to
exactly one category, so the categories sum to the profiled time:
- the innermost event covering it decides, through the rules of `category_of`
  (the data and optimizer phases and collectives claim everything under them; an
  operator's own category otherwise; generic operators such as aten::empty or
  aten::view take their parent's);
- time covered by no operator (Python, launches, waiting) is `idle`, except while
  a collective of this rank is in flight on another thread (gloo runs its
  collectives on its own threads): that waiting is `communication`.

Device timeline (traces with GPU kernels): the union of the steps' spans on the
device; a moment where a compute kernel runs is that kernel's category (compute
overlapping NCCL counts as compute: the communication is hidden), where only an
NCCL kernel runs is `communication` (exposed), only a copy is `memory copy`,
nothing is `idle`. Hidden communication is reported beside it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

from kernels.base import files

CATEGORIES = (
    "convolution",
    "gemm/linear",
    "normalisation",
    "elementwise/activation",
    "pooling",
    "optimizer",
    "communication",
    "memory copy",
    "data pipeline",
    "other ops",
    "idle",
)

_COMM = re.compile(
    r"^(c10d::|gloo:|nccl:|nccl|ncclKernel|ncclDevKernel|record_param_comms|"
    r"torch\.distributed\.ddp\.reducer|torch::distributed::reducer|DistributedDataParallel\.sync)"
    r"|allreduce|all_reduce|allgather|all_gather|reduce_scatter|broadcast_coalesced",
    re.I,
)
_RULES = (  # (pattern on an operator or kernel name, category), first match wins
    (re.compile(r"conv|cudnn|winograd|implicit_gemm|fprop|dgrad|wgrad|im2col|col2im", re.I), "convolution"),
    (
        re.compile(
            r"batch_norm|batchnorm|layer_norm|layernorm|group_norm|groupnorm|instance_norm|bn_fw|bn_bw|"
            r"NativeBatchNorm|welford",
            re.I,
        ),
        "normalisation",
    ),
    (re.compile(r"pool", re.I), "pooling"),
    (
        re.compile(
            r"\b(aten::)?(mm|bmm|addmm|matmul|linear|baddbmm|addbmm|einsum)\b|gemm|cublas|cutlass|sm\d+_xmma|"
            r"AddmmBackward|MmBackward|BmmBackward|LinearBackward",
            re.I,
        ),
        "gemm/linear",
    ),
    (re.compile(r"multi_tensor_apply|fused_adam|fused_sgd|_foreach_|adam|sgd|lamb|lars", re.I), "optimizer"),
    (
        re.compile(
            r"relu|threshold|gelu|silu|sigmoid|tanh|softmax|nll_loss|cross_entropy|dropout|elementwise|"
            r"\b(aten::)?(add|add_|sub|mul|mul_|div|div_|where|clamp|clamp_min|neg|exp|log|pow|sqrt|rsqrt|"
            r"sum|mean|addcmul_|addcdiv_|lerp_|abs|sign|masked_fill|reciprocal)\b|reduce_kernel|"
            r"AccumulateGrad",
            re.I,
        ),
        "elementwise/activation",
    ),
    (
        re.compile(
            r"memcpy|memset|\b(aten::)?(copy_|_to_copy|to|clone|contiguous|cat|stack|pin_memory|"
            r"_copy_from|index_select|gather)\b|Memcpy|Memset",
            re.I,
        ),
        "memory copy",
    ),
)
# operators that do no work of their own here: they take their caller's category
_GENERIC = re.compile(
    r"^(aten::)?(empty|empty_strided|empty_like|view|as_strided|as_strided_|reshape|"
    r"_reshape_alias|t|transpose|permute|expand|slice|select|narrow|unsqueeze|squeeze|flatten|"
    r"detach|detach_|resolve_conj|resolve_neg|alias|lift_fresh|zeros|zeros_like|ones_like|"
    r"zero_|fill_|resize_|result_type|item|_local_scalar_dense|is_nonzero|size|stride|"
    r"contiguous|set_)$|^detach$|^autograd::engine::evaluate_function|Backward0$|Backward1$"
)
_DATA = re.compile(r"^lab:data$|DataLoader|enumerate\(DataLoader\)")
_OPT = re.compile(r"^lab:optimizer$|^Optimizer\.(step|zero_grad)#")


def category_of(name: str) -> str | None:
    """An operator's or kernel's own category, or None when it has none of its own (generic, annotations)."""
    if _COMM.search(name):
        return "communication"
    if name.startswith(("lab:", "ProfilerStep#")) or _GENERIC.search(name):
        bw = re.match(r"^(autograd::engine::evaluate_function: )?(\w+?)Backward\d$", name)
        if bw:  # an autograd node: its forward op's category (ConvolutionBackward0 -> convolution)
            return category_of(bw.group(2))
        return None
    for rx, cat in _RULES:
        if rx.search(name):
            return cat
    return None


def load(path: Path) -> dict:
    """A Chrome trace, gzipped or not; a clear error naming the file when it is not one."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable Chrome trace ({type(e).__name__}: {e})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path} is not a Chrome trace (no traceEvents list)")
    return trace


def rank_of(trace: dict) -> int | None:
    info = trace.get("distributedInfo") or {}
    return info.get("rank")


def _complete(events):
    for e in events:
        if e.get("ph") == "X" and "dur" in e and "ts" in e:
            yield e


def _steps(trace: dict):
    """(main thread key, [(start, end) of each ProfilerStep#N]) in microseconds."""
    steps = [
        e
        for e in _complete(trace["traceEvents"])
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") in ("cpu_op", "user_annotation", None)
    ]
    if not steps:
        raise ValueError("the trace has no ProfilerStep#N ranges: was it recorded with a schedule and prof.step()?")
    by_thread = defaultdict(list)
    for e in steps:
        by_thread[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    main = max(by_thread, key=lambda k: sum(b - a for a, b in by_thread[k]))
    return main, sorted(by_thread[main])


def _forced(name: str) -> str | None:
    if _DATA.search(name):
        return "data pipeline"
    if _OPT.search(name):
        return "optimizer"
    if _COMM.search(name):
        return "communication"
    return None


def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(a: float, b: float, union: list, start_index: int = 0) -> float:
    """Length of [a, b) covered by the sorted disjoint `union`."""
    total = 0.0
    for u0, u1 in union[start_index:]:
        if u0 >= b:
            break
        if u1 > a:
            total += min(b, u1) - max(a, u0)
    return total


def _clip(a, b, windows):
    for w0, w1 in windows:
        lo, hi = max(a, w0), min(b, w1)
        if hi > lo:
            yield lo, hi


def host_breakdown(trace: dict) -> dict:
    """The host timeline's categories (us), top operators by self time, and the step count."""
    (pid, tid), windows = _steps(trace)
    events = [
        e
        for e in _complete(trace["traceEvents"])
        if (e.get("pid"), e.get("tid")) == (pid, tid) and not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    # collectives of this process running on other threads (gloo): main-thread idle overlapping them is waiting
    comm_other = _union(
        [
            (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in _complete(trace["traceEvents"])
            if e.get("pid") == pid and e.get("tid") != tid and _COMM.search(str(e.get("name", "")))
        ]
    )
    events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
    cats = defaultdict(float)
    self_by_op = defaultdict(lambda: [0.0, 0, None])
    # [start, end (clipped to the parent), event, category of its own time, time of its children, the outermost
    # claiming category (data, optimizer, communication) among it and its ancestors]
    stack = []

    def close(item):
        start, end, e, cat, children, _ = item
        mine = list(_clip(start, end, windows))
        own = max(0.0, sum(b - a for a, b in mine) - children)
        if own <= 0:
            return
        if cat is None:  # a phase range or an annotation: not an operator, so its own time is idle or waiting
            wait = min(own, sum(_overlap(a, b, comm_other) for a, b in mine))
            cats["communication"] += wait
            cats["idle"] += own - wait
            return
        cats[cat] += own
        op = self_by_op[e["name"]]
        op[0] += own
        op[1] += 1
        op[2] = cat

    for e in events:
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        while stack and stack[-1][1] <= start:
            close(stack.pop())
        name = str(e.get("name", ""))
        own_claim = _forced(name)
        outer = stack[-1][5] if stack else None
        forced = own_claim or outer
        if forced:  # the data and optimizer phases and collectives claim everything under them
            cat = forced
        else:
            own = category_of(name)
            parent = stack[-1][3] if stack else None
            is_op = e.get("cat") in ("cpu_op", None) and not name.startswith("lab:")
            cat = own or parent or ("other ops" if is_op else None)
        if stack:
            end = min(end, stack[-1][1])
            stack[-1][4] += sum(b - a for a, b in _clip(start, end, windows))
        stack.append([start, end, e, cat, 0.0, outer or own_claim])
    while stack:
        close(stack.pop())
    total = sum(b - a for a, b in windows)
    covered = sum(cats.values())
    cats["idle"] += max(0.0, total - covered)  # step time outside every event: the loop's own Python
    top = sorted(
        ({"name": k, "category": v[2], "self_us": v[0], "calls": v[1]} for k, v in self_by_op.items()),
        key=lambda r: -r["self_us"],
    )
    return {
        "timeline": "host",
        "steps": len(windows),
        "profiled_us": total,
        "categories": {c: cats.get(c, 0.0) for c in CATEGORIES},
        "top_ops": top,
    }


def _device_steps(evs: list, kern: list, host: list) -> list:
    """The device-side span of each profiled step, as TensorBoard's profiler plugin draws it: a step runs from the
    end of the one before (or its host start) to the later of its host end and the end of the last kernel or copy
    it launched, a launch belonging to the step whose host window holds its runtime call (matched by correlation
    id, whatever thread made it). Kineto's own gpu_user_annotation spans of ProfilerStep# cover only the work
    launched from the annotated thread, so they miss the backward pass, which the autograd engine launches from
    its device thread (pytorch/kineto#1022: on an H200, 0.56 ms of each 25-27 ms profiled step of a compiled
    ResNet-18). Traces without runtime events fall back to those spans, then to the host windows."""
    launch = {
        e["args"]["correlation"]: float(e["ts"])
        for e in evs
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and isinstance(e.get("args"), dict)
        and "correlation" in e["args"]
    }
    starts, ends = [w0 for w0, _ in host], [w1 for _, w1 in host]
    matched = False
    for e in kern:
        t = launch.get((e.get("args") or {}).get("correlation"))
        if t is None:
            continue
        i = bisect.bisect_right(starts, t) - 1
        if 0 <= i < len(host) and t < host[i][1]:
            ends[i] = max(ends[i], float(e["ts"]) + float(e["dur"]))
            matched = True
    if not matched:
        gsteps = sorted(
            (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in evs
            if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
        )
        return _union(gsteps or host)
    out, prev = [], float("-inf")
    for (w0, _), end in zip(host, ends):
        start = max(w0, prev)
        out.append((start, max(end, start)))
        prev = out[-1][1]
    return _union(out)


def device_breakdown(trace: dict) -> dict | None:
    """The device timeline's categories (us) from GPU kernels and copies, or None without GPU activity."""
    evs = list(_complete(trace["traceEvents"]))
    kern = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kern:
        return None
    _, host = _steps(trace)
    windows = _device_steps(evs, kern, host)
    ops_by_ext = {
        e["args"].get("External id"): str(e.get("name", ""))
        for e in evs
        if e.get("cat") == "cpu_op" and isinstance(e.get("args"), dict)
    }
    items = []
    for e in kern:
        name = str(e.get("name", ""))
        if e.get("cat") != "kernel":
            cat = "memory copy"
        else:
            cat = category_of(name)
            if cat is None:
                launcher = ops_by_ext.get((e.get("args") or {}).get("External id"), "")
                cat = category_of(launcher) or "other ops"
        for a, b in _clip(float(e["ts"]), float(e["ts"]) + float(e["dur"]), windows):
            items.append((a, b, cat, name))
    # sweep: at each moment the running activities decide the category (compute > communication > copy)
    rank = {"communication": 1, "memory copy": 0}
    points = sorted({p for a, b, _, _ in items for p in (a, b)} | {p for w in windows for p in w})
    starts = sorted(items, key=lambda t: t[0])
    cats, hidden = defaultdict(float), 0.0
    active, j = [], 0
    kernel_us = defaultdict(lambda: [0.0, 0, None])
    for a, b, cat, name in items:
        k = kernel_us[name]
        k[0] += b - a
        k[1] += 1
        k[2] = cat
    for p0, p1 in zip(points, points[1:]):
        while j < len(starts) and starts[j][0] <= p0:
            active.append(starts[j])
            j += 1
        active = [t for t in active if t[1] > p0]
        if not any(w0 <= p0 < w1 for w0, w1 in windows):
            continue
        d = p1 - p0
        if not active:
            cats["idle"] += d
            continue
        best = max(active, key=lambda t: (rank.get(t[2], 2), t[0]))
        cats[best[2]] += d
        if best[2] != "communication" and any(t[2] == "communication" for t in active):
            hidden += d
    total = sum(b - a for a, b in windows)
    top = sorted(
        ({"name": k, "category": v[2], "self_us": v[0], "calls": v[1]} for k, v in kernel_us.items()),
        key=lambda r: -r["self_us"],
    )
    return {
        "timeline": "device",
        "steps": len(host),
        "profiled_us": total,
        "categories": {c: cats.get(c, 0.0) for c in CATEGORIES},
        "hidden_comm_us": hidden,
        "top_ops": top,
    }


def analyse(path: Path, top_n: int = 15) -> dict:
    """One rank's breakdown: the device timeline where the trace has GPU kernels, else the host's;
    per-step milliseconds and shares by category, the top operators, and both timelines' figures."""
    trace = load(path)
    host = host_breakdown(trace)
    dev = device_breakdown(trace)
    main = dev or host
    steps = max(1, main["steps"])
    out = {
        "trace": Path(path).name,
        "rank": rank_of(trace),
        "timeline": main["timeline"],
        "steps": main["steps"],
        "profiled_ms_per_step": main["profiled_us"] / 1e3 / steps,
        "ms_per_step": {c: v / 1e3 / steps for c, v in main["categories"].items()},
        "share": {c: (v / main["profiled_us"] if main["profiled_us"] else 0.0) for c, v in main["categories"].items()},
        "top_ops": [{**r, "self_ms_per_step": r["self_us"] / 1e3 / steps} for r in main["top_ops"][:top_n]],
        "gpu_kernels": dev is not None,
    }
    if dev is not None:
        out["hidden_comm_ms_per_step"] = dev["hidden_comm_us"] / 1e3 / steps
        out["host_share"] = {c: v / host["profiled_us"] for c, v in host["categories"].items()}
    for r in out["top_ops"]:
        r.pop("self_us")
    return out


def combine(per_rank: list[dict]) -> dict:
    """All ranks: mean milliseconds per step and share by category, and the spread of each share over ranks."""
    if not per_rank:
        raise ValueError("no per-rank breakdowns to combine")
    n = len(per_rank)
    ms = {c: sum(r["ms_per_step"][c] for r in per_rank) / n for c in CATEGORIES}
    total = sum(r["profiled_ms_per_step"] for r in per_rank) / n
    shares = {c: ms[c] / total if total else 0.0 for c in CATEGORIES}
    spread = {c: [min(r["share"][c] for r in per_rank), max(r["share"][c] for r in per_rank)] for c in CATEGORIES}
    ops = defaultdict(lambda: [0.0, 0, None])
    for r in per_rank:
        for o in r["top_ops"]:
            a = ops[o["name"]]
            a[0] += o["self_ms_per_step"] / n
            a[1] += o["calls"]
            a[2] = o["category"]
    top = sorted(
        ({"name": k, "category": v[2], "self_ms_per_step": v[0], "calls": v[1]} for k, v in ops.items()),
        key=lambda o: -o["self_ms_per_step"],
    )
    return {
        "ranks": n,
        "timeline": per_rank[0]["timeline"],
        "steps": per_rank[0]["steps"],
        "profiled_ms_per_step": total,
        "ms_per_step": ms,
        "share": shares,
        "share_range": spread,
        "top_ops": top[:15],
        "hidden_comm_ms_per_step": (
            sum(r.get("hidden_comm_ms_per_step", 0.0) for r in per_rank) / n if per_rank[0]["gpu_kernels"] else None
        ),
        "gpu_kernels": per_rank[0]["gpu_kernels"],
    }


def rows(per_rank: list[dict], combined: dict) -> list[dict]:
    """breakdown.csv: one row per (rank or 'all', category)."""
    out = []
    for r in [*per_rank, {**combined, "rank": "all"}]:
        for c in CATEGORIES:
            out.append(
                {
                    "rank": r["rank"],
                    "timeline": r["timeline"],
                    "category": c,
                    "ms_per_step": round(r["ms_per_step"][c], 4),
                    "share": round(r["share"][c], 5),
                    "profiled_ms_per_step": round(r["profiled_ms_per_step"], 4),
                    "steps": r["steps"],
                }
            )
    return out


def plot(per_rank: list[dict], combined: dict, path: Path, title: str = "") -> Path:
    """A stacked bar per rank and one for all ranks: milliseconds per step by category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [*per_rank, {**combined, "rank": "all"}]
    labels = [f"rank {r['rank']}" if r["rank"] != "all" else "mean" for r in bars]
    used = [c for c in CATEGORIES if any(r["ms_per_step"][c] > 0 for r in bars)]
    colors = dict(zip(CATEGORIES, plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]))
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.45 * len(bars) + 0.25 * len(used) / 2))
    left = [0.0] * len(bars)
    for c in used:
        vals = [r["ms_per_step"][c] for r in bars]
        ax.barh(labels, vals, left=left, color=colors[c], label=c)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel(f"ms per profiled step ({combined['timeline']} timeline)")
    ax.invert_yaxis()
    ax.legend(
        fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / max(1, len(bars))), frameon=False
    )
    if title:
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    from kernels.base.alttext import png_metadata

    with files.replacing(path) as tmp:
        fig.savefig(tmp, dpi=130, bbox_inches="tight", metadata=png_metadata(fig))
    plt.close(fig)
    return path
