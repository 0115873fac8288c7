"""Data: readers for the real formats, embedded and synthetic sets, and the pipelines."""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.params import ConfigError

NUM_CLASSES = {"cifar10": 10, "digits": 10, "synthetic": 10}


def check_dataset(name: str, root: Path) -> None:
    """Cheap presence/integrity check before any work; raises ConfigError with the fix."""
    if name == "cifar10":
        from kernels.data import cifar10

        cifar10.verify(root)
    elif name == "digits":
        from kernels.data.embedded import digits_csv

        digits_csv()
    elif name != "synthetic":
        raise ConfigError(f"parameter 'dataset': unknown dataset '{name}'")


def load_image_dataset(name: str, root: Path, samples: int = 0):
    """(train Split, test Split, num_classes) as uint8 NCHW tensors on the CPU.

    `samples` bounds the synthetic set's train size so small runs do not
    generate 150 MB of noise; the real sets are always read whole.
    """
    from kernels.workloads.base import Split

    if name == "cifar10":
        from kernels.data import cifar10

        arrays = cifar10.read(root, check=False)  # verified by check_dataset before the run
    elif name == "digits":
        from kernels.data.embedded import load_digits

        arrays = load_digits()
    elif name == "synthetic":
        from kernels.data.embedded import make_synthetic

        n = 50_000 if not samples else min(samples, 50_000)
        arrays = make_synthetic(n_train=n, n_test=min(10_000, max(n // 5, 1)))
    else:
        raise ConfigError(f"parameter 'dataset': unknown dataset '{name}'")
    splits = [Split(torch.from_numpy(x), torch.from_numpy(y)) for x, y in (arrays["train"], arrays["test"])]
    return splits[0], splits[1], NUM_CLASSES[name]
