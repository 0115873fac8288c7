"""Where this process sits in the world, and the process group's lifecycle.

Rank, world size and local rank come from torchrun's variables (RANK,
WORLD_SIZE, LOCAL_RANK), from horovodrun's (HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK) or, in a Slurm
step, from SLURM_PROCID / SLURM_NTASKS /
SLURM_LOCALID with MASTER_ADDR = the allocation's first host and MASTER_PORT
derived from the job id; explicit MASTER_ADDR/MASTER_PORT always win. With none
of these the process is a world of one and needs no launcher.

Setup order is fixed: device from the local rank first, then
init_process_group with an explicit timeout; teardown in `finally`.
"""

from __future__ import annotations

import os
import re
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from kernels.base.errors import ConfigError
from kernels.base.ports import slurm_port


@dataclass(frozen=True)
class RankEnv:
    global_rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # local (this lab's launcher) | torchrun | slurm | single

    @property
    def is_rank0(self) -> bool:
        return self.global_rank == 0

    def check_world(self, gpus: int) -> None:
        if self.world_size != gpus:
            raise ConfigError(
                f"parameter 'gpus': gpus={gpus} but the launcher started {self.world_size} rank(s) "
                f"({self.source}); make them agree (e.g. srun --ntasks={gpus})"
            )


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm hostlist such as 'gpu[001-003,7],login1' to host names."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", spec):
        m = re.fullmatch(r"(.*?)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            if "-" in r:
                lo, hi = r.split("-", 1)
                width = len(lo)
                hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
            else:
                hosts.append(f"{prefix}{r}{suffix}")
    return hosts


def rank_env(environ: dict | None = None) -> RankEnv:
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return RankEnv(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            env.get("LAB_LAUNCHER") or "torchrun",
        )
    if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:  # horovodrun (engine=horovod): it passes MASTER_* on
        return RankEnv(
            int(env["HOROVOD_RANK"]),
            int(env["HOROVOD_SIZE"]),
            int(env.get("HOROVOD_LOCAL_RANK", 0)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            env.get("LAB_LAUNCHER") or "horovodrun",
        )
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        hosts = expand_hostlist(nodelist) if nodelist else []
        addr = env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1")
        port = int(env.get("MASTER_PORT") or slurm_port(env.get("SLURM_JOB_ID", "0")))
        return RankEnv(
            int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)), addr, port, "slurm"
        )
    return RankEnv(0, 1, 0, "127.0.0.1", 0, "single")


