"""Workloads as plug-ins: the merged parameter table, a toy workload of this file through the real loop, the CNN.

TOY below is a complete workload defined outside kernels/ (as docs/user-guide.md "Your own model"
shows): its own parameter, data source, model, recipe and a metric with one value per
label. The 2-rank test runs it with `--workload test_workloads:TOY` through the lab's
real loop, unchanged.
"""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch
import torch.nn.functional as F

from kernels.data.pipeline import EvalSource, Split, TensorSource
from kernels.notebook.runner import resolve_notebook_parameters
from kernels.base.params import ConfigError, Param
from kernels.launch.config import resolve, table
from kernels.workloads import DataInfo, Metric, Recipe, Workload

from conftest import ROOT, TINY, cli_in_process, load_checkpoint, merge_args, run_cli

pytestmark = pytest.mark.unit

# ------------------------------------------------------------------ the toy plug-in
TOY_PARAMS = (Param("hidden", int, 16, "width of the hidden layer", group="toy"),)


def toy_data(cfg, rank, world, device):
    """Two Gaussian blobs in 8 dimensions; labels 0/1. The lab's resident source, no transform."""
    g = torch.Generator().manual_seed(1234)
    n = 512
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) + (2.0 * y - 1.0)[:, None]
    train, test = Split(x[:384], y[:384]), Split(x[384:], y[384:])
    src = TensorSource(train.head(cfg.train_samples), None, cfg.batch, rank, world, cfg.seed, device, False)
    return src, EvalSource(test, None, 32, rank, world, device, False), DataInfo(input_shape=(8,), num_classes=2)


def toy_model(cfg, info):
    return torch.nn.Sequential(
        torch.nn.Linear(8, cfg.hidden), torch.nn.ReLU(), torch.nn.Linear(cfg.hidden, 2)
    ), f"toy-mlp-hidden{cfg.hidden}"


def toy_recipe(cfg, model, steps_per_epoch):
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    return Recipe(opt, torch.optim.lr_scheduler.StepLR(opt, 1, 0.5), "epoch", clip_grad_norm=10.0)


def toy_metrics(out, y):
    hit = (out.argmax(1) == y).double()
    per_class = torch.stack([(hit * (y == c)).sum() for c in (0, 1)])
    counts = torch.stack([(y == c).sum() for c in (0, 1)]).double()
    return {"acc": (hit.sum(), y.numel()), "recall": (per_class, counts)}


TOY = Workload(
    name="toy",
    title="a two-layer perceptron on two blobs",
    datasets=("blobs",),
    params=TOY_PARAMS,
    defaults={"precision": "fp32", "batch": 32, "epochs": 3, "lr": 0.1},
    metrics=(Metric("acc"), Metric("recall", labels=("c0", "c1"))),
    make_data=toy_data,
    build_model=toy_model,
    build_optimizer=toy_recipe,
    loss=F.cross_entropy,
    metric_sums=toy_metrics,
    primary_metric="acc",
)


