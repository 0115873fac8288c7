"""Studies, sweeps, cluster profiles, SYSTEM.md and the Apptainer wrapper."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kernels.analysis import runs as analysis
from kernels import report
from kernels.slurm import study, sweep
from kernels.base import sysinfo
from kernels.base.params import ConfigError

from conftest import ROOT

pytestmark = pytest.mark.integration

TINY = {
    "dataset": "digits",
    "width": 4,
    "epochs": 1,
    "precision": "fp32",
    "train_samples": 256,
    "test_samples": 64,
    "timing_warmup_steps": 1,
    "comm_probe_steps": 2,
    "log_every": 0,
}


def write_study(tmp_path: Path, name: str, **spec) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "cluster": "local", **spec}))
    return path


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize(
    "spec,needle",
    [
        (
            {"mode": "strong", "gpus": [1], "fixed": {"batch": 64}, "repeat": 2},
            "unknown key 'repeat'; did you mean 'repeats'?",
        ),
        (
            {"mode": "strong", "gpus": [3], "fixed": {"batch": 60}},
            "key 'gpus': parameter 'gpus': 3 ranks do not fill nodes of 2",
        ),
        (
            {"mode": "strong", "gpus": [8], "fixed": {"batch": 64}},
            "key 'gpus': 8 needs 4 nodes but cluster 'local' has 2",
        ),
        (
            {"mode": "sweep", "gpus": [1], "fixed": {"batch": 64}, "sweep": {"bucket_cap_mb": []}},
            "key 'sweep.bucket_cap_mb': an empty grid",
        ),
        ({"mode": "strong", "gpus": [1, 2, 1], "fixed": {"batch": 64}}, "key 'gpus' lists a GPU count twice"),
        ({"mode": "sweep", "gpus": [1], "sweep": {"batch": [32, 32]}}, "key 'sweep.batch' lists a value twice"),
        ({"mode": "strong", "gpus": [1], "fixed": {"bach": 64}}, "key 'fixed/sweep.bach': not a parameter"),
        ({"mode": "weak", "gpus": [1, 2], "fixed": {"batch": 64}}, "key 'fixed.batch_per_gpu'"),
        (
            {"mode": "strong", "gpus": [1], "fixed": {"batch": 64}, "cluster": "nowhere"},
            "key 'cluster': no cluster profile",
        ),
        ({"mode": "strongest", "gpus": [1]}, "key 'mode'"),
    ],
)
def test_bad_study_files_are_rejected_before_submission(tmp_path, spec, needle):
    spec = {"cluster": "local", **spec}
    path = write_study(tmp_path, "bad", **spec)
    p = cli("kernels.slurm.study", "submit", path, env={"LAB_RESULTS": str(tmp_path / "res")})
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr, p.stderr
    assert "sbatch" not in p.stdout and not (tmp_path / "res").exists()


def test_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ncluster: local\ngpus: [1, 2\nmode: strong\n")
    p = cli("kernels.slurm.study", "submit", path, env={"LAB_RESULTS": str(tmp_path / "res")})
    assert p.returncode == 2
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(rf"study file {re.escape(str(path))}:\d+:\d+: YAML syntax error", err), err


def test_points_can_be_written_and_printed_for_the_rerun_recipe(tmp_path):
    env = {"LAB_RESULTS": str(tmp_path)}
    p = cli("kernels.slurm.study", "points", ROOT / "studies" / "strong_resnet18.yaml", "--write", env=env)
    assert p.returncode == 0, p.stderr
    files = sorted((tmp_path / "studies" / "strong_resnet18" / "points").glob("p*.yaml"))
    assert len(files) == 21 and files[12].name == "p012.yaml"
    params = yaml.safe_load(files[12].read_text())
    assert params["run_id"] == "strong_resnet18-p012" and params["gpus"] == 16 and params["batch"] == 512
    p = cli("kernels.slurm.study", "points", ROOT / "studies" / "strong_resnet18.yaml", "--point", "12", env=env)
    assert yaml.safe_load(p.stdout) == params
    p = cli("kernels.slurm.study", "points", ROOT / "studies" / "strong_resnet18.yaml", "--point", "99", env=env)
    assert p.returncode == 2 and "points 0..20, not 99" in p.stderr


def test_cluster_qos_and_missing_account(tmp_path):
    prof = tmp_path / "prod.yaml"
    prof.write_text(yaml.safe_dump({"name": "prod", "partition": "gpu", "qos": "normal", "gpus_per_node": 4}))
    path = write_study(tmp_path, "q", mode="strong", gpus=[4], fixed={"batch": 64}, cluster=str(prof))
    p = cli("kernels.slurm.study", "submit", path, "--dry-run", env={"LAB_RESULTS": str(tmp_path / "res")})
    assert p.returncode == 0, p.stderr
    assert "--qos=normal" in p.stdout and "--partition=gpu" in p.stdout
    assert "has no account" in p.stderr and "account:" in p.stderr


@pytest.mark.unit
def test_points_strong_weak_and_sweep():
    s = study.load(ROOT / "studies" / "weak_resnet18.yaml")
    assert [(p.gpus, p.params["batch"]) for p in s.points if p.repeat == 0] == [
        (n, 128 * n) for n in (1, 2, 4, 8, 16, 32, 64)
    ]
    assert {p.params["seed"] for p in s.points} == {0, 1, 2}  # repeats are independent samples
    assert [(p.nodes, p.tasks_per_node) for p in s.points if p.repeat == 0][-1] == (16, 4)
    sens = study.load(ROOT / "studies" / "sensitivity_resnet18.yaml")
    assert len(sens.points) == 3 * 2 * 2 * 2 and len({p.run_id for p in sens.points}) == 24
    strong = study.load(ROOT / "studies" / "strong_resnet18.yaml")
    assert {p.params["batch"] for p in strong.points} == {512}


def test_dry_run_prints_one_array_per_geometry(tmp_path):
    p = cli(
        "kernels.slurm.study",
        "submit",
        ROOT / "studies" / "strong_resnet18.yaml",
        "--dry-run",
        env={"LAB_RESULTS": str(tmp_path)},
    )
    assert p.returncode == 0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("sbatch")]
    assert len(lines) == 7  # 1,2,4 GPUs on one node; 8..64 on 2..16 nodes of 4
    assert "--array=0-2 --job-name=strong_resnet18 --nodes=16 --ntasks-per-node=4 --gpus-per-node=4" in lines[
        -1
    ] or any("--nodes=16 --ntasks-per-node=4 --gpus-per-node=4" in ln for ln in lines)
    assert all("LAB_STUDY_ID=strong_resnet18" in ln and "--partition=acc" in ln for ln in lines)
    # a printed line runs when copied: the parameter list it names, and each point file in it, exist
    lists = [re.search(r"LAB_ARRAY_PARAMS=([^,\s]+)", ln).group(1) for ln in lines]
    for ln, lst in zip(lines, lists):
        files = Path(lst).read_text().split()
        assert len(files) == int(re.search(r"--array=0-(\d+)", ln).group(1)) + 1
        assert all("run_id: strong_resnet18-p" in Path(f).read_text() for f in files)
    assert (tmp_path / "logs").is_dir() and "the line runs as printed" in p.stdout
    assert not (tmp_path / "studies" / "strong_resnet18" / "submissions.json").exists()


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted((ROOT / "studies").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_study_file_loads(path):
    """Every committed study is a valid grid of checked points (the briefs' grids among them)."""
    s = study.load(path)
    assert s.points and s.name  # a study may name itself other than its file (commbench_mn5: the system)


@pytest.mark.unit
def test_the_completion_guides_geometry_puts_one_gpu_on_each_of_two_nodes():
    s = study.load(ROOT / "studies" / "two_nodes_one_gpu.yaml")
    shapes = sorted({(p.gpus, p.nodes, p.tasks_per_node, p.params["precision"]) for p in s.points})
    assert shapes == [(1, 1, 1, "fp16"), (1, 1, 1, "fp32"), (2, 2, 1, "fp16"), (2, 2, 1, "fp32")]


@pytest.mark.unit
def test_the_briefs_12_gpu_point_runs_a_rounded_batch_and_stays_in_its_series(tmp_path):
    """Global batch 512 at 12 GPUs (the ResNet-18 plan's grid): with batch_rounding: down the point runs 504, 42 per
    GPU, its jobs name the study's batch, and the analysis keeps it in the B=512 series, showing its own batch."""
    from test_paper import write_record

    s = study.load(ROOT / "studies" / "strong_resnet18_seed.yaml")
    assert sorted({(p.gpus, p.params["batch"]) for p in s.points}) == [
        (1, 512),
        (2, 512),
        (4, 512),
        (8, 512),
        (12, 504),
    ]
    assert s.env["LAB_STUDY_BATCH"] == "512"
    spec = yaml.safe_load((ROOT / "studies" / "strong_resnet18_seed.yaml").read_text())
    spec.pop("name")
    with pytest.raises(ConfigError, match="not divisible by gpus=12"):
        study.load(write_study(tmp_path, "plain", **{k: v for k, v in spec.items() if k != "batch_rounding"}))
    with pytest.raises(ConfigError, match="key 'batch_rounding': 'up'; the only value is down"):
        study.load(write_study(tmp_path, "up", **{**spec, "batch_rounding": "up"}))
    runs = tmp_path / "runs"
    for n, x in {1: 1000.0, 2: 1900.0, 12: 9000.0}.items():
        b = 12 * 42 if n == 12 else 512
        write_record(runs, f"r{n}", gpus=n, batch=b, x=x, lab_ids={"lab_study_batch": "512"})
    scal = analysis.scaling(analysis.load_runs(runs, {"labels": ["t"]})[0])
    strong = scal[scal["mode"] == "strong"].set_index("gpus")
    assert list(strong.index) == [1, 2, 12] and strong["series"].nunique() == 1
    assert strong.loc[12, "batch"] == 504 and "B=512" in strong.loc[12, "series"]
    assert strong.loc[12, "efficiency"] == pytest.approx(9000 / 12 / 1000)


@pytest.mark.unit
def test_a_serial_studys_repeats_interleave_across_scales(tmp_path):
    """A serial study runs its arrays one after another: one per (repeat, geometry), repeats first, so the runs
    go 1, 2, 1, 2 GPUs and a passing load touches both scales; a parallel study keeps one array per geometry."""
    spec = yaml.safe_load((ROOT / "studies" / "demo_strong.yaml").read_text())
    spec.update(gpus=[1, 2], repeats=3)
    spec.pop("name")
    serial = study.load(write_study(tmp_path, "s", **{**spec, "serial": True}))
    order = [(p.gpus, p.repeat) for _, pts in study.arrays(serial.points, serial.serial) for p in pts]
    assert order == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]
    parallel = study.load(write_study(tmp_path, "p", **spec))
    groups = study.arrays(parallel.points, parallel.serial)
    assert [(geom, [p.repeat for p in pts]) for geom, pts in groups] == [((1, 1), [0, 1, 2]), ((1, 2), [0, 1, 2])]


