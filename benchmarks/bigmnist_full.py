"""bigMNIST at full size once: build, verify, one streamed epoch beside the disk's sequential read.

    python benchmarks/bigmnist_full.py --set /scratch/bigmnist [--source fashion-mnist]

1. Builds the 72 M-sample set with `lab bigmnist build`'s defaults (6 versions x 60,000 images x 200 replicas,
   shards of 320,000) into --set, timed; --no-build uses a set built there before (its build is then not timed).
2. Verifies it (`lab bigmnist verify`: sha256 of every shard against the manifest), timed.
3. Reads every shard sequentially with O_DIRECT (dd iflag=direct: storage, not RAM), then streams one epoch of
   the set as the training pipeline reads it (kernels/data/stream.py, cache=cold: O_DIRECT, records as
   stored), then reads the shards sequentially again: the stream's MB/s beside the reads just before and after.
Writes results/bench/bigmnist-full-<device>.md and .json (with every shard's sha256 from the manifest). It needs
about 57 GB free under --set and a few minutes per pass at a few hundred MB/s.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from bench_io import sequential_mb_s  # noqa: E402
from kernels.base import sysinfo  # noqa: E402
from kernels.data import bigmnist  # noqa: E402
from kernels.data.stream import ShardSet, StreamSource  # noqa: E402

READ_MB = 8  # MiB per read of the sequential passes and the stream (bench_io's default)
STREAM_THREADS = 2  # the stream's reading threads (kernels/data/stream.py); the sequential reads use as many


def timed(cmd: list[str]) -> float:
    """Seconds `cmd` took; its output goes to this script's, so a long build shows its progress."""
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    return time.perf_counter() - t0


def stream_epoch(shards: ShardSet, batch: int) -> tuple[float, int, dict]:
    """(seconds, samples, how it read) of one epoch of bare records, cold (O_DIRECT where the filesystem allows
    it)."""
    import torch

    src = StreamSource(shards, None, batch, 0, 1, 0, torch.device("cpu"), cache="cold", read_mb=READ_MB)
    t0, n, how = time.perf_counter(), 0, src.describe()
    try:
        for i, (x, _) in enumerate(src.batches(0)):
            n += x.shape[0]
            if (i + 1) % 20000 == 0:
                print(f"  streamed {n:,} samples, {n / (time.perf_counter() - t0):,.0f} samples/s", flush=True)
    finally:
        src.close()
    return time.perf_counter() - t0, n, how


def measure(args) -> dict:
    lab = [sys.executable, "-m", "kernels.cli", "bigmnist"]
    build_s = None
    if not args.no_build:
        build_s = timed(lab + ["build", "--out", str(args.set), "--source", args.source, "--data-dir", str(args.data)])
    verify_s = timed(lab + ["verify", str(args.set)])
    d, manifest = bigmnist.load_manifest(args.set)
    shards = ShardSet(d)
    paths = [d / m["name"] for m in manifest["shards"]]
    total = sum(m["bytes"] for m in manifest["shards"])
    threads = STREAM_THREADS  # as many reading threads as the stream has (its describe() says io_threads)
    print(f"sequential read (O_DIRECT, {threads} threads), before the stream", flush=True)
    before = sequential_mb_s(paths, threads, "direct", READ_MB * 2**20)
    print(f"  {before[0]:,.0f} MB/s; streaming one epoch", flush=True)
    stream_s, samples, how = stream_epoch(shards, args.batch)
    if how.get("io_threads") != threads or how.get("cold_reads") != "O_DIRECT":
        raise SystemExit(f"bigmnist_full: the stream read with {how}; the sequential reads do not compare")
    print("sequential read (O_DIRECT), after the stream", flush=True)
    after = sequential_mb_s(paths, threads, "direct", READ_MB * 2**20)
    return {
        "set": str(args.set),
        "samples": samples,
        "shards": len(paths),
        "bytes": total,
        "build_s": build_s,
        "verify_s": verify_s,
        "stream_s": stream_s,
        "stream_mb_s": total / stream_s / 1e6,
        "read_threads": threads,
        "sequential_mb_s": [before[0], after[0]],
        "manifest_sha256": hashlib.sha256((d / "manifest.json").read_bytes()).hexdigest(),
        "spec": manifest["spec"],
        "shard_sha256": {m["name"]: m["sha256"] for m in manifest["shards"] + [manifest["test"]]},
    }


def table(r: dict) -> list[str]:
    gb = r["bytes"] / 1e9
    lines = benchtable.header(f"bigMNIST at full size: build, verify, one streamed epoch ({sysinfo.cpu_device_name()})")
    spec = r["spec"]
    lines += [
        f"{r['samples']:,} samples ({spec['versions']} versions x {spec.get('source_samples') or 60000:,} "
        f"{spec['source']} images x {spec['replicas']} replicas) in {r['shards']} shards, {gb:.1f} GB, in "
        f"{r['set']}. One run of each step; the stream (records as stored, O_DIRECT, batch "
        f"{r.get('batch', 256)}, {r['read_threads']} reading threads) between two sequential O_DIRECT reads of the "
        f"same shards by as many threads. This VM's disk changes speed within minutes, so the stream is set "
        f"beside both reads around it, not one. Checksums: every "
        f"shard's sha256 in the .json beside this table; the manifest's sha256 is {r['manifest_sha256']}.",
        "",
        "| step | seconds | throughput |",
        "|---|---:|---|",
    ]
    if r["build_s"]:
        lines.append(
            f"| build (`lab bigmnist build`, 1 task) | {r['build_s']:,.0f} | {r['samples'] / r['build_s']:,.0f} "
            f"samples/s, {r['bytes'] / r['build_s'] / 1e6:,.0f} MB/s written |"
        )
    seq = r["sequential_mb_s"]
    lines += [
        f"| verify (`lab bigmnist verify`, sha256) | {r['verify_s']:,.0f} | "
        f"{r['bytes'] / r['verify_s'] / 1e6:,.0f} MB/s |",
        f"| sequential read before | {r['bytes'] / seq[0] / 1e6:,.0f} | {seq[0]:,.0f} MB/s |",
        f"| one streamed epoch | {r['stream_s']:,.0f} | {r['samples'] / r['stream_s']:,.0f} samples/s, "
        f"{r['stream_mb_s']:,.0f} MB/s: {r['stream_mb_s'] / seq[0]:.2f} and {r['stream_mb_s'] / seq[1]:.2f} of the "
        f"reads before and after |",
        f"| sequential read after | {r['bytes'] / seq[1] / 1e6:,.0f} | {seq[1]:,.0f} MB/s |",
    ]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", type=Path, required=True, help="where the full set goes (about 57 GB)")
    ap.add_argument("--source", default="mnist", help="mnist or fashion-mnist (the same shape and size)")
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="data root holding the source")
    ap.add_argument("--no-build", action="store_true", help="use the set already built in --set")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    if not args.no_build:
        free = shutil.disk_usage(args.set.parent if not args.set.exists() else args.set).free
        if free < 60e9:
            raise SystemExit(f"bigmnist_full: {free / 1e9:.0f} GB free at {args.set}; the full set needs about 57 GB")
    r = measure(args)
    r["batch"] = args.batch
    lines = table(r)
    benchtable.write(lines, args.out, sysinfo.cpu_device_name(), prefix="bigmnist-full-", record=r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
