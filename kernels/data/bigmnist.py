"""bigMNIST: MNIST augmented and replicated to 72,000,000 samples, written as shards for streaming.

The format, the reader's checks (check, verify, load_manifest) and the builder of a range of
shards (build, finish). The command line, which also submits the build as a Slurm job array,
is kernels/slurm/bigmnist_jobs.py (`lab bigmnist build|submit|verify|info`).

What is built (the seed study's bigMNIST, made deterministic):
- the 60,000 training images of MNIST (or Fashion-MNIST, --source) in `versions`
  augmented versions: per image a random rotation, shear, scale, horizontal flip
  (--flip; on by default as in the seed, though a mirrored digit is label noise) and
  an elastic deformation (Simard et al. 2003: a random displacement field per image,
  Gaussian-smoothed with sigma px and scaled by alpha px), all on the device in batches;
- `replicas` copies of those versions x 60,000 augmented images, shuffled by one global
  permutation into shards of `shard_samples` records: 6 x 60,000 x 200 = 72,000,000
  samples, 225 shards of 320,000 by default, 56.5 GB (52.6 GiB) of images plus labels;
- the untouched test split of the source as test.npy.

Determinism: augmentation draws come from a generator seeded by (seed, version, chunk
of 1,024 source images) and the shuffle from a CPU generator seeded by the seed, so the
same seed gives byte-identical shards whatever the number of array tasks (for one
device type and torch version: CPU and CUDA generators differ; the manifest records both).

Format: every shard is a numpy .npy file of fixed-size 785-byte records, dtype
[('image', u1, (28, 28)), ('label', u1)], so a run streams a shard with large sequential
reads and finds sample i at offset header + 785 i. manifest.json holds the counts,
shapes, the normalisation constants and every shard's size and sha256.

Idempotent and resumable: a shard is written to a temporary name, fsynced and renamed,
then its sidecar shard-NNNNN.done (size and sha256) is written; a shard without a
sidecar, or whose sha256 no longer matches, is rebuilt; verified shards are skipped.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kernels.base.errors import ConfigError
from kernels.base import files
from kernels.base.sysinfo import short_of_room

RECORD = np.dtype([("image", np.uint8, (28, 28)), ("label", np.uint8)])
RECORD_BYTES = RECORD.itemsize  # 785
FORMAT = "lab-bigmnist-1"
CHUNK = 1024  # source images per augmentation draw; fixed, so the result does not depend on --batch
MANIFEST = "manifest.json"
MIB = 2**20


@dataclass(frozen=True)
class Spec:
    """What a build makes; every field is in the manifest, and a different value is a different data set."""

    source: str = "mnist"
    source_samples: int = 0  # use the first N training images (0: all 60,000); for small test sets
    versions: int = 6
    replicas: int = 200
    shard_samples: int = 320_000  # 251 MB (239.6 MiB) per shard
    seed: int = 0
    flip: bool = True
    rotate_deg: float = 15.0
    shear_deg: float = 10.0
    scale_min: float = 0.9
    scale_max: float = 1.1
    elastic_sigma: float = 4.0
    elastic_alpha: float = 34.0

    def check(self) -> None:
        for name in ("versions", "replicas", "shard_samples"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(self, name)}")
        if self.source_samples < 0:
            raise ConfigError(f"--source-samples: must be >= 0, got {self.source_samples}")
        if not 0 < self.scale_min <= self.scale_max:
            raise ConfigError(f"--scale-min/--scale-max: need 0 < min <= max, got {self.scale_min}, {self.scale_max}")
        if self.elastic_sigma <= 0 or self.elastic_alpha < 0:
            raise ConfigError("--elastic-sigma must be > 0 and --elastic-alpha >= 0")


# ------------------------------------------------------------------ augmentation
def gaussian_kernel(sigma: float, device=None) -> torch.Tensor:
    """The normalised 1-D Gaussian of `sigma` px, truncated at 4 sigma."""
    r = max(1, int(math.ceil(4 * sigma)))
    t = torch.arange(-r, r + 1, dtype=torch.float32, device=device)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return k / k.sum()


def displacement_fields(noise: torch.Tensor, sigma: float, alpha: float) -> torch.Tensor:
    """Simard's elastic field: uniform(-1, 1) noise (B, 2, H, W), smoothed by a Gaussian of `sigma` px
    (separable, reflecting at the border), times `alpha`: displacements in pixels, one field per image."""
    k = gaussian_kernel(sigma, noise.device)
    r = k.numel() // 2
    b, c, h, w = noise.shape
    x = noise.reshape(b * c, 1, h, w)
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect" if r < w else "replicate"), k.view(1, 1, 1, -1))
    x = F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect" if r < h else "replicate"), k.view(1, 1, -1, 1))
    return alpha * x.reshape(b, c, h, w)


def expected_rms_displacement(sigma: float, alpha: float) -> float:
    """RMS of one component of an interior displacement: alpha * std(U(-1,1)) * ||k2d||_2."""
    k = gaussian_kernel(sigma).double()
    return alpha * (1 / math.sqrt(3)) * float((k**2).sum())


def augment(images: torch.Tensor, spec: Spec, g: torch.Generator) -> torch.Tensor:
    """One augmented version of a uint8 batch (B, 28, 28) on its device, drawing from `g` in a fixed order."""
    b, h, w = images.shape
    dev = images.device
    u = lambda lo, hi: lo + (hi - lo) * torch.rand(b, generator=g, device=dev)  # noqa: E731
    angle = torch.deg2rad(u(-spec.rotate_deg, spec.rotate_deg))
    shear = torch.tan(torch.deg2rad(u(-spec.shear_deg, spec.shear_deg)))
    scale = u(spec.scale_min, spec.scale_max)
    flip = torch.rand(b, generator=g, device=dev) < 0.5
    noise = torch.rand((b, 2, h, w), generator=g, device=dev) * 2 - 1
    if not spec.flip:
        flip = torch.zeros_like(flip)
    disp = displacement_fields(noise, spec.elastic_sigma, spec.elastic_alpha) if spec.elastic_alpha else noise * 0
    # output pixel p (centred pixel coordinates) samples the source at A (p + d(p)): the elastic field
    # displaces the output grid, then the inverse affine map (rotation, shear, scale, flip) takes it to the source.
    ys, xs = torch.meshgrid(
        torch.arange(h, device=dev, dtype=torch.float32) - (h - 1) / 2,
        torch.arange(w, device=dev, dtype=torch.float32) - (w - 1) / 2,
        indexing="ij",
    )
    px = xs[None] + disp[:, 0]
    py = ys[None] + disp[:, 1]
    cos, sin = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
    inv_s = (1 / scale)[:, None, None]
    qx = (cos * px + sin * py) * inv_s
    qy = (-sin * px + cos * py) * inv_s
    qx = qx + shear[:, None, None] * qy
    qx = torch.where(flip[:, None, None], -qx, qx)
    grid = torch.stack([(2 * (qx + (w - 1) / 2) + 1) / w - 1, (2 * (qy + (h - 1) / 2) + 1) / h - 1], dim=-1)
    out = F.grid_sample(images[:, None].float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out[:, 0].round_().clamp_(0, 255).to(torch.uint8)


def _chunk_generator(spec: Spec, version: int, chunk: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(((spec.seed * 1_000_003 + version) * 1_000_033 + chunk) % 2**63)


def augmented_set(
    x: np.ndarray, y: np.ndarray, spec: Spec, device: torch.device, progress=None
) -> tuple[np.ndarray, np.ndarray]:
    """All versions x N augmented images (uint8 V*N, 28, 28) and their labels, version-major."""
    n = len(x)
    out = np.empty((spec.versions * n, 28, 28), dtype=np.uint8)
    src = torch.from_numpy(x).to(device)
    for v in range(spec.versions):
        for c in range(math.ceil(n / CHUNK)):
            lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
            out[v * n + lo : v * n + hi] = augment(src[lo:hi], spec, _chunk_generator(spec, v, c, device)).cpu().numpy()
        if progress:
            progress(v + 1)
    return out, np.tile(y, spec.versions)


def global_permutation(total: int, seed: int) -> torch.Tensor:
    """The one permutation of all samples (int64, on the CPU): sample j of the set is replica-copy perm[j]."""
    return torch.randperm(total, generator=torch.Generator().manual_seed(seed * 7_919 + 13))


# ------------------------------------------------------------------ shards
def shard_name(i: int) -> str:
    return f"shard-{i:05d}.npy"


def npy_header(n: int) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(RECORD), "fortran_order": False, "shape": (n,)}
    )
    return buf.getvalue()


def shard_bytes(n: int) -> int:
    return len(npy_header(n)) + n * RECORD_BYTES


def read_header(path: Path) -> tuple[int, int]:
    """(records, data offset) of a shard; ConfigError naming the file when it is not one."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except (OSError, ValueError) as e:
        raise ConfigError(f"bigmnist: {path} is not a readable shard ({e}); rebuild it with `lab bigmnist build`")
    if dtype != RECORD or fortran or len(shape) != 1:
        raise ConfigError(f"bigmnist: {path} holds {dtype} {shape}, not 785-byte records; rebuild the set")
    return shape[0], offset


