"""Input pipelines for (big)MNIST, one rank, data only: `make bench` or `python benchmarks/bench_io.py`.

Samples/s of normalised 1x28x28 batches delivered on the device, no model, for:
  1. the seed study's per-sample DataLoader over the shards (one __getitem__ per image,
     PIL conversion, --workers worker processes, pin_memory on CUDA);
  2. the streamed shards, warm (the page cache may serve re-reads) and cold (O_DIRECT, or
     every byte range evicted where that is refused: storage, not RAM), normalised and as
     bare records (uint8, no decoding: the stream's I/O path alone);
  3. MNIST resident on the device (the in-memory reference).
All in one process, side by side, each a median over --repeats passes after a warm-up pass;
the spread is the min-max of the passes. The streamed-vs-per-sample ratio is of medians
taken in this one run. The set is built once into --set (default: a temporary directory)
from MNIST or Fashion-MNIST under data/, fetched first when neither is there (Debian's
Fashion-MNIST where installed, else MNIST's mirrors); --set DIR reuses a built one.
Beside them, the same shard files read sequentially (dd-like: through the page cache, evicted,
and with O_DIRECT; one and two threads) give the physical limit and the CPU time the reads cost;
each stream pass follows the sequential reads of its round, and its MB/s is printed as a
fraction of the fastest of them (paired, because a shared disk's speed drifts within minutes).
The table is printed and written to results/bench/io-<device>.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.base import sysinfo  # noqa: E402

import benchtable  # noqa: E402  (benchmarks/, this script's directory)
from kernels.data import bigmnist, mnist  # noqa: E402
from kernels.data.pipeline import ImageTransform, Split, TensorSource  # noqa: E402
from kernels.data.stream import PerSampleSource, ShardSet, StreamSource  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def one_pass(batches, device, max_steps: int) -> float:
    """samples/s of one pass of at most max_steps batches."""
    sync(device)
    t0, n = time.perf_counter(), 0
    for i, (x, _) in enumerate(batches):
        n += x.shape[0]
        if i + 1 >= max_steps:
            break
    sync(device)
    return n / (time.perf_counter() - t0)


def timed_passes(make_iter, device, repeats: int, max_steps: int) -> list[float]:
    """samples/s of `repeats` passes (after one warm-up pass) of at most max_steps batches each."""
    return [one_pass(make_iter(r), device, max_steps) for r in range(repeats + 1)][1:]


DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


def prepare_source(data: Path) -> str:
    """The source set under `data`: MNIST or Fashion-MNIST when one is there and verifies; else fetched now, so that
    `make bench` runs on a fresh clone: Debian's Fashion-MNIST where the package is installed (copied and
    verified, as `lab fetch fashion-mnist --from` does), else MNIST from its official mirrors (`lab fetch mnist`)."""
    for name in ("mnist", "fashion-mnist"):
        try:
            mnist.verify(name, data)
            return name
        except Exception:  # noqa: BLE001 - try the next
            continue
    if DEBIAN_FASHION.is_dir():
        print(
            f"no MNIST under {data}: copying Debian's Fashion-MNIST from {DEBIAN_FASHION} "
            f"(lab fetch fashion-mnist --from {DEBIAN_FASHION})",
            flush=True,
        )
        mnist.fetch("fashion-mnist", data, from_dir=DEBIAN_FASHION)
        return "fashion-mnist"
    print(f"no MNIST under {data} and no Debian Fashion-MNIST: downloading MNIST (lab fetch mnist)", flush=True)
    try:
        mnist.fetch("mnist", data)
    except Exception as e:  # noqa: BLE001 - one line naming both ways, not a traceback
        raise SystemExit(
            f"error: no MNIST or Fashion-MNIST under {data}, and MNIST could not be downloaded ({e}); "
            f"`apt-get install dataset-fashion-mnist` (Debian) or `lab fetch mnist` where its mirrors "
            f"are reachable, then run again"
        ) from None
    return "mnist"


READS = {"warm": "page cache", "cold": "page cache, evicted", "direct": "O_DIRECT"}


def sequential_mb_s(paths: list[Path], threads: int, mode: str, block: int) -> tuple[float, float]:
    """(MB/s, CPU ms per MB) of a plain sequential read of every file in `block`-byte reads (dd-like) by `threads`
    threads, each taking whole files in turn. mode: warm (the page cache may serve them), cold (each file evicted
    from the page cache before and after it is read, posix_fadvise DONTNEED, as the stream does where O_DIRECT is
    refused) or direct (O_DIRECT, as the cold stream reads: dd iflag=direct). The CPU time is the process's (user +
    kernel), which on a VM is mostly the kernel's copy and virtio work for the reads."""
    import mmap
    import resource
    import threading

    todo, lock, total = list(paths), threading.Lock(), [0]
    flags = os.O_RDONLY | (os.O_DIRECT if mode == "direct" else 0)

    def reader():
        mv = memoryview(mmap.mmap(-1, block))  # page-aligned, as O_DIRECT needs
        while True:
            with lock:
                if not todo:
                    return
                path = todo.pop(0)
            fd = os.open(path, flags)
            try:
                if mode == "cold":
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                off = 0
                while (n := os.preadv(fd, [mv], off)) > 0:
                    off += n
                    if n < block:  # the end of the file (a direct read may not start at an unaligned offset)
                        break
                if mode == "cold":
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            with lock:
                total[0] += off

    workers = [threading.Thread(target=reader) for _ in range(threads)]
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return total[0] / wall / 1e6, 1e3 * cpu / (total[0] / 1e6)