@pytest.mark.unit
def test_moving_a_study_changes_only_the_cluster_profile(tmp_path):
    spec = yaml.safe_load((ROOT / "studies" / "strong_resnet18.yaml").read_text())
    spec.pop("name")
    a = study.load(write_study(tmp_path, "a", **{**spec, "cluster": "marenostrum5-acc"}))
    b = study.load(write_study(tmp_path, "a", **{**spec, "cluster": "leonardo-booster"}))
    assert [p.params for p in a.points] == [p.params for p in b.points]
    ca = study.sbatch_command(a, 2, 4, 3, tmp_path / "l.txt")
    cb = study.sbatch_command(b, 2, 4, 3, tmp_path / "l.txt")
    assert "--partition=acc" in ca and "--partition=boost_usr_prod" in cb


@pytest.mark.unit
def test_sweep_file_errors():
    with pytest.raises(ConfigError, match="key 'command' uses x not in 'grid'"):
        sweep.load(_tmp_yaml({"name": "s", "command": "echo {x}", "grid": {"y": [1]}}))
    with pytest.raises(ConfigError, match="key 'grid.y': an empty grid"):
        sweep.load(_tmp_yaml({"name": "s", "command": "echo {y}", "grid": {"y": []}}))
    with pytest.raises(ConfigError, match="unknown key 'grids'"):
        sweep.load(_tmp_yaml({"name": "s", "command": "echo", "grids": {}}))


