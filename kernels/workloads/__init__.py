"""Workloads: each supplies model, data, loss and metrics; the loop knows none of them.

A workload is a `Workload` instance registered here by name. Adding one (CNN on
MNIST, DCRNN on traffic graphs) means adding a module and a line in WORKLOADS;
kernels/ddp_core.py does not change.
"""
from __future__ import annotations

from kernels.workloads.base import Augment, Split, Workload

WORKLOADS: dict[str, str] = {
    # name -> module holding `WORKLOAD`; imported on first use
    "resnet18": "kernels.workloads.resnet18_cifar",
}


def get_workload(name: str) -> Workload:
    import importlib

    from kernels.params import ConfigError

    if name not in WORKLOADS:
        raise ConfigError(f"parameter 'workload': unknown workload '{name}'; choose one of {', '.join(WORKLOADS)}")
    return importlib.import_module(WORKLOADS[name]).WORKLOAD


__all__ = ["Augment", "Split", "Workload", "WORKLOADS", "get_workload"]