def stream_and_disk(shards, transform, args, device) -> tuple[dict, dict]:
    """The stream (normalised and as bare records) and the same files read sequentially, warm then cold, in
    alternating passes: round r reads the disk every way, then streams epoch r both ways, so that each round's
    stream / sequential ratio is taken side by side on a disk whose speed drifts (a shared VM's moves by 30 % within
    minutes). Round 0 is the warm-up. Returns ({stream key: samples/s per round}, {(mode, threads): [(MB/s, CPU ms
    per MB) per round]}), the sources' counters under stream key + " counters"."""
    threads = (1, max(2, min(4, os.cpu_count() or 1)))
    steps = shards.num_samples // args.batch
    rates, seq = {}, {}
    for cache, modes in (("warm", ("warm",)), ("cold", ("cold", "direct"))):
        srcs = {
            key: StreamSource(
                shards, tf, args.batch, 0, 1, 0, device, cache=cache, window_mb=args.window_mb, read_mb=args.read_mb
            )
            for key, tf in ((cache, transform), (f"{cache} records", None))
        }
        for r in range(args.repeats + 1):
            for mode in modes:
                for t in threads:
                    got = sequential_mb_s(shards.paths, t, mode, int(args.read_mb * 2**20))
                    if r:
                        seq.setdefault((mode, t), []).append(got)
            got = {key: one_pass(s.batches(r), device, steps) for key, s in srcs.items()}
            for key, v in got.items():
                if r:
                    rates.setdefault(key, []).append(v)
            print(
                f"  round {r}{' (warm-up)' if not r else ''}: "
                + ", ".join(f"streamed {key} {v:,.0f} samples/s" for key, v in got.items()),
                flush=True,
            )
        for key, s in srcs.items():
            rates[f"{key} counters"] = dict(s.counters, describe=s.describe())
            s.close()
    return rates, seq


