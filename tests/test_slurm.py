"""sbatch slurm/papermill_run.sbatch against a real Slurm: two emulated nodes on loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, merge_p
from kernels.records import schema as records

pytestmark = pytest.mark.system

TINY_P = [
    "-p",
    "dataset",
    "digits",
    "-p",
    "width",
    "4",
    "-p",
    "epochs",
    "1",
    "-p",
    "batch",
    "64",
    "-p",
    "precision",
    "fp32",
    "-p",
    "train_samples",
    "256",
    "-p",
    "test_samples",
    "64",
    "-p",
    "timing_warmup_steps",
    "1",
    "-p",
    "comm_probe_steps",
    "2",
    "-p",
    "log_every",
    "0",
]


def sbatch(slurm, tmp_path, opts, script_args, cmd=None, timeout=300):
    """sbatch OPTS slurm/papermill_run.sbatch SCRIPT_ARGS on the test cluster, then wait for the job.

    Returns (job id, exit status, the job's output file). The queue is polled every half
    second (sbatch --wait backs off to tens of seconds). A job still there after `timeout`
    is cancelled and fails the test.
    """
    env = {
        **os.environ,
        "SLURM_CONF": slurm["SLURM_CONF"],
        "MASTER_ADDR": "127.0.0.1",  # n1/n2 don't resolve
        "LAB_RESULTS": str(tmp_path),
    }
    out = tmp_path / "job-%j.out"
    full = cmd or [
        "sbatch",
        "--time=00:10:00",
        f"--output={out}",
        "--cpus-per-task=1",
        *opts,
        "slurm/papermill_run.sbatch",
    ]
    p = subprocess.run([*full, *map(str, script_args)], cwd=ROOT, env=env, capture_output=True, text=True)
    m = re.search(r"Submitted batch job (\d+)", p.stdout)
    assert m, p.stdout + p.stderr
    job = m.group(1)
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=env)
            pytest.fail(f"job {job} still queued or running after {timeout} s: {' '.join(map(str, full))}")
        time.sleep(0.5)
    info = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    rc = int(re.search(r"\bExitCode=(\d+):", info).group(1))
    log = tmp_path / f"job-{job}.out"
    return job, rc, log.read_text() if log.exists() else ""


def job_state(slurm, job) -> str:
    p = subprocess.run(
        ["scontrol", "show", "job", job],
        env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]},
        capture_output=True,
        text=True,
    )
    return re.search(r"JobState=(\S+)", p.stdout).group(1)


def test_four_ranks_across_two_nodes_end_to_end(slurm, tmp_path):
    res = tmp_path / "runs"
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2"],
        ["notebooks/01_train.ipynb", "-p", "gpus", "4", *TINY_P, "-p", "results_dir", res],
    )
    assert rc == 0, log
    assert job_state(slurm, job) == "COMPLETED"
    run = res / f"resnet18-digits-g4-j{job}"
    cfg = json.loads((run / "config.json").read_text())
    # one process group of 4 ranks spanning both nodes, 2 ranks on each
    assert cfg["derived"]["world_size"] == 4 and cfg["derived"]["launch_source"] == "slurm"
    assert sorted(r["global_rank"] for r in cfg["ranks"]) == [0, 1, 2, 3]
    by_node = {}
    for r in cfg["ranks"]:
        by_node.setdefault(r["node"], []).append(r["local_rank"])
    assert {n: sorted(v) for n, v in by_node.items()} == {"n1": [0, 1], "n2": [0, 1]}
    assert cfg["nodes"] == ["n1", "n2"] and cfg["derived"]["nodes"] == 2
    assert cfg["slurm"]["slurm_job_id"] == job and cfg["slurm"]["slurm_job_nodelist"] == "n[1-2]"
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
    assert (run / f"01_train-{job}.ipynb").exists() and (run / f"01_train-{job}.html").exists()
    # the job log shows the environment overrides and the streamed progress
    assert "env: NCCL_DEBUG=WARN" in log and "env: TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in log
    assert "srun --ntasks=4 --nodes=2" in log and "epoch 1/1 done" in log
    # Slurm's accounting in the record: this cluster keeps no accounting database, and while the job runs its
    # completion log has no line for it either, so the record notes why, in sacct's words, and the job succeeds
    entry = records.read_json(run / "sacct.json")["jobs"][job]
    assert entry["available"] is False and "accounting storage is disabled" in entry["note"], entry
    assert "sacct: not available (accounting database: sacct exited 1" in log
    # after the job, its completion log has it: the record then holds Slurm's own final view
    p = subprocess.run(
        [sys.executable, "-m", "kernels.slurm.accounting", "store", job, str(run)],
        cwd=ROOT,
        env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and f"sacct: job {job} COMPLETED" in p.stdout, p.stdout + p.stderr
    (row,) = records.read_json(run / "sacct.json")["jobs"][job]["rows"]
    assert row["state"] == "COMPLETED" and row["nodes"] == 2 and row["elapsed_s"] >= 1, row


def test_the_readme_four_gpu_node_form_runs_as_written(slurm, tmp_path, monkeypatch):
    """docs/cluster.md's lines for 4-GPU nodes, run as written on the local `quad` partition (4 placeholder GPUs a
    node, CPU ranks): the account, partition and QoS reach sbatch through its SBATCH_* variables, the geometry
    comes from the sbatch line, and 8 ranks on 2 nodes train. Only the partition's value is the local one; the
    notebook gets the tiny parameters after the line's own."""
    import shlex

    readme = (ROOT / "docs" / "cluster.md").read_text()
    export, line = re.search(
        r"\n {4}(export SBATCH_ACCOUNT=.*?)\s+#.*\n {4}(sbatch --nodes=2 .*-p gpus 8)\n", readme
    ).groups()
    env = dict(kv.split("=", 1) for kv in shlex.split(export)[1:])
    assert set(env) == {"SBATCH_ACCOUNT", "SBATCH_PARTITION", "SBATCH_QOS"}
    env["SBATCH_PARTITION"] = "quad"
    for k, v in {**env, "OMP_NUM_THREADS": "1"}.items():  # 1 thread a rank: 8 ranks share this machine's 2 cores
        monkeypatch.setenv(k, v)
    res = tmp_path / "runs"
    words = shlex.split(line)
    at = words.index("slurm/papermill_run.sbatch")  # the job log goes to tmp_path: an option before the script
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        [],
        TINY_P + ["-p", "results_dir", res],
        cmd=words[:at] + [f"--output={tmp_path}/job-%j.out"] + words[at:],
    )
    assert rc == 0, log
    info = subprocess.run(
        ["scontrol", "show", "job", job],
        env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]},
        capture_output=True,
        text=True,
    ).stdout
    # the QoS cannot be seen here: a Slurm without an accounting database drops it (QOS=(null))
    assert "Partition=quad" in info and "Account=ehpc123" in info, info
    cfg = json.loads((res / f"resnet18-digits-g8-j{job}" / "config.json").read_text())
    per_node = {}
    for r in cfg["ranks"]:
        per_node.setdefault(r["node"], []).append(r["local_rank"])
    assert {n: sorted(v) for n, v in per_node.items()} == {"n1": [0, 1, 2, 3], "n2": [0, 1, 2, 3]}
    assert json.loads((res / f"resnet18-digits-g8-j{job}" / "summary.json").read_text())["status"] == "complete"


