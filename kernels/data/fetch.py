"""Fetch and verify a data set: `lab fetch cifar10|mnist|fashion-mnist|metr-la|pems-bay [--root data] [--from DIR]`.

Downloads from the official URLs (or, for CIFAR-10, --url: a mirror or a file://
path), checks the checksums (METR-LA and PEMS-BAY: the structure of both files and that
they agree, with their sha256 recorded; their .h5 files need a browser to download, so
`--from DIR`), and leaves the files where runs look for them; a run
re-verifies them before any work. On a machine without network: --from DIR copies
the official files from a directory (MNIST, Fashion-MNIST; e.g. Debian's
dataset-fashion-mnist package installs them in /usr/share/datasets/fashion-mnist),
or copy the CIFAR-10 tarball into <root>/cifar10/ and run the same command.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT

FETCHABLE = ("cifar10", "mnist", "fashion-mnist", "metr-la", "pems-bay")


def check_cifar_options(dataset: str, url: str | None, md5: str | None) -> None:
    """--url and --md5 belong to CIFAR-10 (the others have their own sources and checksums): given for another
    set they were ignored without a word; a URL urllib cannot open was a ValueError traceback."""
    for option, value in (("--url", url), ("--md5", md5)):
        if value is not None and dataset != "cifar10":
            raise ConfigError(f"{option}: only CIFAR-10 takes it; {dataset} comes from its official files (or --from)")
    if url is not None and not re.match(r"(https?|ftp|file)://", url):
        raise ConfigError(f"--url: {url!r} is not a URL; give https://..., or file:///path/cifar-10-python.tar.gz")
    if md5 is not None and not re.fullmatch(r"[0-9a-fA-F]{32}", md5):
        raise ConfigError(f"--md5: {md5!r} is not an md5 (32 hex digits)")


def main(argv=None) -> int:
    from kernels.data import cifar10, mnist, traffic

    p = argparse.ArgumentParser(prog="lab fetch", description=__doc__.split("\n")[0])
    p.add_argument("dataset", choices=FETCHABLE, help="data set to fetch (digits and synthetic need none)")
    p.add_argument("--root", type=Path, default=PROJECT_ROOT / "data", help="data root (default: <project>/data)")
    p.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        default=None,
        help="MNIST, Fashion-MNIST: copy the four official files from this directory instead of "
        "downloading (verified before they are copied); METR-LA, PEMS-BAY: the directory holding "
        "the .h5 and adj_mx .pkl files of the original repository",
    )
    p.add_argument("--url", default=None, help="CIFAR-10: download URL (default: the official one)")
    p.add_argument("--md5", default=None, help="CIFAR-10: expected md5 of the tarball (32 hex digits)")
    p.add_argument("--force", action="store_true", help="fetch and verify again even if present")
    a = p.parse_args(argv)

    def body() -> None:
        check_cifar_options(a.dataset, a.url, a.md5)
        if a.dataset == "cifar10":
            if a.from_dir is not None:
                raise ConfigError("--from: for CIFAR-10 copy the official tarball into <root>/cifar10/ instead")
            cifar10.fetch(a.root, url=a.url or cifar10.URL, md5=(a.md5 or cifar10.TARBALL_MD5).lower(), force=a.force)
            d = cifar10.verify(a.root)  # a mirror's tarball (--md5) too: its files must be the official ones
        elif a.dataset in traffic.SETS:
            d = traffic.fetch(a.dataset, a.root, from_dir=a.from_dir, force=a.force)
        else:
            d = mnist.fetch(a.dataset, a.root, from_dir=a.from_dir, force=a.force)
        print(f"{a.dataset} ready and verified: {d}")

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