def sha256_file(path: Path, chunk: int = 16 * MIB) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_records(path: Path, images: np.ndarray, labels: np.ndarray) -> dict:
    """Write one shard atomically (temporary name, fsync, rename); return its size and sha256."""
    rec = np.empty(len(labels), dtype=RECORD)
    rec["image"], rec["label"] = images, labels
    head = npy_header(len(rec))
    body = rec.view(np.uint8).reshape(-1)
    h = hashlib.sha256(head)
    h.update(body)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with files.create(tmp, "wb") as f:
            f.write(head)
            f.write(memoryview(body))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"name": path.name, "samples": int(len(rec)), "bytes": len(head) + body.nbytes, "sha256": h.hexdigest()}


def _write_json(path: Path, obj) -> None:
    from kernels.base.files import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())


@dataclass
class Layout:
    total: int
    shards: int
    augmented: int

    @classmethod
    def of(cls, spec: Spec, source_n: int) -> "Layout":
        augmented = spec.versions * source_n
        total = augmented * spec.replicas
        return cls(total, math.ceil(total / spec.shard_samples), augmented)

    def shard_range(self, spec: Spec, i: int) -> tuple[int, int]:
        return i * spec.shard_samples, min(self.total, (i + 1) * spec.shard_samples)


def task_shards(shards: int, task: int, tasks: int) -> range:
    """Array task `task` of `tasks` builds a contiguous range of shards."""
    return range(task * shards // tasks, (task + 1) * shards // tasks)


def _done_path(out: Path, i: int) -> Path:
    return out / f"shard-{i:05d}.done"


def _complete(path: Path, done: Path, expect_samples: int, check_sha: bool) -> bool:
    """A written file with its sidecar: the sidecar's count and size match, and (check_sha) its sha256."""
    if not done.is_file() or not path.is_file():
        return False
    try:
        meta = json.loads(done.read_text())
    except ValueError:
        return False
    if meta.get("samples") != expect_samples or path.stat().st_size != meta.get("bytes"):
        return False
    return not check_sha or sha256_file(path) == meta.get("sha256")


def shard_is_complete(out: Path, i: int, expect_samples: int, check_sha: bool = True) -> bool:
    return _complete(out / shard_name(i), _done_path(out, i), expect_samples, check_sha)


def _source_arrays(spec: Spec, data_root: Path):
    from kernels.data import mnist

    mnist.verify(spec.source, data_root)
    arrays = mnist.read(spec.source, data_root)
    x, y = arrays["train"]
    if spec.source_samples:
        if spec.source_samples > len(x):
            raise ConfigError(
                f"--source-samples: {spec.source} has {len(x)} training images, asked for {spec.source_samples}"
            )
        x, y = x[: spec.source_samples], y[: spec.source_samples]
    return x[:, 0], y.astype(np.uint8), arrays["test"][0][:, 0], arrays["test"][1].astype(np.uint8)


def human_bytes(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / MIB:.1f} MiB"


def build(
    out: Path, spec: Spec, data_root: Path, task: int = 0, tasks: int = 1, device: torch.device | None = None, log=print
) -> dict:
    """Build this task's shards (all of them with tasks=1); write the manifest when every shard is done.

    Returns a summary: shards built and skipped, samples and bytes written, rates.
    """
    spec.check()
    if not 0 <= task < tasks:
        raise ConfigError(f"--task: {task} is not in 0..{tasks - 1} (--tasks {tasks})")
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(out)
    spec_file = out / ".build-spec.json"
    if spec_file.exists():
        old = json.loads(spec_file.read_text())
        if old != asdict(spec):
            raise ConfigError(
                f"--out: {out} holds a bigMNIST built with other parameters "
                f"({_spec_diff(old, asdict(spec))}); pass the same parameters to finish or repair "
                f"it, choose another --out, or delete that set"
            )
    xs, ys, xt, yt = _source_arrays(spec, data_root)
    lay = Layout.of(spec, len(xs))
    mine = task_shards(lay.shards, task, tasks)
    if out.is_dir():  # what a killed attempt of this task left half-written (this task owns these shards)
        for tmp in out.glob(".shard-*.npy.tmp-*"):
            if int(tmp.name[len(".shard-") :].split(".")[0]) in mine:
                tmp.unlink(missing_ok=True)
    todo = [i for i in mine if not shard_is_complete(out, i, _count(lay, spec, i))] if out.is_dir() else list(mine)
    skipped = len(mine) - len(todo)
    _check_space(out, spec, lay, todo, task, len(yt))
    full = shard_bytes(spec.shard_samples)
    out.mkdir(parents=True, exist_ok=True)
    if not spec_file.exists():
        _write_json(spec_file, asdict(spec))  # every task writes the same bytes
    total_bytes = (lay.shards - 1) * full + shard_bytes(_count(lay, spec, lay.shards - 1))
    log(
        f"bigmnist: {lay.total:,} samples ({spec.versions} versions x {len(xs):,} {spec.source} images x "
        f"{spec.replicas} replicas) in {lay.shards} shards, {human_bytes(total_bytes)}; "
        f"task {task}/{tasks}: shards {mine.start}-{mine.stop - 1}, {len(todo)} to build, {skipped} "
        "verified and skipped; "
        f"device {device.type}"
    )
    t0 = time.perf_counter()
    written_samples = written_bytes = 0
    if todo:
        written_samples, written_bytes = _write_shards(out, spec, lay, todo, xs, ys, device, log, t0)
    if task == 0 and not _complete(out / "test.npy", out / "test.done", len(yt), check_sha=False):
        meta = write_records(out / "test.npy", xt, yt)
        _write_json(out / "test.done", meta)
    dt = time.perf_counter() - t0
    log(
        f"bigmnist: task {task}/{tasks} done in {dt:.1f} s: {written_samples:,} samples, {human_bytes(written_bytes)} "
        f"written ({written_samples / dt if dt else 0:,.0f} samples/s, {written_bytes / MIB / dt if dt else 0:,.1f} "
        "MiB/s)"
    )
    manifest = finish(out, spec, lay, len(yt), device)
    log(
        f"bigmnist: manifest written: {out / MANIFEST}"
        if manifest
        else "bigmnist: other tasks' shards are not all done yet; the last task to finish writes the manifest"
    )
    return {
        "task": task,
        "tasks": tasks,
        "built": len(todo),
        "skipped": skipped,
        "samples": written_samples,
        "bytes": written_bytes,
        "seconds": dt,
        "manifest": bool(manifest),
    }


def _check_space(out: Path, spec: Spec, lay: Layout, todo: list[int], task: int, test_samples: int) -> None:
    """Refuse a build whose shards (and task 0's test set) do not fit the free space of `out`."""
    full = shard_bytes(spec.shard_samples)
    need = sum(
        full if _count(lay, spec, i) == spec.shard_samples else shard_bytes(_count(lay, spec, i)) for i in todo
    ) + (shard_bytes(test_samples) if task == 0 else 0)
    short = short_of_room(out, need)
    if short:
        _, has, needs = short
        raise ConfigError(
            f"--out: {out} has {has} free but this build needs {needs} "
            f"({len(todo)} shards of up to {human_bytes(shard_bytes(spec.shard_samples))}); free space, "
            f"choose another --out, or build fewer --replicas"
        )


def _write_shards(out: Path, spec: Spec, lay: Layout, todo: list[int], xs, ys, device, log, t0: float):
    """Augment the source on `device`, write the shards in `todo` with their done-marks and the set's pixel
    statistics; (samples, bytes) written."""
    written_samples = written_bytes = 0
    aug_x, aug_y = augmented_set(
        xs,
        ys,
        spec,
        device,
        progress=lambda v: log(f"  augmented version {v}/{spec.versions} ({time.perf_counter() - t0:.1f} s)"),
    )
    perm = global_permutation(lay.total, spec.seed)
    t_write = time.perf_counter()
    for k, i in enumerate(todo):
        lo, hi = lay.shard_range(spec, i)
        src = (perm[lo:hi] % lay.augmented).numpy()
        meta = write_records(out / shard_name(i), aug_x[src], aug_y[src])
        _write_json(_done_path(out, i), meta)
        written_samples += meta["samples"]
        written_bytes += meta["bytes"]
        el = time.perf_counter() - t_write
        eta = el / (k + 1) * (len(todo) - k - 1)
        log(
            f"  shard {i} written ({k + 1}/{len(todo)}): {meta['samples']:,} samples, "
            f"{human_bytes(meta['bytes'])}; "
            f"{written_bytes / MIB / el:,.0f} MiB/s, eta {eta:.0f} s"
        )
    stats = {"mean": float(aug_x.mean(dtype=np.float64) / 255), "std": float(aug_x.std(dtype=np.float64) / 255)}
    _write_json(out / ".build-stats.json", stats)
    return written_samples, written_bytes


def _count(lay: Layout, spec: Spec, i: int) -> int:
    lo, hi = lay.shard_range(spec, i)
    return hi - lo


def _spec_diff(a: dict, b: dict) -> str:
    return ", ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in b if a.get(k) != b.get(k)) or "another format"


def finish(out: Path, spec: Spec, lay: Layout, test_n: int, device: torch.device) -> dict | None:
    """Write manifest.json once every shard and the test split have their sidecar; None until then."""
    metas = []
    for i in range(lay.shards):
        done = _done_path(out, i)
        if not done.is_file():
            return None
        metas.append(json.loads(done.read_text()))
    if not (out / "test.done").is_file() or not (out / ".build-stats.json").is_file():
        return None
    stats = json.loads((out / ".build-stats.json").read_text())
    manifest = {
        "format": FORMAT,
        "spec": asdict(spec),
        "samples": lay.total,
        "augmented_images": lay.augmented,
        "record_bytes": RECORD_BYTES,
        "record_dtype": str(RECORD.descr),
        "image_shape": [1, 28, 28],
        "num_classes": 10,
        "mean": stats["mean"],
        "std": stats["std"],
        "bytes": sum(m["bytes"] for m in metas),
        "shards": metas,
        "test": json.loads((out / "test.done").read_text()),
        "built_with": {"device_type": device.type, "torch": torch.__version__, "numpy": np.__version__},
    }
    _write_json(out / MANIFEST, manifest)
    return manifest


# ------------------------------------------------------------------ reading a built set
def resolve(data_dir: Path) -> Path:
    """The set's directory: data_dir itself when it holds a manifest, else data_dir/bigmnist."""
    data_dir = Path(data_dir)
    return data_dir if (data_dir / MANIFEST).is_file() else data_dir / "bigmnist"


def load_manifest(data_dir: Path) -> tuple[Path, dict]:
    d = resolve(data_dir)
    path = d / MANIFEST
    if not path.is_file():
        raise ConfigError(
            f"dataset 'bigmnist': {path} not found: {Path(data_dir)} is not a built bigMNIST set. "
            f"Build one with `lab bigmnist build --out {d}` (or `lab bigmnist submit` as a job array), "
            f"or pass data_dir=<a built set>"
        )
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(
            f"dataset 'bigmnist': {path} is not valid JSON ({e}); rebuild with "
            f"`lab bigmnist build --out {d}` (finished shards are kept)"
        )
    if not isinstance(manifest, dict):
        raise ConfigError(
            f"dataset 'bigmnist': {path} holds a JSON {type(manifest).__name__}, not a manifest; rebuild with "
            f"`lab bigmnist build --out {d}` (finished shards are kept)"
        )
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"dataset 'bigmnist': {path} has format {manifest.get('format')!r}, this lab reads {FORMAT}")
    why = _manifest_fault(manifest)
    if why:
        raise ConfigError(
            f"dataset 'bigmnist': {path} {why}; the manifest is damaged or not the lab's: rebuild with "
            f"`lab bigmnist build --out {d}` (finished shards are kept)"
        )
    return d, manifest


