"""The CUDA lock: constraints-cuda.txt pins everything a CUDA build of torch brings with it.

constraints.txt pins torch==2.13.0 and the lab's other packages. On a GPU cluster that pin
resolves to a CUDA wheel. The wheel's own requirements leave part of the CUDA runtime free:
cuda-bindings, cuda-pathfinder and nvidia-nvjitlink are version ranges, so two installs a
month apart can run different code. constraints-cuda.txt pins them all to one resolution.

    make lock-cuda                     # PyPI's CUDA build (CUDA 13.0 for torch 2.13.0)
    make lock-cuda TORCH_INDEX=https://download.pytorch.org/whl/cu126   # CUDA 12.6, for older drivers
    make setup CUDA=1 [TORCH_INDEX=...]  # install under both locks, then check what got installed

`lock-cuda` asks pip what it would install (`pip install --dry-run --report`, nothing is
installed) and writes that resolution here:

    python tools/lock.py cuda REPORT.json [--index URL] > constraints-cuda.txt
    python tools/lock.py verify constraints-cuda.txt   # the installed versions against the lock
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*$")
CUDA_PACKAGES = re.compile(r"^(nvidia-|cuda-|triton$)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version for every `name==version` line of a constraints file (comments skipped)."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        m = PIN.match(line.split("#")[0].strip())
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def cuda_version(report: dict) -> str | None:
    """The CUDA runtime the resolution installs (nvidia-cuda-runtime[-cuXX]'s major.minor), if any."""
    for item in report["install"]:
        if canonical(item["metadata"]["name"]).startswith("nvidia-cuda-runtime"):
            return ".".join(item["metadata"]["version"].split(".")[:2])
    return None


def from_report(report: dict, index: str = "") -> str:
    """constraints-cuda.txt from pip's installation report of `torch==X` (pip install --dry-run --report)."""
    items = sorted((canonical(i["metadata"]["name"]), i["metadata"]["version"]) for i in report["install"])
    torch = dict(items).get("torch")
    if torch is None:
        raise SystemExit(
            "error: the report installs no torch; make it with "
            "`pip install --dry-run --ignore-installed --report FILE torch==VERSION`"
        )
    cuda = cuda_version(report)
    if cuda is None:
        raise SystemExit(
            f"error: pip resolved torch {torch}, a build without CUDA (a local wheel store or "
            f"find-links in pip's configuration found it first?). Run `make lock-cuda` where PyPI or "
            f"TORCH_INDEX answers, with PIP_CONFIG_FILE=/dev/null to ignore such a configuration"
        )
    head = [
        f"# CUDA lock for torch {torch}: what pip resolved for it from {index or 'PyPI'} (CUDA runtime {cuda}).",
        "# Written by `make lock-cuda` (resolved under constraints.txt); used with it by `make setup CUDA=1`.",
    ]
    return "\n".join(head + [f"{n}=={v}" for n, v in items]) + "\n"


def problems(cuda_lock: Path, base_lock: Path) -> list[str]:
    """Where the CUDA lock disagrees with constraints.txt or leaves torch's CUDA runtime unpinned."""
    cuda, base = read_pins(cuda_lock), read_pins(base_lock)
    out = [
        f"{n}: {cuda_lock.name} pins {v}, {base_lock.name} {base[n]}"
        for n, v in sorted(cuda.items())
        if n in base and v.split("+")[0] != base[n].split("+")[0]
    ]
    if "torch" not in cuda:
        out.append(f"{cuda_lock.name} pins no torch")
    for need in ("triton", "nvidia-nccl", "nvidia-cudnn", "nvidia-cuda-runtime"):
        if not any(n == need or n.startswith(need + "-") for n in cuda):
            out.append(f"{cuda_lock.name} pins no {need}* (a CUDA build brings it)")
    return out


def locked_cuda(lock: Path) -> str | None:
    """The CUDA runtime a lock's header names ("CUDA runtime 13.0"), None for a lock without one."""
    m = re.search(r"\(CUDA runtime (\d+\.\d+)\)", Path(lock).read_text())
    return m.group(1) if m else None


def installed_mismatches(lock: Path) -> list[str]:
    """The lock's packages this environment has at another version (a build label such as +cpu aside; missing
    ones are not counted), and a torch built for another CUDA than the lock's (or for none)."""
    from importlib import metadata

    out = []
    for name, want in sorted(read_pins(lock).items()):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if have.split("+")[0] != want.split("+")[0]:
            out.append(f"{name} {have} installed, {lock.name} pins {want}")
    cuda = locked_cuda(lock)
    if cuda:
        import torch

        built = torch.version.cuda
        if not built or ".".join(built.split(".")[:2]) != cuda:
            out.append(
                f"torch {torch.__version__} is built for CUDA {built or 'none (a CPU build)'}, {lock.name} "
                f"locks CUDA {cuda}: install with `make setup CUDA=1` and the lock's index"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/lock.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cuda", help="write constraints-cuda.txt to stdout from pip's --report JSON")
    c.add_argument("report", type=Path)
    c.add_argument("--index", default="", help="the package index the report resolved from (empty: PyPI)")
    v = sub.add_parser("verify", help="the installed versions against a lock; exit 1 on a difference")
    v.add_argument("lock", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "cuda":
        sys.stdout.write(from_report(json.loads(a.report.read_text()), a.index))
        return 0
    bad = installed_mismatches(a.lock)
    for line in bad:
        print(f"error: {line}", file=sys.stderr)
    if not bad:
        print(f"installed packages match {a.lock}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