@pytest.mark.integration
def test_a_workload_of_this_file_trains_through_the_real_two_rank_loop(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    p = run_cli(
        "--workload",
        "test_workloads:TOY",
        "--gpus",
        "2",
        "--hidden",
        "8",
        "--log_every",
        "0",
        "--comm_probe_steps",
        "0",
        "--results_dir",
        tmp_path,
        "--run_id",
        "toy",
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = json.loads((tmp_path / "toy" / "config.json").read_text())
    assert cfg["params"]["workload"] == "test_workloads:TOY" and cfg["params"]["hidden"] == 8
    assert cfg["params"]["lr"] == 0.1 and cfg["derived"]["model_variant"] == "toy-mlp-hidden8"
    assert cfg["derived"]["data_source"]["source"] == "device-resident" and cfg["derived"]["world_size"] == 2
    with open(tmp_path / "toy" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    for col in ("train_acc", "eval_acc", "train_recall_c0", "eval_recall_c0", "eval_recall_c1"):
        assert col in rows[0]
    assert [float(r["lr"]) for r in rows] == [0.05, 0.025, 0.0125]  # its own per-epoch schedule
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["final_eval_acc"] > 0.9
    assert summary["final_eval_recall_c0"] > 0.8 and summary["final_eval_recall_c1"] > 0.8


# ------------------------------------------------------------------ the merged table
def test_workload_defaults_and_explicit_values():
    cnn, res = resolve({"workload": "cnn"}), resolve({})
    assert (cnn.dataset, cnn.precision, cnn.batch, cnn.epochs, cnn.lr, cnn.lr_gamma) == (
        "mnist",
        "fp32",
        64,
        5,
        1.0,
        0.7,
    )
    assert (res.dataset, res.precision, res.batch, res.epochs, res.lr, res.width) == (
        "cifar10",
        "bf16",
        512,
        10,
        0.2,
        64,
    )
    assert resolve({"workload": "cnn", "lr": 0.5, "batch": None}).lr == 0.5  # None: the workload's default
    assert "width" not in resolve({"workload": "cnn"}).to_dict() and "lr_gamma" not in res.to_dict()
    assert resolve({"workload": "cnn", "dataset": "fashion-mnist"}).cli_args()[:4] == [
        "--workload",
        "cnn",
        "--dataset",
        "fashion-mnist",
    ]


@pytest.mark.parametrize(
    "raw,needle",
    [
        ({"workload": "cnn", "width": 16}, "'width' is a parameter of workload resnet18, not cnn"),
        ({"lr_gamma": 0.5}, "'lr_gamma' is a parameter of workload cnn, not resnet18"),
        (
            {"workload": "cnn", "dataset": "cifar10"},
            "workload 'cnn' takes mnist, fashion-mnist, bigmnist, digits, synthetic, not 'cifar10'",
        ),
        ({"workload": "cnn", "lr_gama": 0.5}, "unknown parameter 'lr_gama'.*did you mean 'lr_gamma'"),
        ({"workload": "nope"}, "unknown workload 'nope'; choose one of resnet18, cnn, dcrnn, or give module:OBJECT"),
        ({"workload": "no_such_module:X"}, "cannot import no_such_module"),
    ],
)
def test_cross_workload_and_unknown_parameters_are_errors(raw, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve(raw)


def test_the_notebook_rejects_a_parameter_of_another_workload():
    ns = {p.name: p.default for p in table()}
    names = set(ns)
    assert resolve_notebook_parameters({**ns, "workload": "cnn"}, names).lr == 1.0
    with pytest.raises(ConfigError, match="'width' is a parameter of workload resnet18, not cnn"):
        resolve_notebook_parameters({**ns, "workload": "cnn", "width": 16}, names)


def test_help_groups_common_then_each_workload(capsys, monkeypatch):
    with pytest.raises(SystemExit) as stop:
        cli_in_process(capsys, monkeypatch, "--help")
    out = capsys.readouterr().out
    assert stop.value.code == 0
    i_common, i_res, i_cnn, i_dcrnn = (
        out.index(h) for h in ("common parameters:", "workload resnet18:", "workload cnn:", "workload dcrnn:")
    )
    assert i_common < i_res < i_cnn < i_dcrnn
    assert out.index("\n  --width") > i_res and out.index("\n  --lr_gamma") > i_cnn and out.index("\n  --gpus") < i_res
    assert out.index("\n  --gp ") > i_dcrnn
    assert "per workload: resnet18 0.2, cnn 1.0, dcrnn 0.01" in " ".join(out.split())


def test_param_names_are_unique_across_workloads():
    names = [p.name for p in table()]
    assert len(names) == len(set(names))


@pytest.mark.integration
def test_study_file_with_a_parameter_of_another_workload(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: local\nmode: strong\ngpus: [1]\nfixed: {workload: cnn, batch: 64, width: 8}\n")
    p = subprocess.run(
        [sys.executable, "-m", "kernels.slurm.study", "submit", str(path), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "LAB_RESULTS": str(tmp_path)},
    )
    assert p.returncode == 2 and "'width' is a parameter of workload resnet18, not cnn" in p.stderr


# ------------------------------------------------------------------ the CNN
CNN = [
    *TINY[2:],
    "--workload",
    "cnn",
    "--dataset",
    "digits",
    "--train_samples",
    "128",
    "--test_samples",
    "64",
    "--batch",
    "32",
    "--seed",
    "5",
    "--dropout",
    "false",
    "--lr_gamma",
    "1.0",
]


@pytest.mark.integration
def test_cnn_two_rank_ddp_equals_one_process_with_two_micro_batches(tmp_path):
    """As for ResNet-18: 2 gloo ranks x 16 == 1 process x 2 micro-batches of 16 (same global batch of 32).

    Dropout off (its masks depend on the rank's random stream); no BatchNorm in this net,
    so the two runs compute the same mean gradient and differ by reduction order only.
    """
    from test_ddp import flat, only_run

    def weights(name, *args):
        out = tmp_path / name
        p = run_cli(*merge_args(*CNN, "--epochs", "1", "--lr", "0.5", *args, "--results_dir", out))
        assert p.returncode == 0, p.stdout + p.stderr
        state = load_checkpoint(only_run(out) / "checkpoint.pt")
        return flat(state["model"]), state

    w0, _ = weights("init", "--gpus", "1", "--lr", "1e-30", "--stop_after_steps", "2")
    wa, sa = weights("ddp", "--gpus", "2", "--stop_after_steps", "2")
    wb, sb = weights("single", "--gpus", "1", "--micro_batches", "2", "--stop_after_steps", "2")
    wc, _ = weights("other", "--gpus", "1", "--stop_after_steps", "2", "--batch", "16")  # other samples: a real change
    assert sa["global_step"] == sb["global_step"] == 2
    rel = ((wa - w0) - (wb - w0)).norm() / (wa - w0).norm()
    rel_other = ((wa - w0) - (wc - w0)).norm() / (wa - w0).norm()
    assert rel < 1e-4, (rel, rel_other)
    assert rel_other > 0.1, rel_other
