"""Horovod as the lab's second data-parallel engine (engine=horovod), and its build (`make horovod`).

Horovod 0.28.1 (2023) is the last release and does not build against torch >= 2.1 as released: its
CMake forces C++14 while torch's headers need C++17 (upstream issues #3996 and #4014; the fix is
merged but unreleased). `python -m kernels.engines.horovod build` (what `make horovod` runs) builds it
into the running interpreter's environment from the PyPI sdist, checked against its sha256, with
C++17 set in the three places that need it:
  1. the top-level CMakeLists.txt (CMAKE_CXX_STANDARD 14 -> 17),
  2. the torch extension, horovod/torch/CMakeLists.txt (the same),
  3. the bundled gloo, third_party/gloo/CMakeLists.txt (-std=c++11 -> -std=c++17; without it the link
     fails with `multiple definition of gloo::rendezvous::Store::kDefaultTimeout`),
and, with cmake >= 4, CMAKE_POLICY_VERSION_MINIMUM=3.5 (the bundled projects ask for cmake 2.8).
CPU builds have the Gloo and (when an MPI is installed) MPI controllers; NCCL is added when CUDA is
present. About 3 to 7 minutes on 2 cores. The wheel is kept in a per-user cache ($LAB_WHEEL_CACHE, else
~/.cache/scaling-lab/wheels) under a key of Horovod's version, torch's build, Python, the machine and the
controllers, with its sha256 beside it; a later build for the same key installs it in seconds, and a
missing, altered or non-importing cached wheel is compiled again.

In a run, Horovod averages the gradients (DistributedOptimizer, with backward_passes_per_step for
micro-batches) and broadcasts rank 0's parameters at the start and its optimizer state after a resume; the lab's own
process group still carries the loop's bookkeeping (metrics, checkpoint agreement), so records are
the same as with DDP. Launch: horovodrun (Gloo controller) on one machine, srun with the MPI
controller in a Slurm allocation. Horovod has no bfloat16 tensors: engine=horovod with
precision=bf16 is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from kernels.engines import Engine
from kernels.base.errors import ConfigError
from kernels.base.sysinfo import usable_cores

VERSION = "0.28.1"
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
BUILD_HINT = "build it into the project's environment with `make horovod` (about 3 minutes)"
# (file, pattern, replacement, how many times it must match)
PATCHES = (
    ("CMakeLists.txt", r"set\(CMAKE_CXX_STANDARD 14\)", "set(CMAKE_CXX_STANDARD 17)", 1),
    ("horovod/torch/CMakeLists.txt", r"set\(CMAKE_CXX_STANDARD 14\)", "set(CMAKE_CXX_STANDARD 17)", 1),
    ("third_party/gloo/CMakeLists.txt", r"-std=c\+\+11 -fPIC", "-std=c++17 -fPIC", 1),
)


# ------------------------------------------------------------------ availability
def import_error() -> str | None:
    """None when horovod.torch imports here, else why not."""
    import importlib

    try:
        importlib.import_module("horovod.torch")
    except ImportError as e:
        return str(e).splitlines()[0] if str(e) else "horovod is not installed"
    except Exception as e:  # noqa: BLE001 - a broken build raises anything from its extension
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def check_built() -> None:
    why = import_error()
    if why:
        raise ConfigError(
            f"parameter 'engine': horovod is not usable in {sys.prefix} ({why}); {BUILD_HINT}, or use engine=ddp"
        )


def check_config(cfg) -> None:
    """What Horovod cannot do, refused before anything starts (called from the run's validation)."""
    if cfg.engine != "horovod":
        return
    if cfg.precision == "bf16":
        raise ConfigError(
            "parameters 'engine' and 'precision': Horovod has no bfloat16 tensors "
            '("BFloat16Tensor is not supported"); use precision=fp32 or fp16 with engine=horovod, '
            "or engine=ddp for bf16"
        )
    if cfg.channels_last:
        raise ConfigError(
            "parameters 'engine' and 'channels_last': Horovod's broadcast and all-reduce take "
            'contiguous tensors only ("Tensor is required to be contiguous"), and channels_last '
            "weights and gradients are not; use channels_last=false with engine=horovod (its default)"
        )
    if cfg.hvd_fusion_mb < 0 or cfg.hvd_cycle_ms < 0:
        raise ConfigError("parameters 'hvd_fusion_mb' and 'hvd_cycle_ms' must be >= 0")


def horovodrun_command(cfg, command: list[str]) -> list[str]:
    """horovodrun on this machine with the Gloo controller: cfg.gpus ranks of `command`."""
    exe = shutil.which("horovodrun") or str(Path(sys.executable).parent / "horovodrun")
    if not Path(exe).exists():
        raise ConfigError(f"launcher: horovodrun is not installed next to {sys.executable}; {BUILD_HINT}")
    return [
        exe,
        "-np",
        str(cfg.gpus),
        "-H",
        f"localhost:{cfg.gpus}",
        "--gloo",
        "--gloo-timeout-seconds",
        str(int(cfg.startup_timeout_min * 60)),
        *command,
    ]


# ------------------------------------------------------------------ in a rank
class HorovodEngine(Engine):
    """Horovod's side of one rank: init, the distributed optimizer, the broadcasts, the early sync."""

    name = "horovod"

    def __init__(self, cfg):
        # Horovod reads these once, in init
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.hvd_fusion_mb * 1024 * 1024))
        os.environ["HOROVOD_CYCLE_TIME"] = str(cfg.hvd_cycle_ms)
        import horovod.torch as hvd

        hvd.init()
        self.hvd = hvd
        self.controller = "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "?"

    def check_world(self, rank: int, world: int) -> None:
        if (self.hvd.rank(), self.hvd.size()) != (rank, world):
            raise ConfigError(
                f"engine horovod: Horovod sees rank {self.hvd.rank()} of {self.hvd.size()} but the lab "
                f"rank {rank} of {world}; start the ranks with one launcher (horovodrun or srun)"
            )

    def wrap_model(self, model, device):
        """Horovod averages the gradients in its optimizer: the model itself is not wrapped."""
        import torch.distributed as dist

        self.check_world(dist.get_rank(), dist.get_world_size())
        return model

    def wrap_optimizer(self, model, optimizer, micro_batches: int):
        """Broadcast rank 0's parameters; return the distributed optimizer (backward_passes_per_step counts the
        micro-batches). The new optimizer shares the original's param_groups, so a scheduler built on the
        original still sets its learning rate (checked).

        The optimizer state is broadcast by `broadcast_state` once there is one (after a resume): on an empty
        state hvd.broadcast_optimizer_state first takes an optimizer step with zero gradients to create it,
        which with weight decay shrinks every weight and seeds the momentum, so the run would no longer
        match DDP's from the same seed."""
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        dist_opt = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=micro_batches, op=hvd.Average
        )
        if any(a is not b for a, b in zip(dist_opt.param_groups, optimizer.param_groups)):
            raise RuntimeError(
                "horovod's DistributedOptimizer copied the parameter groups: the learning-rate "
                "schedule would not reach it"
            )
        return dist_opt

    def step(self, optimizer, scaler, phase, clip: tuple | None = None) -> None:
        """Gradients about to be unscaled (fp16) or clipped are averaged first: Horovod's step() would otherwise
        average them inside, after."""
        synced = bool(clip or scaler.is_enabled())
        if synced:
            with phase("communication"):
                optimizer.synchronize()
        with optimizer.skip_synchronize() if synced else nullcontext():
            super().step(optimizer, scaler, phase, clip)

    def broadcast_state(self, optimizer) -> None:
        """Rank 0's optimizer state to every rank (after a resume; see wrap_optimizer)."""
        if optimizer.state_dict()["state"]:
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def probe_note(self) -> str | None:
        return "skipped with engine=horovod (its gradient hooks cannot be switched off per step)"

    def facts(self) -> dict:
        import horovod

        return {
            "engine": "horovod",
            "horovod": getattr(horovod, "__version__", VERSION),
            "controller": self.controller,
            "fusion_threshold_bytes": int(os.environ["HOROVOD_FUSION_THRESHOLD"]),
            "cycle_time_ms": float(os.environ["HOROVOD_CYCLE_TIME"]),
        }

    def run_end_lines(self, step_ms: list[float], batch: int, world: int, device) -> list[str]:
        return seed_lines([batch * 1e3 / x for x in step_ms if x > 0], world, device.type == "cuda")