def test_jupyterlab_on_a_compute_node_prints_the_tunnel_and_serves_the_notebooks(slurm, tmp_path):
    """`sbatch slurm/jupyter.sbatch` as the README writes it (on the local 4-GPU-node partition): the job log
    gives the ssh tunnel and where the token is (a 0600 file; the token itself never reaches the log); a request
    as the tunnel delivers it (to the node's port, Host 127.0.0.1) reaches JupyterLab, which opens
    notebooks/01_train.py as a notebook, and without the token is refused; scancel ends it."""
    import urllib.error
    import urllib.request

    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "SBATCH_PARTITION": "quad"}
    p = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/jl-%j.out", "slurm/jupyter.sbatch"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    job, log = p.stdout.strip(), tmp_path / f"jl-{p.stdout.strip()}.out"
    try:
        deadline, text = time.monotonic() + 120, ""
        while "Jupyter Server" not in text and "is running at" not in text and time.monotonic() < deadline:
            time.sleep(0.5)
            text = log.read_text(errors="replace") if log.exists() else ""
        tunnel = re.search(r"on your laptop:  ssh -N -L (\d+):(\S+):(\d+) \S+@\S+", text)
        assert tunnel and tunnel.group(1) == tunnel.group(3), text
        port, node = tunnel.group(1), tunnel.group(2)
        token_file = Path(re.search(r"TOKEN from: cat (\S+) \(readable by you only\)", text).group(1))
        token = token_file.read_text().strip()
        assert token_file.stat().st_mode & 0o777 == 0o600 and len(token) >= 32
        url = f"http://{node}:{port}/api/contents/notebooks/01_train.py?content=0"
        for _ in range(60):
            try:
                req = urllib.request.Request(f"{url}&token={token}", headers={"Host": f"127.0.0.1:{port}"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert json.loads(r.read())["type"] == "notebook"  # jupytext: the .py source opens as a notebook
                break
            except urllib.error.URLError as e:  # the server prints its banner as it starts listening
                if isinstance(e, urllib.error.HTTPError):
                    raise
                time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, headers={"Host": f"127.0.0.1:{port}"}), timeout=30)
        assert e.value.code == 403
        assert token not in log.read_text(errors="replace")
    finally:
        subprocess.run(["scancel", job], env=env)
        (ROOT / "results" / "logs" / f"lab-jupyter-{job}.token").unlink(missing_ok=True)
    deadline = time.monotonic() + 60
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} still there after scancel"
        time.sleep(0.5)