def _tmp_yaml(d) -> Path:
    import tempfile

    f = Path(tempfile.mkdtemp()) / "s.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def test_system_md_describes_every_target_then_this_machine(tmp_path):
    """SYSTEM.md: a section per cluster profile (its limits, modules, container, links and stack from
    paper/systems.yaml) saying how to measure its nodes until their files exist, then the development machine."""
    facts = sysinfo.system_facts()
    md = "\n".join(sysinfo.node_sections([facts]))
    assert f"| CPU | {facts['cpu']}, {facts['cpu_cores']} logical cores |" in md
    assert f"| PyTorch | {facts['software']['torch']} |" in md
    assert any(n["name"] == "lo" for n in facts["network"])
    committed = (ROOT / "SYSTEM.md").read_text()
    assert committed.startswith("# SYSTEM") and "| PyTorch |" in committed and "Network interfaces" in committed
    assert re.search(r"Generated by `lab sysinfo[^`]*` on \d{4}-\d\d-\d\d \d\d:\d\d UTC from the cluster", committed)
    targets = committed.split("## Target systems", 1)[1].split("## Development machine", 1)[0]
    profiles = sorted(p.stem for p in (ROOT / "clusters").glob("*.yaml") if p.stem != "local")
    assert re.findall(r"^### ([\w-]+)", targets, re.M) == profiles
    assert "| GPUs | NVIDIA H100 64 GB (SXM), 4 per node |" in targets and "| modules | none listed" in targets
    assert "450 GB/s per GPU inside a node, 100 GB/s per node between nodes" in targets
    # a target's node files, written as on its nodes, replace "not measured yet" with what they measured
    systems = tmp_path / "system"
    p = cli(
        "kernels.cli", "sysinfo", "--json", "--out-dir", systems / "leonardo-booster", env={"SLURMD_NODENAME": "l1"}
    )
    assert p.returncode == 0, p.stderr
    out = tmp_path / "SYSTEM.md"
    p = cli("kernels.cli", "sysinfo", "--systems-dir", systems, "--out", out)
    assert p.returncode == 0 and facts["host"] in out.read_text()
    leonardo = out.read_text().split("### leonardo-booster", 1)[1].split("\n### ", 1)[0]
    assert f"| PyTorch | {facts['software']['torch']} |" in leonardo and "measured on | 1 node(s)" in leonardo
    assert "#### " in leonardo and "not measured yet" not in leonardo
    assert "not measured yet" in out.read_text().split("### marenostrum5-acc", 1)[1]


