"""Workloads: each supplies its parameters, data, model, recipe, loss and metrics; the loop knows none of them.

A registered workload is a module holding `WORKLOAD` (a `Workload`), listed in
WORKLOADS. Your own model needs no change here: `workload=package.module:OBJECT`
imports OBJECT (a `Workload`) from a module in the current directory or on
PYTHONPATH (docs/user-guide.md: "Your own model"; examples/mlp_workload.py).
"""

from __future__ import annotations

import importlib
import os
import sys

from kernels.workloads.base import DataInfo, Metric, Recipe, Workload

WORKLOADS: dict[str, str] = {
    # name -> module holding `WORKLOAD`; imported on first use
    "resnet18": "kernels.workloads.resnet18_cifar",
    "cnn": "kernels.workloads.mnist_cnn",
    "dcrnn": "kernels.workloads.dcrnn",
}


def get_workload(name: str) -> Workload:
    from kernels.base.errors import ConfigError

    if name in WORKLOADS:
        return importlib.import_module(WORKLOADS[name]).WORKLOAD
    if ":" in name:
        module, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:  # as `python -m` does: modules of the current directory import
            sys.path.insert(0, os.getcwd())
        try:
            wl = getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise ConfigError(f"parameter 'workload': cannot import {module} ({e}); put it on PYTHONPATH") from None
        except AttributeError:
            raise ConfigError(f"parameter 'workload': {module} has no {attr}") from None
        if not isinstance(wl, Workload):
            raise ConfigError(
                f"parameter 'workload': {name} is a {type(wl).__name__}, not a kernels.workloads.Workload"
            )
        clash = [p.name for p in wl.params if owner_of(p.name) not in (None, wl.name)]
        if clash:
            raise ConfigError(
                f"parameter 'workload': {name} declares {', '.join(clash)}, already a parameter of "
                f"workload {owner_of(clash[0])}; rename it"
            )
        return wl
    raise ConfigError(
        f"parameter 'workload': unknown workload '{name}'; choose one of {', '.join(WORKLOADS)}, "
        f"or give module:OBJECT for your own"
    )


def registered() -> list[Workload]:
    return [get_workload(name) for name in WORKLOADS]


def reporting_of(wl: Workload):
    """The workload's reporting module (Workload.reporting), or None when it brings nothing to the documents."""
    return importlib.import_module(wl.reporting) if wl.reporting else None


def record_fields() -> dict[str, dict[str, str]]:
    """Per registered workload with its own summary.json entries, their meanings: {workload title: fields}."""
    return {
        wl.title: m.RECORD_FIELDS
        for wl in registered()
        if (m := reporting_of(wl)) is not None and hasattr(m, "RECORD_FIELDS")
    }


def owner_of(param: str) -> str | None:
    """The registered workload that declares `param`, if any."""
    for wl in registered():
        if any(p.name == param for p in wl.params):
            return wl.name
    return None


__all__ = [
    "DataInfo",
    "Metric",
    "Recipe",
    "Workload",
    "WORKLOADS",
    "get_workload",
    "owner_of",
    "record_fields",
    "registered",
    "reporting_of",
]