def disk_rows(shards, rates: dict, seq: dict, repeats: int, read_mb: float) -> tuple[list[str], dict]:
    """The physical limit beside the stream: the same shard files read sequentially every way (median of `repeats`
    rounds after a warm-up), with the reads' CPU cost; then the stream's delivered MB/s as a fraction of the fastest
    sequential read of its own round (paired), as records (the I/O path) and normalised (what training gets, where
    decoding shares the CPU with the reads)."""
    per_sample = shards.data_bytes / shards.num_samples
    threads = sorted({t for _, t in seq})
    lines = [
        "",
        f"The same {len(shards.paths)} shard files read sequentially in {read_mb:g} MiB reads (dd-like, no "
        f"decoding), median of {repeats} rounds after a warm-up, with the CPU time those reads cost:",
        "",
        "| reads | " + " | ".join(f"{t} thread{'s' * (t > 1)} (MB/s)" for t in threads) + " | CPU ms per MB |",
        "|---|" + "---:|" * (len(threads) + 1),
    ]
    for mode in dict.fromkeys(m for m, _ in seq):
        med = [statistics.median(p[0] for p in seq[(mode, t)]) for t in threads]
        cpu = statistics.median(p[1] for p in seq[(mode, threads[med.index(max(med))])])
        lines.append(f"| {READS[mode]} | " + " | ".join(f"{m:,.0f}" for m in med) + f" | {cpu:.2f} |")
    lines += [
        "",
        f"The stream beside the fastest sequential read of the same round (paired; median of {repeats} "
        "rounds "
        f"and the min-max of the round ratios); its MB/s is samples/s times {per_sample:,.0f} bytes per "
        "sample, as records (uint8, no decoding) and as normalised float batches.",
        "",
        "| cache | sequential (MB/s) | streamed records "
        "(MB/s) | records / sequential | streamed, normalised (MB/s) "
        "| normalised / sequential |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    figures = {}
    for cache, modes in (("warm", ("warm",)), ("cold", ("cold", "direct"))):
        limit = [max(seq[(m, t)][r][0] for m in modes for t in threads) for r in range(repeats)]
        f = figures[cache] = {"sequential_mb_s": statistics.median(limit)}
        cells = []
        for kind, key in (("records", f"{cache} records"), ("normalised", cache)):
            mb = [x * per_sample / 1e6 for x in rates[key]]
            pct = [100 * m / lim for m, lim in zip(mb, limit)]
            f[f"{kind}_mb_s"], f[f"{kind}_pct"] = statistics.median(mb), statistics.median(pct)
            cells += [f"{f[f'{kind}_mb_s']:,.0f}", f"**{f[f'{kind}_pct']:.0f} %** ({min(pct):.0f}-{max(pct):.0f})"]
        lines.append(f"| {cache} | {f['sequential_mb_s']:,.0f} | " + " | ".join(cells) + " |")
    return lines, figures


def row(label: str, rates: list[float], note: str = "") -> str:
    med = statistics.median(rates)
    return f"| {label} | {med:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | {note} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="data root with mnist/ or fashion-mnist/")
    ap.add_argument("--set", type=Path, default=None, help="a built bigMNIST set to use (default: build one)")
    ap.add_argument("--versions", type=int, default=2)
    ap.add_argument(
        "--replicas",
        type=int,
        default=12,
        help="copies of each version (default 12: 1.44 M samples, 1.1 GB, 17 windows of 64 MiB per epoch, "
        "so that the first window's exposed read is a small part of an epoch, as in a real bigMNIST "
        "epoch of ~840; with 2, its three windows made it up to half of a cold epoch)",
    )
    ap.add_argument("--source-samples", type=int, default=0, help="source images (0: all 60,000)")
    ap.add_argument("--shard-samples", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the per-sample baseline")
    ap.add_argument("--loader-steps", type=int, default=200, help="batches per pass of the per-sample baseline")
    ap.add_argument("--window-mb", type=float, default=64.0)
    ap.add_argument(
        "--read-mb", type=float, default=8.0, help="MiB per read call, of the stream and the sequential reads alike"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    name = sysinfo.device_name(device if device.type == "cpu" else torch.device("cuda", 0))

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        src_name = prepare_source(args.data)
        set_dir = args.set
        if set_dir is None:
            set_dir = Path(tmp) / "bigmnist"
            spec = bigmnist.Spec(
                source=src_name,
                source_samples=args.source_samples,
                versions=args.versions,
                replicas=args.replicas,
                shard_samples=args.shard_samples,
            )
            print(
                f"building a bigMNIST of {args.versions} versions x {args.replicas} replicas into {set_dir} ...",
                flush=True,
            )
            bigmnist.build(set_dir, spec, args.data, device=device, log=lambda s: None)
        shards = ShardSet(set_dir)
        m = shards.manifest
        for path in shards.paths:  # written back to storage: eviction (cache=cold) drops clean pages only
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        print(
            f"set: {shards.num_samples:,} samples in {len(shards.counts)} shards ({shards.data_bytes / 2**20:,.0f} "
            f"MiB); batch {args.batch}; {args.repeats} passes after a warm-up",
            flush=True,
        )
        lines = benchtable.header(f"input pipelines for (big)MNIST on {name}") + [
            f"One rank, data only (no model): normalised batches of {args.batch} on {device.type}. bigMNIST "
            f"here: {m['spec']['versions']} versions x {m['spec']['replicas']} replicas of {m['spec']['source']} "
            f"= {shards.num_samples:,} samples in {len(shards.counts)} shards "
            f"({shards.data_bytes / 2**20:,.0f} MiB). Median of {args.repeats} passes after a warm-up; "
            "spread is min-max.",
            "",
            "| pipeline | samples/s | spread | note |",
            "|---|---:|---:|---|",
        ]
        rates = {}

        loader = PerSampleSource(shards, m["mean"], m["std"], args.batch, 0, 1, 0, device, False, args.workers, 2)
        rates["per-sample"] = timed_passes(lambda r: loader.batches(r), device, args.repeats, args.loader_steps)
        lines.append(
            row(
                f"per-sample DataLoader ({args.workers} workers)",
                rates["per-sample"],
                f"{args.loader_steps} batches per pass",
            )
        )
        print(lines[-1], flush=True)
        loader.close()  # its workers' memory maps would keep the shards in the page cache (cold reads memory)

        t = ImageTransform(mean=(m["mean"],), std=(m["std"],))
        print("streamed shards and sequential reads, in alternating rounds:", flush=True)
        stream, seq = stream_and_disk(shards, t, args, device)
        for cache in ("warm", "cold"):
            for key, label in (
                (cache, f"streamed shards, {cache}"),
                (f"{cache} records", f"streamed records, {cache}, no decoding"),
            ):
                rates[key], c = stream[key], stream[f"{key} counters"]
                how = f"; {c['describe']['cold_reads']}" if cache == "cold" else ""
                lines.append(
                    row(
                        label,
                        rates[key],
                        f"whole epochs of {c['windows'] // (args.repeats + 1)} windows; "
                        f"{c['bytes_read'] / 1e9:.2f} GB read in {c['read_calls']} reads, "
                        f"{c['bytes_read'] / c['read_s'] / 1e6:,.0f} "
                        f"MB/s inside reads (per reader thread){how}",
                    )
                )
                print(lines[-1], flush=True)

        arrays = mnist.read(src_name, args.data)
        train = Split(torch.from_numpy(arrays["train"][0]), torch.from_numpy(arrays["train"][1]))
        res = TensorSource(train, t, args.batch, 0, 1, 0, device, False)
        rates["resident"] = timed_passes(lambda r: res.batches(r), device, args.repeats, len(train) // args.batch)
        lines.append(row(f"{src_name} resident on the device", rates["resident"], "whole epochs"))
        print(lines[-1], flush=True)

        disk, figures = disk_rows(shards, rates, seq, args.repeats, args.read_mb)
        lines += disk
        med = {k: statistics.median(v) for k, v in rates.items()}
        lines += [
            "",
            f"Streamed (warm) over per-sample DataLoader: **{med['warm'] / med['per-sample']:.1f}x**; "
            f"streamed (cold) over per-sample: **{med['cold'] / med['per-sample']:.1f}x**; "
            f"streamed (warm) over device-resident: {med['warm'] / med['resident']:.2f}x.",
            "",
        ]

    path = benchtable.write(lines, args.out, name, prefix="io-")
    benchtable.headline(args.out, "io", name, path, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