def test_sysinfo_merge_keeps_every_host_and_never_truncates(tmp_path):
    d = tmp_path / "nodes"
    assert cli("kernels.cli", "sysinfo", "--json", "--out-dir", d, env={"SLURMD_NODENAME": "n1"}).returncode == 0
    assert cli("kernels.cli", "sysinfo", "--json", "--out-dir", d, env={"SLURMD_NODENAME": "n2"}).returncode == 0
    assert sorted(f.name for f in d.iterdir()) == ["n1.json", "n2.json"]  # one file per node, even on one host
    out = tmp_path / "SYSTEM.md"
    p = cli("kernels.cli", "sysinfo", "--merge", d / "n1.json", d / "n2.json", "--out", out)
    assert p.returncode == 0, p.stderr
    md = out.read_text()
    assert "2 node(s) of the development machine" in md and "(n1)" in md and "(n2)" in md and "(identical nodes)" in md
    (d / "bad.json").write_text("{truncated")
    p = cli("kernels.cli", "sysinfo", "--merge", *sorted(d.iterdir()), "--out", out)
    assert p.returncode == 2 and "bad.json is not a node description" in p.stderr
    assert out.read_text() == md  # the failed merge left SYSTEM.md as it was


def test_apptainer_definition_and_wrapper():
    d = (ROOT / "apptainer" / "lab.def").read_text()
    assert re.search(r"^Bootstrap: docker$", d, re.M) and "From: {{ BASE }}" in d
    assert re.search(r"BASE=pytorch/pytorch:2\.13\.0-", d)
    for section in ("%arguments", "%files", "%post", "%environment", "%runscript", "%test", "%labels", "%help"):
        assert re.search(rf"^{section}$", d, re.M), section
    assert "-r /opt/lab/requirements.txt -c /opt/lab/constraints.txt" in d
    # InfiniBand/RoCE user space for NCCL, and a %test that requires its IB transport and a working torch.compile
    assert re.search(r"apt-get install .*rdma-core libibverbs1", d) and "ibverbs-providers" in d
    test = d.split("%test", 1)[1].split("%labels", 1)[0]
    assert "torch.compile" in test and "NET/IB" in test and "NCCL_SHM_DISABLE=1" in test
    run = str(ROOT / "apptainer" / "run.sh")
    env = {**os.environ, "LAB_NV": "1", "LAB_DATA": "/scratch/data", "LAB_CONTAINER": "/img/lab.sif"}
    p = subprocess.run(
        [run, "--print", "exec", "python", "-m", "kernels.train"], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0
    assert p.stdout.split() == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        f"{ROOT}:{ROOT}",
        "--bind",
        f"/scratch/data:{ROOT}/data",
        "--bind",
        f"{ROOT}/results:{ROOT}/results",
        "--pwd",
        str(ROOT),
        "/img/lab.sif",
        "python",
        "-m",
        "kernels.train",
    ]
    p = subprocess.run([run, "--print", "build"], capture_output=True, text=True, env={**env, "LAB_NV": "0"})
    assert p.stdout.split() == ["apptainer", "build", "/img/lab.sif", f"{ROOT}/apptainer/lab.def"]
    p = subprocess.run([run, "--print", "shell"], capture_output=True, text=True, env={**env, "LAB_NV": "0"})
    assert "--nv" not in p.stdout.split()
    assert subprocess.run([run, "nonsense"], capture_output=True).returncode == 2
    # without apptainer on PATH: a clear message, not "exec: apptainer: cannot execute: Is a directory"
    p = subprocess.run(
        [run, "exec", "python3", "-V"], capture_output=True, text=True, cwd=ROOT, env={**env, "PATH": "/usr/bin:/bin"}
    )
    assert p.returncode == 127 and "apptainer is not installed" in p.stderr and "LAB_CONTAINER" in p.stderr