def _manifest_fault(manifest: dict) -> str | None:
    """What a manifest lacks that the readers use, or None: its keys, and each file entry a plain name in the set's
    folder (never a path out of it) with its size, count and sha256."""
    missing = [k for k in ("spec", "mean", "std", "num_classes", "record_bytes", "shards", "test") if k not in manifest]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not isinstance(manifest["shards"], list) or not manifest["shards"]:
        return "lists no shards"
    for meta in [*manifest["shards"], manifest["test"]]:
        if not isinstance(meta, dict) or not all(k in meta for k in ("name", "samples", "bytes", "sha256")):
            return f"has a file entry without its name, samples, bytes and sha256: {str(meta)[:80]}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(meta["name"])) or meta["name"] in (".", ".."):
            return f"names a file {meta['name']!r} that is not a plain name in the set's folder"
    return None


def check(data_dir: Path) -> tuple[Path, dict, list[int]]:
    """Cheap check before a run: every shard present with the manifest's size and a record header.

    Returns the set's directory, its manifest and each training shard's data offset (from its header).
    """
    d, manifest = load_manifest(data_dir)
    offsets = []
    for meta in manifest["shards"] + [manifest["test"]]:
        path = d / meta["name"]
        if not path.is_file():
            raise ConfigError(
                f"dataset 'bigmnist': {path} is missing (the manifest lists it); rebuild with "
                f"`lab bigmnist build --out {d}` using the manifest's parameters"
            )
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise ConfigError(
                f"dataset 'bigmnist': {path} has {size:,} bytes, the manifest says {meta['bytes']:,}; "
                f"the shard is truncated or replaced. Check with `lab bigmnist verify {d}` "
                "and rebuild it"
            )
        n, offset = read_header(path)
        if n != meta["samples"]:
            raise ConfigError(f"dataset 'bigmnist': {path} holds {n} records, the manifest says {meta['samples']}")
        offsets.append(offset)
    return d, manifest, offsets[:-1]


def verify(data_dir: Path, log=print) -> list[str]:
    """sha256 of every shard against the manifest; returns the names that fail (empty: the set is intact)."""
    d, manifest = load_manifest(data_dir)
    bad, t0, total = [], time.perf_counter(), 0
    metas = manifest["shards"] + [manifest["test"]]
    for k, meta in enumerate(metas):
        path = d / meta["name"]
        if not path.is_file() or path.stat().st_size != meta["bytes"]:
            bad.append(meta["name"])
            log(f"  {meta['name']}: missing or wrong size")
            continue
        got = sha256_file(path)
        total += meta["bytes"]
        if got != meta["sha256"]:
            bad.append(meta["name"])
            log(f"  {meta['name']}: sha256 {got[:16]}... expected {meta['sha256'][:16]}...")
        if (k + 1) % 10 == 0 or k + 1 == len(metas):
            dt = time.perf_counter() - t0
            log(f"  verified {k + 1}/{len(metas)} files, {total / MIB / dt if dt else 0:,.0f} MiB/s")
    return bad


def spec_from_manifest(manifest: dict) -> Spec:
    return Spec(**manifest["spec"])
