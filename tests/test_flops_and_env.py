"""FLOP counting, device peaks, MFU, and the rank environment."""

from __future__ import annotations

import pytest
import torch

from kernels.base.dist import expand_hostlist, rank_env, slurm_port
from kernels.base.flops import mfu, model_flops_per_sample, peak_tflops
from kernels.workloads.convnets import ResNet18Cifar

pytestmark = pytest.mark.unit


def test_resnet18_cifar_forward_is_056_gmacs():
    model = ResNet18Cifar(num_classes=10, width=64)
    f = model_flops_per_sample(
        model, torch.zeros(2, 3, 32, 32), torch.nn.functional.cross_entropy, torch.zeros(2, dtype=torch.long)
    )
    gmacs = f["fwd_flops_per_sample"] / 2 / 1e9
    assert abs(gmacs - 0.56) / 0.56 < 0.05, gmacs
    # backward costs about twice the forward
    assert 2.5 < f["train_flops_per_sample"] / f["fwd_flops_per_sample"] < 3.5


def test_peaks_are_looked_up_by_name_not_hard_coded():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp16") == 312.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 156.0  # TF32 tensor cores
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp32", tf32=False) == 19.5
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 tensor cores
    assert peak_tflops("Tesla T4", "fp16") == 65.0
    assert peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert peak_tflops("Some Future GPU", "bf16") is None


def test_mfu_empty_when_peak_unknown():
    assert mfu(1000.0, 1e9, None) is None
    assert abs(mfu(1000.0, 1e9, 1.0) - 1.0) < 1e-12  # 1000 samples/s * 1 GFLOP = 1 TFLOP/s of a 1 TFLOP/s device


def test_hostlist_expansion():
    assert expand_hostlist("n[1-2]") == ["n1", "n2"]
    assert expand_hostlist("gpu[001-003,010],login1") == ["gpu001", "gpu002", "gpu003", "gpu010", "login1"]
    assert expand_hostlist("node7") == ["node7"]


def test_rank_env_from_torchrun_slurm_and_nothing():
    t = rank_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (t.global_rank, t.world_size, t.local_rank, t.master_addr, t.master_port, t.source) == (
        3,
        8,
        1,
        "h",
        1234,
        "torchrun",
    )
    s = rank_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_NODELIST": "gpu[07-08]",
        }
    )
    assert (s.global_rank, s.world_size, s.local_rank, s.master_addr, s.source) == (5, 8, 1, "gpu07", "slurm")
    assert s.master_port == slurm_port("4242") and not s.is_rank0
    one = rank_env({})
    assert (one.world_size, one.global_rank, one.is_rank0) == (1, 0, True)
