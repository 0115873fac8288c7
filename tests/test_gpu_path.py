"""The GPU path's settings, checked where they can be on a CPU: srun's CPU options, per-device defaults, GPU
index selection under Slurm's bindings, ports, device peaks, evaluation frequency and asynchronous checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernels.base.dist import check_distinct_gpus, gpu_index
from kernels.base.ports import PORT_BASE, PORT_SPAN, free_port, slurm_port
from kernels.base.flops import peak_tflops
from kernels.base.params import ConfigError
from kernels.launch.config import resolve
from kernels.launch.launchers import core_sets, srun_command
from kernels.launch.ranks import rank_job

from conftest import ROOT

pytestmark = pytest.mark.unit


def test_srun_line_carries_the_cpus_per_task_and_a_binding():
    cfg = resolve({"gpus": 8, "dataset": "digits"})
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_CPUS_PER_TASK": "8"}
    cmd = srun_command(rank_job(cfg), env)
    assert "--cpus-per-task=8" in cmd and "--cpu-bind=cores" in cmd
    assert cmd.index("--cpu-bind=cores") < cmd.index("-m")  # srun options, before the rank's command
    assert "--cpus-per-task=8" not in srun_command(
        rank_job(cfg), {k: v for k, v in env.items() if k != "SLURM_CPUS_PER_TASK"}
    )
    assert "--cpu-bind=none" in srun_command(rank_job(cfg), {**env, "LAB_CPU_BIND": "none"})


def test_local_ranks_get_disjoint_shares_of_the_cores_only_when_asked():
    usable = sorted(os.sched_getaffinity(0))
    assert core_sets(2, {}) is None and core_sets(2, {"LAB_CPU_BIND": "none"}) is None  # unbound by default
    bind = {"LAB_CPU_BIND": "cores"}
    assert core_sets(1, bind) == [usable]
    assert core_sets(len(usable), bind) == [[c] for c in usable]
    assert core_sets(len(usable) + 1, bind) is None  # fewer cores than ranks: left to the scheduler


@pytest.mark.integration
def test_cpu_counts_follow_the_binding_not_the_machine():
    """Under a binding (Slurm's, or taskset here) a local run sizes its OMP threads and its core check by the
    cores it was given: two ranks on one bound core need oversubscribe, one rank gets one thread."""
    code = (
        "from kernels.launch.config import resolve, check_environment\n"
        "from kernels.base.errors import ConfigError\n"
        "from kernels.launch.launchers import thread_env\n"
        "import os; os.environ.pop('OMP_NUM_THREADS', None)\n"
        "print(thread_env(1)['OMP_NUM_THREADS'])\n"
        "try: check_environment(resolve({'gpus': 2, 'dataset': 'digits'}))\n"
        "except ConfigError as e: print(e)\n"
    )
    p = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    threads, error = p.stdout.splitlines()[:2]
    assert threads == "1" and "2 CPU ranks on this node but only 1 core(s)" in error and "oversubscribe" in error


def test_defaults_resolve_per_device_type():
    gpu = resolve({"dataset": "digits", "device": "cuda"})
    assert gpu.compile is True and gpu.channels_last is True
    cpu = resolve({"dataset": "digits", "device": "cpu"})
    assert cpu.compile is False and cpu.channels_last is True  # ResNet-18 at width 64: faster on a CPU too
    # below width 16 a downsampling 1x1 stride-2 convolution meets oneDNN's channels_last fault: NCHW, and a
    # request for channels_last is refused before any work
    assert resolve({"dataset": "digits", "device": "cpu", "width": 8}).channels_last is False
    with pytest.raises(ConfigError, match=r"parameter 'channels_last': on a CPU, ResNet-18 at width 8 .*oneDNN#6035"):
        resolve({"dataset": "digits", "device": "cpu", "width": 8, "channels_last": True})
    assert resolve({"workload": "cnn", "dataset": "digits", "device": "cpu"}).channels_last is False  # not measured
    # Horovod's collectives take contiguous tensors only: channels_last off with it on any device, a request refused
    hvd = resolve({"dataset": "digits", "device": "cuda", "engine": "horovod", "precision": "fp32"})
    assert hvd.channels_last is False
    with pytest.raises(ConfigError, match=r"'engine' and 'channels_last': Horovod's broadcast and all-reduce"):
        resolve({"dataset": "digits", "device": "cpu", "engine": "horovod", "precision": "fp32", "channels_last": True})
    assert resolve({"dataset": "digits"}).compile is False  # auto on this machine: no GPU
    assert resolve({"dataset": "digits", "device": "cuda", "compile": False}).compile is False  # a choice stays
    assert resolve({"dataset": "digits", "compile": None}).compile is False  # None, as in the notebook: per device
    assert resolve({"dataset": "digits", "batch": 64}).per_rank_eval_batch == 256
    assert resolve({"dataset": "digits", "batch": 64, "eval_batch": 100}).per_rank_eval_batch == 100


@pytest.mark.parametrize(
    "visible,local_ranks,want",
    [
        (4, [0, 1, 2, 3], [0, 1, 2, 3]),  # 4 tasks, all GPUs visible (no binding)
        (1, [0, 1, 2, 3], [0, 0, 0, 0]),  # --gpus-per-task=1 / --gpu-bind=single:1: each task sees its own
        (2, [0, 1, 2, 3], [0, 1, 0, 1]),  # --gpu-bind=per_task:2 / a socket's pair: spread within the pair
        (8, [0, 1], [0, 1]),  # fewer tasks than GPUs
    ],
)
def test_gpu_index_under_slurm_bindings(visible, local_ranks, want):
    assert [gpu_index(r, visible) for r in local_ranks] == want


def test_two_ranks_on_one_gpu_fail_naming_them():
    ranks = [
        {"node": "n1", "global_rank": 0, "gpu_uuid": "GPU-a"},
        {"node": "n1", "global_rank": 1, "gpu_uuid": "GPU-b"},
        {"node": "n2", "global_rank": 2, "gpu_uuid": "GPU-a"},
    ]  # another node's GPU may have any uuid
    check_distinct_gpus(ranks)
    ranks.append({"node": "n1", "global_rank": 3, "gpu_uuid": "GPU-b"})
    with pytest.raises(ConfigError, match="ranks 1 and 3 share GPU GPU-b on n1"):
        check_distinct_gpus(ranks)
    with pytest.raises(ConfigError, match="no GPU is visible"):
        gpu_index(0, 0)
    check_distinct_gpus([{"node": "n1", "global_rank": i, "gpu_uuid": None} for i in range(2)])  # CPU ranks


def test_rendezvous_ports_are_outside_the_ephemeral_range():
    lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    assert PORT_BASE + PORT_SPAN <= lo  # below the kernel's range on this machine too
    for job in ("1", "12345", "999999", "4294967295"):
        assert PORT_BASE <= slurm_port(job) < PORT_BASE + PORT_SPAN
    assert all(PORT_BASE <= free_port() < PORT_BASE + PORT_SPAN for _ in range(5))


def test_device_peaks_match_whole_names():
    assert peak_tflops("NVIDIA L4", "bf16") == 121.0
    assert peak_tflops("NVIDIA L40", "bf16") == 181.0  # not the L4's
    assert peak_tflops("NVIDIA L40S", "bf16") == 362.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("NVIDIA A10G", "bf16") is None  # unknown, not the A10's


@pytest.mark.integration
def test_eval_every_and_checkpoint_costs_in_the_record(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.train",
            "--dataset",
            "digits",
            "--width",
            "4",
            "--epochs",
            "3",
            "--batch",
            "64",
            "--train_samples",
            "256",
            "--test_samples",
            "64",
            "--precision",
            "fp32",
            "--eval_every",
            "2",
            "--log_every",
            "0",
            "--results_dir",
            tmp_path,
            "--run_id",
            "e",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    import csv

    rows = list(csv.DictReader(open(tmp_path / "e" / "metrics.csv")))
    assert [bool(r["eval_loss"]) for r in rows] == [False, True, True]  # epoch 2, and the last
    assert "epoch 1/3 done: train_loss" in p.stdout and "(no evaluation)" in p.stdout
    s = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert s["final_eval_acc"] is not None
    c = s["checkpoints"]
    assert c["count"] == 3 and c["async"] is True and c["bytes"] > 0
    assert c["snapshot_ms_median"] > 0 and c["write_ms_median"] > 0


def test_cuda_graphs_default_on_with_cuda_and_compile_where_shapes_are_static():
    assert resolve({"dataset": "digits", "device": "cuda"}).cuda_graphs is True
    assert resolve({"dataset": "digits", "device": "cuda", "compile": False}).cuda_graphs is False
    assert resolve({"dataset": "digits", "device": "cpu"}).cuda_graphs is False
    # DCRNN draws its teacher-forcing coins on the host each step: not captured by default
    assert resolve({"workload": "dcrnn", "device": "cuda"}).cuda_graphs is False
    assert resolve({"dataset": "digits", "device": "cuda", "cuda_graphs": False}).cuda_graphs is False
    with pytest.raises(ConfigError, match=r"parameter 'cuda_graphs': .*set compile=true"):
        resolve({"dataset": "digits", "device": "cuda", "compile": False, "cuda_graphs": True})
    with pytest.raises(ConfigError, match=r"parameter 'cuda_graphs': CUDA graphs need a GPU"):
        resolve({"dataset": "digits", "device": "cpu", "compile": True, "cuda_graphs": True})


def test_backend_gloo_lets_ranks_share_a_gpu_and_nccl_needs_one():
    check_distinct_gpus(
        [{"node": "n", "gpu_uuid": "G", "global_rank": 0}, {"node": "n", "gpu_uuid": "G", "global_rank": 1}], "gloo"
    )
    with pytest.raises(ConfigError, match="ranks 0 and 1 share GPU G"):
        check_distinct_gpus(
            [{"node": "n", "gpu_uuid": "G", "global_rank": 0}, {"node": "n", "gpu_uuid": "G", "global_rank": 1}], "nccl"
        )
    with pytest.raises(ConfigError, match=r"parameter 'backend': nccl needs GPUs"):
        resolve({"dataset": "digits", "device": "cpu", "backend": "nccl"})


def test_device_facts_hopper_peaks_mig_slices_and_bf16_capability():
    import torch

    from kernels.base.dist import agreed_precision, bf16_fallback
    from kernels.base.flops import peak_note

    assert peak_tflops("NVIDIA H200 NVL", "bf16") == 835.0 and peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 NVL", "bf16") == 835.0 and peak_tflops("NVIDIA H100 PCIe", "fp32") == 378.0
    assert peak_tflops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16") is None
    assert "MIG slice" in peak_note("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16")
    assert peak_note("NVIDIA H200", "bf16") is None
    assert bf16_fallback("bf16", "NVIDIA H100 80GB HBM3", (9, 0)) is None
    assert bf16_fallback("fp16", "Tesla V100-SXM2-32GB", (7, 0)) is None
    why = bf16_fallback("bf16", "Tesla V100-SXM2-32GB", (7, 0))
    assert why.startswith("bf16 asked, but the Tesla V100") and "7.0" in why and "fp16 with its GradScaler" in why
    # on a CPU bf16 autocast runs as asked, with no collective
    assert agreed_precision("bf16", torch.device("cpu")) == ("bf16", None)


def test_the_sync_counter_counts_synchronising_calls_not_the_modes_notice():
    """torch 2.11 on an H200: set_sync_debug_mode('warn') warns once that the mode 'is a prototype feature and does
    not yet detect all synchronizing operations'; a match on 'synchroniz' counted it as a sync in every window."""
    from kernels.run.observe import is_sync_warning

    assert is_sync_warning(
        "called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:162.)"
    )
    assert not is_sync_warning(
        "Synchronization debug mode is a prototype feature and does not yet detect all "
        "synchronizing operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp)"
    )
