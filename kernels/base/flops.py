"""FLOPs counted from the model, device peaks looked up by name, and MFU.

FLOPs come from torch.utils.flop_counter (2 FLOPs per multiply-add), never
from a formula typed in by hand. Peaks are the vendors' dense (no sparsity)
datasheet figures per precision; fp32 on Ampere and newer uses the TF32 tensor
core peak because cuDNN convolutions run in TF32 by default (the record says
so). An unknown device gives no peak and an empty MFU, not a wrong one.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

# TFLOP/s, dense. Keys are matched as whole words of the lower-cased device name ("l4" is not
# "L40S", "h200" is not "GH200"); the first match wins, so the more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("gh200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("h200 nvl", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("h200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),  # SXM
    ("h100 pcie", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("h100 nvl", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("h100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),  # SXM
    ("a100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("a40", {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4}),
    ("a30", {"bf16": 165.0, "fp16": 165.0, "tf32": 82.0, "fp32": 10.3}),
    ("a10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("l40s", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("l40", {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    ("l4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("v100", {"fp16": 125.0, "fp32": 15.7}),
    ("t4", {"fp16": 65.0, "fp32": 8.1}),
    ("mi300x", {"bf16": 1307.0, "fp16": 1307.0, "tf32": 653.7, "fp32": 163.4}),
    ("mi250x", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
)


def is_mig(device_name: str) -> bool:
    """A MIG slice's name, e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb"."""
    import re

    return re.search(r"(?<![a-z0-9])mig(?![a-z0-9])", device_name.lower()) is not None


def peak_tflops(device_name: str, precision: str, tf32: bool = True) -> float | None:
    """Dense peak of `device_name` for `precision`, or None when unknown."""
    import re

    name = device_name.lower()
    if is_mig(name):
        return None  # peak_note says why
    for key, table in PEAK_TFLOPS:
        if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])", name):
            if precision == "fp32" and tf32 and "tf32" in table:
                return table["tf32"]
            return table.get(precision)
    return None


def peak_note(device_name: str, precision: str) -> str | None:
    """Why a device has no peak (and so no MFU), in words; None where it has one or is a CPU."""
    if is_mig(device_name):
        return (
            f"{device_name} is a MIG slice: its share of the chip's tensor-core peak is not published, so MFU "
            f"is left empty rather than computed against the whole chip"
        )
    if peak_tflops(device_name, precision) is None:
        return f"no datasheet peak for {device_name} at {precision} in kernels/base/flops.py: MFU is left empty"
    return None


def count_flops(fn) -> int:
    """Total FLOPs of everything `fn()` runs (forward and, if it calls it, backward)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def model_flops_per_sample(model: torch.nn.Module, example, loss_fn, target, forward=None) -> dict:
    """Forward and training (forward + backward) FLOPs per sample of `model` on `example`.

    forward(model, x, y) runs the model as the workload does (default: model(x)).
    Gradients produced here are cleared afterwards; pass a copy of the model so
    that its BatchNorm statistics are untouched.
    """
    forward = forward or (lambda m, x, y: m(x))
    batch = (example[0] if isinstance(example, (tuple, list)) else example).shape[0]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        fwd = count_flops(lambda: forward(model, example, target))
    model.train(was_training)

    def step():
        loss_fn(forward(model, example, target), target).backward()

    train = count_flops(step)
    model.zero_grad(set_to_none=True)
    return {"fwd_flops_per_sample": fwd / batch, "train_flops_per_sample": train / batch}


def mfu(samples_per_s_per_device: float, train_flops_per_sample: float, peak: float | None) -> float | None:
    if not peak or not samples_per_s_per_device:
        return None
    return samples_per_s_per_device * train_flops_per_sample / (peak * 1e12)