def test_profile_notebook_across_two_nodes_leaves_traces_breakdown_monitor_and_verdict(slurm, tmp_path):
    """The issue's acceptance run: 02_profile through the batch script, 4 ranks on the two emulated nodes."""
    res = tmp_path / "runs"
    p = merge_p(
        *TINY_P,
        "-p",
        "epochs",
        "2",
        "-p",
        "profile_wait",
        "1",
        "-p",
        "profile_warmup",
        "1",
        "-p",
        "profile_steps",
        "2",
        "-p",
        "checkpoint_every",
        "0",
        "-p",
        "results_dir",
        res,
        "-p",
        "monitor_hz",
        "5",
    )
    # the training loop must span several sampling intervals for the summary's monitor to have samples in it:
    # 8 steps of this tiny model took 0.43 s once, under one 2 Hz interval
    p[p.index("train_samples") + 1] = "1024"
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2"],
        ["notebooks/02_profile.ipynb", "-p", "gpus", "4", *p],
    )
    assert rc == 0, log
    run = res / f"resnet18-digits-g4-j{job}"
    traces = sorted(t.name for t in (run / "traces").iterdir())
    assert traces == [f"rank{r}-j{job}.pt.trace.json.gz" for r in range(4)]
    bd = pd.read_csv(run / "breakdown.csv")
    assert set(bd["rank"].astype(str)) == {"0", "1", "2", "3", "all"}
    mon = pd.read_csv(run / "monitor.csv")
    assert sorted(mon["node"].unique()) == ["n1", "n2"]  # one sampler per node
    summary = json.loads((run / "summary.json").read_text())
    assert summary["profile"]["ranks"] == 4 and summary["monitor"]["nodes"] == 2
    assert summary["bottleneck"]["verdict"] in ("data", "communication", "compute")
    assert (run / f"02_profile-{job}.ipynb").exists() and (run / f"02_profile-{job}.html").exists()


def test_bad_parameter_fails_the_job_with_the_reason_and_no_record(slurm, tmp_path):
    res = tmp_path / "runs"
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2"],
        ["notebooks/01_train.ipynb", "-p", "gpus", "2", *TINY_P, "-p", "results_dir", res, "-p", "precison", "bf16"],
    )
    assert rc != 0
    assert job_state(slurm, job) == "FAILED"
    assert "unknown parameter 'precison'" in log and "did you mean 'precision'" in log
    assert not res.exists()


def test_allocation_too_small_names_the_sbatch_options(slurm, tmp_path):
    res = tmp_path / "runs"
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2"],
        ["notebooks/01_train.ipynb", "-p", "gpus", "4", *TINY_P, "-p", "results_dir", res],
    )
    assert rc != 0 and job_state(slurm, job) == "FAILED"
    assert "gpus=4 but the allocation" in log
    assert "sbatch --nodes=2 --ntasks-per-node=2 --gpus-per-node=2" in log
    assert not res.exists()


def test_unknown_notebook_fails_the_job(slurm, tmp_path):
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=1"],
        ["notebooks/missing.ipynb", "-p", "gpus", "1"],
    )
    assert rc == 2 and job_state(slurm, job) == "FAILED"
    assert "notebooks/missing.ipynb not found" in log