# ----------------------------------------------------------- on real Slurm
def wait_for(jobs: list[str], env: dict, timeout: float = 480) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = subprocess.run(
            ["squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T"], capture_output=True, text=True, env=env
        )
        if not p.stdout.strip():
            return
        time.sleep(0.5)
    subprocess.run(["scancel", *jobs], env=env)
    pytest.fail(f"jobs {jobs} still queued or running after {timeout} s")


@pytest.mark.system
def test_study_submit_status_fail_resubmit_analyse(slurm, tmp_path, monkeypatch):
    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "LAB_RESULTS": str(tmp_path)}
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    runs = tmp_path / "runs"
    strong = write_study(
        tmp_path, "st", mode="strong", gpus=[1, 2, 4], repeats=2, fixed={**TINY, "batch": 64, "results_dir": str(runs)}
    )
    sens = write_study(
        tmp_path,
        "sens",
        mode="sweep",
        gpus=[2],
        repeats=1,
        fixed={**TINY, "results_dir": str(runs), "batch": 32},
        sweep={"bucket_cap_mb": [1, 25]},
    )
    # one point fails on purpose: a file where its run directory must go (like a full or broken file system)
    runs.mkdir()
    (runs / "st-p001").write_text("in the way")

    jobs = []
    for path in (strong, sens):
        p = cli("kernels.slurm.study", "submit", path, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        jobs += re.findall(r"submitted job array (\d+)", p.stdout)
    assert len(jobs) == 3 + 1  # strong: geometries 1x1, 1x2, 2x2; sensitivity: one array of 2
    wait_for(jobs, env)

    rows = study.status(study.load(strong))
    states = {r["point"]: r["state"] for r in rows}
    assert states == {0: "done", 1: "failed", 2: "done", 3: "done", 4: "done", 5: "done"}, rows
    failed = rows[1]
    assert "File exists" in failed["reason"] and "st-p001" in failed["reason"], failed
    p = cli("kernels.slurm.study", "status", strong, env=env)
    assert "done 5 running 0 failed 1 missing 0" in p.stdout and "File exists" in p.stdout
    assert all(r["state"] == "done" for r in study.status(study.load(sens)))

    # resubmission runs the failed point only
    finished = {
        r["run_id"]: json.loads((runs / r["run_id"] / "summary.json").read_text())["finished_utc"]
        for r in rows
        if r["state"] == "done"
    }
    (runs / "st-p001").unlink()
    p = cli("kernels.slurm.study", "resubmit", strong, env=env)
    assert p.returncode == 0 and "resubmitting 1 point(s): 1" in p.stdout, p.stdout + p.stderr
    wait_for(re.findall(r"submitted job array (\d+)", p.stdout), env)
    rows = study.status(study.load(strong))
    assert all(r["state"] == "done" for r in rows), rows
    for run_id, when in finished.items():
        assert json.loads((runs / run_id / "summary.json").read_text())["finished_utc"] == when

    # every record carries the study id, its point and its array index
    for r in rows:
        cfg = json.loads((runs / r["run_id"] / "config.json").read_text())
        assert cfg["lab"]["lab_study_id"] == "st" and cfg["lab"]["lab_study_point"] == f"p{r['point']:03d}"
        assert "slurm_array_task_id" in cfg["slurm"] and cfg["params"]["gpus"] == r["gpus"]

    # and the analysis computes the efficiencies from them
    recs, problems, _ = analysis.load_runs(runs, {"labels": ["st"]})
    assert len(recs) == 6 and problems.empty
    scal = analysis.scaling(recs)
    strong_rows = scal[scal["mode"] == "strong"].set_index("gpus")
    # two repeats per point; one that shared its cores with the suite's other work while a quiet repeat exists
    # is left out of the point (kernels/analysis/trust.py: superseded)
    gone = {r for ids in strong_rows["superseded"] for r in ids}
    assert list(strong_rows.index) == [1, 2, 4]
    assert set(strong_rows["repeats"] + strong_rows["superseded"].map(len)) == {2}
    x = recs[~recs["run_id"].isin(gone)].groupby("gpus")["samples_per_s"].median()
    for n in (2, 4):
        assert abs(strong_rows.loc[n, "efficiency"] - (x[n] / n) / x[1]) < 1e-12
    plan = yaml.safe_load((ROOT / "paper" / "plan.yaml").read_text())
    systems = yaml.safe_load((ROOT / "paper" / "systems.yaml").read_text())
    built = report.build(runs, tmp_path / "analysis", plan, systems, select={"labels": ["st"]})
    assert len(built["runs"]) == 6
    for fig in ("throughput", "efficiency", "epoch_time"):
        assert (tmp_path / "analysis" / "figures" / f"{fig}.pdf").stat().st_size > 1000


@pytest.mark.system
def test_generic_sweep_runs_one_command_per_index(slurm, tmp_path, monkeypatch):
    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "LAB_RESULTS": str(tmp_path)}
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    spec = ROOT / "sweeps" / "product_grid.yaml"  # as shipped; its outputs go under LAB_RESULTS
    p = cli("kernels.slurm.sweep", "submit", spec, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    wait_for(re.findall(r"submitted job array (\d+)", p.stdout), env)
    rows = sweep.collect(sweep.load(spec))
    assert sorted((r["n"], r["m"], r["exit_code"], Path(r["stdout"]).read_text().strip()) for r in rows) == [
        (1, 10, 0, "10"),
        (1, 100, 0, "100"),
        (2, 10, 0, "20"),
        (2, 100, 0, "200"),
    ]
    for r in rows:  # each index keeps its own command line
        assert (Path(r["stdout"]).parent / "command.txt").read_text().strip().endswith(f"{r['n']} {r['m']}")


@pytest.mark.system
def test_mpi_allreduce_sweep_compiles_runs_and_collects_one_table(slurm, tmp_path, monkeypatch):
    """sweeps/allreduce_latency.yaml with a smaller grid: the setup compiles the C program with mpicc, each array
    task runs it under mpirun over the allocation, and collect parses every task's line into one table."""
    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "LAB_RESULTS": str(tmp_path)}
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    spec = yaml.safe_load((ROOT / "sweeps" / "allreduce_latency.yaml").read_text())
    spec["grid"] = {"ranks": [2, 4], "bytes": [8, 65536]}
    path = tmp_path / "allreduce_latency.yaml"
    path.write_text(yaml.safe_dump(spec))
    p = cli("kernels.slurm.sweep", "submit", path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "sweeps" / "allreduce_latency" / "allreduce_latency").is_file()  # built by the setup
    wait_for(re.findall(r"submitted job array (\d+)", p.stdout), env)
    rows = sweep.collect(sweep.load(path))
    assert sorted((r["ranks"], r["bytes"]) for r in rows) == [(2, 8), (2, 65536), (4, 8), (4, 65536)]
    for r in rows:
        assert r["exit_code"] == 0 and r["wrong"] == 0 and r["nranks"] == r["ranks"] and r["size_bytes"] == r["bytes"]
        assert 0 < r["min_us"] <= r["avg_us"] <= r["max_us"]
    table = (tmp_path / "sweeps" / "allreduce_latency" / "table.csv").read_text().splitlines()
    assert set(table[0].split(",")) >= {"index", "ranks", "bytes", "exit_code", "avg_us", "busbw_GBps", "wrong"}
    assert len(table) == 5
    p = cli("kernels.slurm.sweep", "collect", path, env=env)
    assert p.returncode == 0 and "avg_us" in p.stdout and "table.csv" in p.stdout, p.stdout + p.stderr


