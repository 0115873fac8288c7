"""Data: readers for the real formats, fetch and verification, embedded and synthetic sets, the sources.

DATASETS is the registry of every data set a workload can name: how the
documents call it, how its files are verified before a run, and the command that
fetches it. A workload lists the ones it takes; `check_dataset` runs their check
before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kernels.base.errors import ConfigError


def _check_cifar10(root: Path) -> None:
    from kernels.data import cifar10

    cifar10.verify(root)


def _check_mnist(name: str) -> Callable[[Path], None]:
    def check(root: Path) -> None:
        from kernels.data import mnist

        mnist.verify(name, root)

    return check


def _check_bigmnist(root: Path) -> None:
    from kernels.data import bigmnist

    bigmnist.check(root)


def _check_traffic(name: str) -> Callable[[Path], None]:
    def check(root: Path) -> None:
        from kernels.data import traffic

        traffic.check(name, root)

    return check


def _check_digits(root: Path) -> None:
    from kernels.data.embedded import digits_csv

    digits_csv()


@dataclass(frozen=True)
class DataSet:
    title: str  # how the documents name it
    verified: str  # how its files are checked before a run ("" when no files)
    check: Callable[[Path], None] | None = None  # cheap presence/integrity check before any work
    fetch: str = ""  # the command that fetches it ("" when it needs none)
    num_classes: int = 10
    streamed: bool = False  # read from disk during training (pipeline=stream), not resident
    terms: str = ""  # the terms its publishers set for its use, as the documents state them ("" when none is known)
    train_samples: int = 0  # its training split's size as published (0: it has no fixed size)


# Every data set the lab reads; the documents list them from here, never by hand.
DATASETS: dict[str, DataSet] = {
    "cifar10": DataSet(
        "CIFAR-10",
        "md5 of the official tarball and of every batch file",
        _check_cifar10,
        "lab fetch cifar10",
        terms="published by its authors without a licence file, with the request to cite A. Krizhevsky, Learning "
        "Multiple Layers of Features from Tiny Images, University of Toronto, 2009; the lab fetches it from their "
        "site and never redistributes it",
        train_samples=50_000,
    ),
    "mnist": DataSet(
        "MNIST",
        "sha256 of the four decompressed IDX files, md5 of the official .gz",
        _check_mnist("mnist"),
        "lab fetch mnist",
        train_samples=60_000,
    ),
    "fashion-mnist": DataSet(
        "Fashion-MNIST",
        "sha256 of the four decompressed IDX files",
        _check_mnist("fashion-mnist"),
        "lab fetch fashion-mnist",
        train_samples=60_000,
    ),
    "bigmnist": DataSet(
        "bigMNIST (MNIST augmented and replicated to 72 M samples, in shards)",
        "size and .npy header of every shard against the manifest before a run; sha256 of every "
        "shard with `lab bigmnist verify`",
        _check_bigmnist,
        "lab bigmnist build",
        streamed=True,
    ),
    "digits": DataSet("the 1,797 UCI handwritten digits embedded in scikit-learn", "", _check_digits),
    "metr-la": DataSet(
        "METR-LA (207 Los Angeles traffic sensors)",
        "structure of both files and matching sensors, before a run",
        _check_traffic("metr-la"),
        "lab fetch metr-la --from DIR",
        num_classes=0,
    ),
    "pems-bay": DataSet(
        "PEMS-BAY (325 Bay Area traffic sensors)",
        "as METR-LA",
        _check_traffic("pems-bay"),
        "lab fetch pems-bay --from DIR",
        num_classes=0,
    ),
    "synthetic": DataSet("synthetic images or traffic series", ""),
}


def check_dataset(name: str, root: Path) -> None:
    """Cheap presence/integrity check before any work; raises ConfigError with the fix.

    A data set that is not in the registry belongs to a plug-in workload, which makes it itself.
    """
    if name in DATASETS and DATASETS[name].check is not None:
        DATASETS[name].check(Path(root))


def load_image_dataset(name: str, root: Path, samples: int = 0, size: int = 32, channels: int = 3):
    """(train Split, test Split, num_classes) as uint8 N,C,H,W tensors on the CPU.

    size/channels shape the data sets that have no native shape (digits, synthetic);
    CIFAR-10 is 3x32x32 and (Fashion-)MNIST 1x28x28 as distributed. `samples` bounds
    the synthetic set's train size so small runs do not generate 150 MB of noise; the
    real sets are always read whole.
    """
    from kernels.data.pipeline import Split

    if name == "cifar10":
        from kernels.data import cifar10

        arrays = cifar10.read(root, check=False)  # verified by check_dataset before the run
    elif name in ("mnist", "fashion-mnist"):
        from kernels.data import mnist

        arrays = mnist.read(name, root)
    elif name == "digits":
        from kernels.data.embedded import load_digits

        arrays = load_digits(size, channels)
    elif name == "synthetic":
        from kernels.data.embedded import make_synthetic

        n = 50_000 if not samples else min(samples, 50_000)
        arrays = make_synthetic(n_train=n, n_test=min(10_000, max(n // 5, 1)), shape=(channels, size, size))
    else:
        raise ConfigError(f"parameter 'dataset': {name} is not an image data set")
    import torch

    splits = [Split(torch.from_numpy(x), torch.from_numpy(y)) for x, y in (arrays["train"], arrays["test"])]
    return splits[0], splits[1], DATASETS[name].num_classes