ENGINE = HorovodEngine


def seed_lines(samples_per_s_per_step: list[float], world: int, on_gpu: bool) -> list[str]:
    """The two lines of Horovod's pytorch_synthetic_benchmark.py, from per-step throughputs (all ranks): mean per
    device +- 1.96 standard deviations, and the total; then the total as the seed study's scaling script greps it
    (`Global Img/sec: <value>`)."""
    import statistics

    dev = "GPU" if on_gpu else "CPU"
    per = [x / world for x in samples_per_s_per_step]
    if not per:
        return []
    mean = statistics.fmean(per)
    conf = 1.96 * (statistics.stdev(per) if len(per) > 1 else 0.0)
    return [
        f"Img/sec per {dev}: {mean:.1f} +-{conf:.1f}",
        f"Total img/sec on {world} {dev}(s): {world * mean:.1f} +-{world * conf:.1f}",
        f"Global Img/sec: {world * mean:.1f}",
    ]


# ------------------------------------------------------------------ the build
def _say(msg: str) -> None:
    print(f"[horovod build] {msg}", flush=True)


def _cmake_env() -> dict:
    env = {}
    cmake = shutil.which("cmake")
    if not cmake:
        raise ConfigError("cmake is not installed; Debian: apt-get install cmake g++ (cmake 3.13 or newer)")
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    major = int(m.group(1)) if m else 0
    _say(f"cmake {m.group(0) if m else '?'} at {cmake}")
    if major >= 4:
        env["CMAKE_POLICY_VERSION_MINIMUM"] = "3.5"
        _say("cmake >= 4: setting CMAKE_POLICY_VERSION_MINIMUM=3.5 for the bundled projects")
    if not shutil.which("g++") and not shutil.which("c++"):
        raise ConfigError("no C++ compiler; Debian: apt-get install g++")
    return env