def test_sweep_setup_failure_submits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bad",
                "cluster": "local",
                "setup": "exit 3",
                "command": "echo {n}",
                "grid": {"n": [1]},
                "parse": "(?P<n>\\d+)",
            }
        )
    )
    p = cli("kernels.slurm.sweep", "submit", path)
    assert p.returncode == 2 and "setup failed (exit 3), nothing submitted" in p.stderr, p.stderr
    assert not (tmp_path / "sweeps" / "bad" / "commands.txt").exists()
    path.write_text(yaml.safe_dump({"name": "bad", "command": "echo {n}", "grid": {"n": [1]}, "parse": "\\d+"}))
    p = cli("kernels.slurm.sweep", "submit", path, "--dry-run")
    assert p.returncode == 2 and "key 'parse' needs named groups" in p.stderr, p.stderr
    path.write_text(
        yaml.safe_dump(
            {"name": "dry", "cluster": "local", "setup": "make prog", "command": "./prog {n}", "grid": {"n": [1, 2]}}
        )
    )
    p = cli("kernels.slurm.sweep", "submit", path, "--dry-run")  # the printed line names files that then exist
    listed = re.search(r"slurm/sweep_task.sbatch (\S+)", p.stdout).group(1)
    assert p.returncode == 0 and Path(listed).read_text().split("\n")[:2] == ["./prog 1", "./prog 2"], p.stdout
    assert "its setup has not run: run `make prog`" in p.stdout