def gpu_index(local_rank: int, visible: int) -> int:
    """The index, among the GPUs this process sees, that local rank `local_rank` takes.

    All the node's GPUs visible (one task per GPU, no binding): the local rank. Slurm bound
    one GPU to the task (--gpus-per-task=1, --gpu-bind=single:1 or map_gpu): index 0. Slurm
    bound a subset of k GPUs to groups of k tasks (--gpu-bind=per_task:k, a socket's GPUs):
    local rank mod k, which spreads consecutive tasks over the group's GPUs. Two ranks that
    still land on one GPU are found after the rendezvous (check_distinct_gpus), not here.
    """
    if visible < 1:
        raise ConfigError(
            f"parameter 'device': cuda requested but no GPU is visible to local rank {local_rank} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return local_rank % visible


def bf16_fallback(precision: str, name: str, capability: tuple[int, int]) -> str | None:
    """Why this GPU trains `precision` in fp16 instead, or None: bf16 needs compute capability 8.0 (Ampere) or
    newer; a V100 (7.0) or T4 (7.5) would emulate it at a fraction of fp16's speed, or fail inside a kernel."""
    if precision != "bf16" or capability >= (8, 0):
        return None
    return (
        f"bf16 asked, but the {name} is compute capability {capability[0]}.{capability[1]} (bf16 needs 8.0): fp16 "
        f"with its GradScaler instead"
    )


def agreed_precision(precision: str, device: torch.device) -> tuple[str, str | None]:
    """The precision every rank trains in, and why it is not `precision` (None when it is): fp16 with the scaler on
    every rank when any rank's GPU has no bf16 (one all-reduce, on GPUs only; a CPU runs bf16 autocast as asked)."""
    if precision != "bf16" or device.type != "cuda":
        return precision, None
    why = bf16_fallback(precision, torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    flag = torch.tensor([0.0 if why is None else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0:
        return precision, None
    return "fp16", why or "bf16 asked, but another rank's GPU has no bf16: fp16 with its GradScaler on every rank"


def enable_tf32() -> None:
    """TF32 matmuls and convolutions, and cuDNN's autotuner: the lab's CUDA defaults for training."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True


def select_device(device_type: str, local_rank: int) -> torch.device:
    """This rank's device; a GPU gets the lab's CUDA defaults (enable_tf32)."""
    if device_type == "cpu":
        return torch.device("cpu")
    index = gpu_index(local_rank, torch.cuda.device_count())
    torch.cuda.set_device(index)
    device = torch.device("cuda", index)
    enable_tf32()
    return device


def gpu_uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    return str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "") or None


def check_distinct_gpus(ranks: list[dict], backend: str = "nccl") -> None:
    """Every rank on its own GPU: two ranks that share one (a binding that left both the same device) fail here,
    naming them, instead of running at half speed. Over gloo, asked for by name (backend=gloo), sharing is the
    point: the multi-rank path checked on one GPU."""
    if backend == "gloo":
        return
    seen: dict[tuple, int] = {}
    for r in ranks:
        if not r.get("gpu_uuid"):
            continue
        key = (r["node"], r["gpu_uuid"])
        if key in seen:
            raise ConfigError(
                f"parameter 'gpus': ranks {seen[key]} and {r['global_rank']} share GPU {r['gpu_uuid']} on {r['node']}; "
                f"give each task its own GPU (--ntasks-per-node = --gpus-per-node, or --gpus-per-task=1)"
            )
        seen[key] = r["global_rank"]


def preflight(renv: RankEnv) -> None:
    """Resolve MASTER_ADDR before anything waits on it: an unresolvable name fails in seconds, not after
    minutes of c10d retries, with the variables to set."""
    try:
        socket.getaddrinfo(renv.master_addr, renv.master_port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(
            f"MASTER_ADDR '{renv.master_addr}' (MASTER_PORT {renv.master_port}) does not resolve on "
            f"{socket.gethostname()} ({e}); set MASTER_ADDR to an address of the node of global rank 0 that the "
            f"other nodes reach (under Slurm the lab takes the allocation's first node; emulated nodes on one "
            f"machine need MASTER_ADDR=127.0.0.1)"
        ) from None


def rendezvous_store(renv: RankEnv, startup_timeout_min: float):
    """The TCPStore every rank meets at: rank 0 serves it and waits for the others, the others connect.

    Its timeout is the startup one (short), not the collectives' (long): a rank that never
    arrives, or a MASTER_ADDR/MASTER_PORT that nobody serves, fails within it, naming both.
    """
    preflight(renv)
    timeout = timedelta(minutes=startup_timeout_min)
    try:
        return dist.TCPStore(
            renv.master_addr,
            renv.master_port,
            renv.world_size,
            is_master=renv.is_rank0,
            timeout=timeout,
            wait_for_workers=True,
        )
    except (RuntimeError, OSError) as e:
        if renv.is_rank0 and ("EADDRINUSE" in str(e) or "address already in use" in str(e).lower()):
            raise ConfigError(
                f"rank 0: MASTER_PORT={renv.master_port} on {socket.gethostname()} is taken by another process "
                f"(address already in use); the lab's launchers draw a free random port unless MASTER_PORT is set: "
                f"unset MASTER_PORT, or set it to a free one"
            ) from None
        what = (
            "not every rank connected to the rendezvous this rank serves"
            if renv.is_rank0
            else "this rank could not reach the rendezvous"
        )
        raise ConfigError(
            f"rank {renv.global_rank}: {what} at MASTER_ADDR={renv.master_addr} MASTER_PORT={renv.master_port} "
            f"within startup_timeout_min={startup_timeout_min:g} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            f"check that all {renv.world_size} ranks started, that the address and port are reachable from every "
            f"node (a firewall, another job on the port), or raise startup_timeout_min"
        ) from None


@contextmanager
def process_group(
    renv: RankEnv, device: torch.device, timeout_min: float, startup_timeout_min: float = 5.0, backend: str = "auto"
):
    """init_process_group (auto: nccl on CUDA, gloo on CPU) ... destroy, always.

    Rendezvous through a store with the startup timeout; collectives with timeout_min.
    """
    if backend == "auto":  # a named backend was checked against the device when the config was resolved
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(minutes=timeout_min)
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = device
    if renv.world_size == 1:
        # A world of one: an in-memory store, so no port and no launcher is needed,
        # and the same DDP code path runs.
        store = dist.HashStore()
    else:
        store = rendezvous_store(renv, startup_timeout_min)
    dist.init_process_group(
        backend, store=store, rank=renv.global_rank, world_size=renv.world_size, timeout=timeout, **kwargs
    )
    try:
        yield backend
    finally:
        dist.destroy_process_group()


def all_reduce(values: list[float], device: torch.device, op=dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def all_gather_object(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


@dataclass(frozen=True)
class Grid:
    """A 2-D grid of ranks, gpus = dp x gp: ranks d*gp .. d*gp+gp-1 form graph-parallel group d (neighbours, so
    on one node when gp divides the GPUs per node); ranks with the same index in their groups share data
    shards' positions across groups. `group` is this rank's graph-parallel process group (None when gp = 1)."""

    dp: int
    gp: int
    dp_rank: int
    gp_rank: int
    group: object = None


def grid(gp: int) -> Grid:
    """Make the graph-parallel process groups (every rank calls this, in the same order) and place this rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if gp < 1 or world % gp:
        raise ConfigError(f"parameter 'gp': {gp} does not divide gpus={world}; gpus = dp x gp")
    mine = None
    if gp > 1:
        for d in range(world // gp):
            g = dist.new_group(list(range(d * gp, (d + 1) * gp)))
            if d == rank // gp:
                mine = g
    return Grid(world // gp, gp, rank // gp, rank % gp, mine)