def patch_tree(src: Path) -> None:
    for rel, pattern, repl, count in PATCHES:
        path = src / rel
        text = path.read_text()
        new, n = re.subn(pattern, repl, text)
        if n != count:
            raise RuntimeError(
                f"patch of {rel}: expected {count} match(es) of {pattern!r}, found {n}; is this the "
                f"horovod {VERSION} sdist?"
            )
        path.write_text(new)
        _say(f"patched {rel}: {pattern.replace(chr(92), '')} -> {repl}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_cache() -> Path:
    """Where built wheels are kept: $LAB_WHEEL_CACHE, else ~/.cache/scaling-lab/wheels (per user)."""
    env = os.environ.get("LAB_WHEEL_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaling-lab" / "wheels"


def wheel_key(mpi: bool, nccl: bool) -> str:
    """One cached build per Horovod version, torch build, Python and set of controllers: a wheel built against
    another torch does not load (its extension links torch's C++ ABI)."""
    import torch

    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    controllers = "gloo" + ("-mpi" if mpi else "") + ("-nccl" if nccl else "")
    return f"horovod-{VERSION}-torch{torch.__version__}-{py}-{os.uname().machine}-{controllers}"


def _cached_wheel(key: str) -> Path | None:
    folder = wheel_cache() / key
    wheels = sorted(folder.glob("horovod-*.whl")) if folder.is_dir() and not folder.is_symlink() else []
    if len(wheels) != 1 or wheels[0].is_symlink():
        return None
    digest = folder / (wheels[0].name + ".sha256")
    if not digest.is_file() or digest.read_text().split()[0] != sha256(wheels[0]):
        _say(f"{folder}: the cached wheel does not match its sha256; building again")
        return None
    return wheels[0]


def _write_new(path: Path, data: bytes) -> None:
    """Create path (it must not exist, not even as a link) and write data into it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _keep_wheel(wheel: Path, key: str) -> None:
    """Put a freshly built wheel and its sha256 into the cache: new temporary files, then renames."""
    folder = wheel_cache() / key
    tmps = [folder / f".{wheel.name}.{os.getpid()}.tmp", folder / f".{wheel.name}.sha256.{os.getpid()}.tmp"]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():
            raise OSError(f"{folder} is a symbolic link")
        data = wheel.read_bytes()
        _write_new(tmps[0], data)
        _write_new(tmps[1], f"{hashlib.sha256(data).hexdigest()}  {wheel.name}\n".encode())
        os.replace(tmps[0], folder / wheel.name)
        os.replace(tmps[1], folder / f"{wheel.name}.sha256")
        _say(f"kept the wheel for the next build: {folder / wheel.name}")
    except OSError as e:  # a cache that cannot be written costs the next build its time, nothing else
        for t in tmps:
            t.unlink(missing_ok=True)
        _say(f"could not keep the wheel in {folder} ({e}); the next build compiles again")


def _install_wheel(wheel: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        raise ConfigError(f"pip could not install {wheel}: {p.stderr.strip()[-400:]}")


def _fetch_sdist(sdist: Path | None, tmp: Path) -> Path:
    if sdist is None:
        _say(f"downloading the horovod {VERSION} sdist from the package index")
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"horovod=={VERSION}",
                "-d",
                str(tmp),
            ],
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            raise ConfigError(
                f"pip could not download horovod=={VERSION}: {p.stderr.strip()[-400:]}; "
                f"pass a downloaded sdist with --sdist FILE"
            )
        sdist = tmp / f"horovod-{VERSION}.tar.gz"
    sdist = Path(sdist)
    if not sdist.is_file():
        raise ConfigError(f"--sdist {sdist}: no such file")
    got = sha256(sdist)
    if got != SDIST_SHA256:
        raise ConfigError(f"{sdist}: sha256 {got} is not that of the horovod {VERSION} sdist ({SDIST_SHA256})")
    _say(f"{sdist.name}: sha256 verified")
    return sdist


def _compile_wheel(src: Path, env: dict, out: Path) -> Path:
    """`pip wheel` of the patched tree into out/, with a line of progress every 15 s; the wheel's path."""
    t0 = time.time()
    log = out.parent / "build.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-build-isolation",
                "--no-deps",
                "--no-cache-dir",
                "-v",
                "-w",
                str(out),
                str(src),
            ],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        while proc.poll() is None:
            time.sleep(15)
            built = len(re.findall(r"Building CXX object", log.read_text(errors="replace")))
            _say(f"{time.time() - t0:5.0f} s, {built} objects compiled")
    if proc.returncode != 0:
        text = log.read_text(errors="replace").splitlines()
        errors = [ln for ln in text if re.search(r"CMake Error|error:|Error \d", ln)][:20]
        raise ConfigError(
            f"the horovod build failed (exit {proc.returncode}); its errors:\n"
            + "\n".join(errors)
            + "\nand the end of its log:\n"
            + "\n".join(text[-15:])
        )
    (wheel,) = out.glob("horovod-*.whl")
    _say(f"compiled in {time.time() - t0:.0f} s")
    return wheel


def _build_env(jobs: int) -> dict:
    env = {**os.environ, **_cmake_env()}
    env.update(
        HOROVOD_WITH_PYTORCH="1",
        HOROVOD_WITHOUT_TENSORFLOW="1",
        HOROVOD_WITHOUT_MXNET="1",
        HOROVOD_WITH_GLOO="1",
        MAKEFLAGS=f"-j{jobs}",
        HOROVOD_BUILD_PARALLELISM=str(jobs),
    )
    if shutil.which("mpicxx") or shutil.which("mpicc"):
        env["HOROVOD_WITH_MPI"] = "1"
    import torch

    if torch.version.cuda and (torch.cuda.is_available() or shutil.which("nvcc")):
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    else:  # a CPU build of torch: no GPU operations, whatever nvcc may be on PATH
        env.pop("HOROVOD_GPU_OPERATIONS", None)
    return env


def _check_import() -> None:
    check = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True)
    if check.returncode != 0:
        raise ConfigError(f"horovod was installed but does not import: {check.stderr.strip()[-400:]}")


