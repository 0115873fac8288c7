"""Data: readers for the real formats, embedded and synthetic sets, and the pipelines."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.params import ConfigError


@dataclass(frozen=True)
class DataSet:
    title: str       # how the documents name it
    verified: str    # how its files are checked before a run ("" when there are no files to check)


# Every data set the lab reads; the documents list them from here, never by hand.
DATASETS: dict[str, DataSet] = {
    "cifar10": DataSet("CIFAR-10", "fetched from the official URL, md5 of the tarball and of every batch file"),
    "digits": DataSet("the 1,797 UCI handwritten digits embedded in scikit-learn", ""),
    "synthetic": DataSet("synthetic images", ""),
}
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
