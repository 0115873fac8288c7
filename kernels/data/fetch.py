"""Fetch and verify a data set: `lab fetch cifar10 [--root data]`.

Downloads from the official URL (or --url, e.g. a mirror or a file:// path),
checks the md5, extracts, and records MD5SUMS so later runs can detect a
corrupt file before any work. An existing tarball is reused (copy it into
<root>/cifar10/ on a machine without network).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernels.params import PROJECT_ROOT, ConfigError


def main(argv=None) -> int:
    from kernels.data import cifar10

    p = argparse.ArgumentParser(prog="lab fetch", description=__doc__.split("\n")[0])
    p.add_argument("dataset", choices=["cifar10"], help="data set to fetch (digits and synthetic need none)")
    p.add_argument("--root", type=Path, default=PROJECT_ROOT / "data", help="data root (default: <project>/data)")
    p.add_argument("--url", default=cifar10.URL, help="download URL (default: the official one)")
    p.add_argument("--md5", default=cifar10.TARBALL_MD5, help="expected md5 of the tarball")
    p.add_argument("--force", action="store_true", help="re-extract and re-verify even if present")
    a = p.parse_args(argv)
    try:
        d = cifar10.fetch(a.root, url=a.url, md5=a.md5, force=a.force)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"cifar10 ready and verified: {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