def build(sdist: Path | None = None, jobs: int | None = None, force: bool = False, cache: bool = True) -> int:
    """Install Horovod into this environment: from the wheel cache when a build for this torch is there,
    else compiled from the sdist (and the wheel kept in the cache for the next environment)."""
    if not force and import_error() is None:
        _say(f"horovod already imports in {sys.prefix}; nothing to do (--force rebuilds)")
        return 0
    jobs = jobs or usable_cores()
    env = _build_env(jobs)
    key = wheel_key("HOROVOD_WITH_MPI" in env, "HOROVOD_GPU_OPERATIONS" in env)
    t0 = time.time()
    cached = _cached_wheel(key) if cache and not force else None
    if cached:
        _say(f"installing the cached build {cached} (--no-cache compiles again)")
        _install_wheel(cached)
        try:
            _check_import()  # in a new process: this one may hold the import it tried before the install
        except ConfigError as e:
            _say(f"the cached build does not import ({str(e).splitlines()[0]}); compiling")
        else:
            _say(f"done in {time.time() - t0:.0f} s from the cache")
            return 0
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        tmp = Path(tmp)
        sdist = _fetch_sdist(sdist, tmp)
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        src = tmp / f"horovod-{VERSION}"
        patch_tree(src)
        import torch

        _say(
            f"building with {jobs} job(s): torch {torch.__version__}, Gloo"
            f"{', MPI' if 'HOROVOD_WITH_MPI' in env else ''}{', NCCL' if 'HOROVOD_GPU_OPERATIONS' in env else ''}"
            f" (log: {tmp}/build.log while it runs)"
        )
        wheel = _compile_wheel(src, env, tmp / "wheel")
        _install_wheel(wheel)
        _check_import()
        if cache:
            _keep_wheel(wheel, key)
    _say(f"done in {time.time() - t0:.0f} s; `horovodrun --check-build` lists the controllers and operations")
    return 0


def main(argv=None) -> int:
    import argparse

    from kernels.base.errors import exit_status

    ap = argparse.ArgumentParser(
        prog="python -m kernels.engines.horovod", description="build Horovod 0.28.1 for this torch (make horovod)"
    )
    ap.add_argument("command", choices=["build", "check"])
    ap.add_argument("--sdist", type=Path, help="a downloaded horovod-0.28.1.tar.gz (default: download it)")
    ap.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    ap.add_argument("--force", action="store_true", help="compile again even if horovod imports or a cached wheel fits")
    ap.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="neither install from nor keep a wheel in the cache ($LAB_WHEEL_CACHE, else ~/.cache/scaling-lab/wheels)",
    )
    a = ap.parse_args(argv)

    def body() -> int:
        if a.command == "check":
            check_built()
            print(f"horovod imports in {sys.prefix}")
            return 0
        return build(a.sdist, a.jobs, a.force, a.cache)

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