def test_submit_helper_computes_geometry_and_submits(slurm, tmp_path):
    res = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "kernels.notebook.submit",
        "notebooks/01_train.ipynb",
        "--gpus",
        "4",
        "--gpus-per-node",
        "2",
        "--time",
        "00:10:00",
        f"--sbatch-arg=--output={tmp_path}/job-%j.out",
        "--sbatch-arg=--cpus-per-task=1",
    ]
    job, rc, log = sbatch(slurm, tmp_path, [], [*TINY_P, "-p", "results_dir", res, "-p", "label", "helper"], cmd=cmd)
    assert rc == 0, log
    assert "job %s on n[1-2]: 2 node(s), 4 task(s), 2 GPU(s)/node" % job in log
    assert json.loads((res / f"resnet18-digits-g4-helper-j{job}" / "summary.json").read_text())["status"] == "complete"


def test_submit_helper_dry_run_and_bad_geometry():
    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "kernels.notebook.submit", "notebooks/01_train.ipynb", *a, "--dry-run"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )

    p = run("--gpus", "8", "--gpus-per-node", "4", "-p", "epochs", "5")
    assert p.returncode == 0
    assert p.stdout.strip() == (
        "sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 slurm/papermill_run.sbatch "
        "notebooks/01_train.ipynb -p gpus 8 -p epochs 5"
    )
    p = run("--gpus", "2", "--gpus-per-node", "8")
    assert "--nodes=1 --ntasks-per-node=2 --gpus-per-node=2 " in p.stdout
    p = run("--gpus", "6", "--gpus-per-node", "4")
    assert p.returncode == 2 and "use gpus=4 or 8" in p.stderr
    p = run("--gpus", "4", "--gpus-per-node", "0", "--ranks-per-node", "2")
    assert "--nodes=2 --ntasks-per-node=2 --gpus-per-node=0 " in p.stdout
    # a cluster profile supplies what is not given; what is given wins
    p = run("--gpus", "8", "--cluster", "marenostrum5-acc", "--account", "ehpc123", "--time", "00:30:00")
    assert p.returncode == 0 and p.stdout.startswith(
        "sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --partition=acc --account=ehpc123 --qos=acc_ehpc "
        "--time=00:30:00 --cpus-per-task=20 --export=ALL,LAB_NCCL_IFNAME=ib0 slurm/papermill_run.sbatch"
    ), p.stdout + p.stderr
    p = run("--gpus", "8", "--cluster", "leonardo-booster")
    assert "--partition=boost_usr_prod" in p.stdout and "has no account" in p.stderr
    p = run("--gpus", "8")
    assert p.returncode == 2 and "--gpus-per-node" in p.stderr and "--cluster NAME" in p.stderr
    p = run("--gpus", "8", "--cluster", "nowhere")
    assert p.returncode == 2 and "no cluster profile" in p.stderr and "leonardo-booster" in p.stderr


def test_dcrnn_graph_split_across_two_nodes_through_01_train(slurm, tmp_path):
    """DCRNN with gp=2 on two emulated nodes, one rank each: the halo exchange crosses nodes."""
    from kernels.data import traffic

    data = tmp_path / "data"
    traffic.write_synthetic(traffic.directory("synthetic", data), 300, 40, progress=lambda m: None)
    res = tmp_path / "runs"
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1"],
        [
            "notebooks/01_train.ipynb",
            "-p",
            "workload",
            "dcrnn",
            "-p",
            "gpus",
            "2",
            "-p",
            "gp",
            "2",
            "-p",
            "dataset",
            "synthetic",
            "-p",
            "data_dir",
            data,
            "-p",
            "rnn_units",
            "8",
            "-p",
            "batch",
            "8",
            "-p",
            "epochs",
            "1",
            "-p",
            "train_samples",
            "32",
            "-p",
            "test_samples",
            "16",
            "-p",
            "log_every",
            "0",
            "-p",
            "comm_probe_steps",
            "0",
            "-p",
            "results_dir",
            res,
        ],
    )
    assert rc == 0, log
    run = res / f"dcrnn-synthetic-g2-j{job}"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["nodes"] == ["n1", "n2"] and cfg["derived"]["launch_source"] == "slurm"
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "complete" and (s["workload"]["dp"], s["workload"]["gp"]) == (1, 2)
    assert [r["host"] for r in s["ranks"]] and all(r["halo_bytes_per_step"] > 0 for r in s["ranks"])
    assert s["final_eval_mae_15min"] > 0 and (run / f"01_train-{job}.html").exists()
