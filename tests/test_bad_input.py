"""Every bad input fails before any work, names the parameter and the fix, and writes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.launch import config
from kernels.base import params
from kernels.base.params import ConfigError
from kernels.launch.config import check_environment, resolve

from conftest import ROOT, cli_in_process, record_fault, run_cli

pytestmark = pytest.mark.unit

DIGITS = ["--dataset", "digits"]
NOTEBOOK = str(ROOT / "notebooks" / "01_train.ipynb")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpu", "2"], "unknown parameter 'gpu'.*did you mean 'gpus'"),
        (["--gpus", "0"], "parameter 'gpus': world size must be >= 1"),
        (["--gpus", "3", "--batch", "64"], "parameter 'batch': the global batch 64 is not divisible by gpus=3"),
        (["--precision", "fp8"], "parameter 'precision': unknown value 'fp8'"),
        (["--workload", "gpt2"], "parameter 'workload': unknown workload 'gpt2'; choose one of resnet18, cnn"),
        (["--pipeline", "dali"], "parameter 'pipeline': unknown value 'dali'"),
        (
            ["--dataset", "imagenet"],
            "parameter 'dataset': workload 'resnet18' takes cifar10, digits, synthetic, not 'imagenet'",
        ),
        (["--epochs", "two"], "parameter 'epochs': 'two' is not a valid int"),
        (["--compile", "maybe"], "parameter 'compile': 'maybe' is not a valid bool"),
        (["--device", "cpu", "--precision", "fp16"], "parameter 'precision': fp16 needs a GPU"),
        (["--batch", "64", "--micro_batches", "3"], "parameter 'micro_batches'"),
        (["--lr", "inf"], "parameter 'lr': 'inf' is not a finite number"),
        (["--weight_decay", "nan"], "parameter 'weight_decay': 'nan' is not a finite number"),
        (["--weight_decay", "-1"], "parameter 'weight_decay': must be >= 0, got -1.0"),
        (["--run_id", "my run"], "parameter 'run_id': 'my run' must be a plain directory name"),
        (["--epochs", "2", "--epochs", "3"], "parameter 'epochs' is given twice on the command line"),
        (["--gpus", "16", "--batch", "64"], "parameter 'gpus': 16 CPU ranks on this node but only \\d+ core"),
        (["--startup_timeout_min", "0"], "parameter 'startup_timeout_min': must be > 0"),
        (["--term_grace_s", "-1"], "parameter 'term_grace_s': must be > 0, got -1.0"),
    ],
)
def test_cli_rejects_bad_input_and_writes_nothing(tmp_path, capsys, monkeypatch, args, needle):
    import re

    results = tmp_path / "results"
    rc, _, err = cli_in_process(
        capsys, monkeypatch, *(DIGITS if "--dataset" not in args else []), *args, "--results_dir", results
    )
    assert rc == 2, err
    assert re.search(needle, err), err
    assert not results.exists()


@pytest.mark.integration
def test_the_process_exits_2_on_bad_input_and_writes_nothing(tmp_path):
    """The cases above call the CLI in-process; this one is the real process and its exit status."""
    results = tmp_path / "results"
    p = run_cli(*DIGITS, "--gpu", "2", "--results_dir", results)
    assert p.returncode == 2 and "unknown parameter 'gpu'" in p.stderr and "did you mean 'gpus'" in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and not results.exists()  # one line, no traceback


def test_fp16_on_a_machine_without_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(params, "visible_gpus", lambda: 0)
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        check_environment(resolve({"dataset": "digits", "precision": "fp16", "results_dir": str(tmp_path)}))


def test_more_gpus_than_visible(tmp_path, monkeypatch):
    monkeypatch.setattr(params, "visible_gpus", lambda: 2)
    cfg = resolve({"dataset": "digits", "gpus": 4, "device": "cuda", "batch": 64, "results_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"parameter 'gpus': 4 ranks on this node but only 2 GPU\(s\) visible"):
        check_environment(cfg)
    check_environment(cfg, ranks_on_this_node=2)  # spread over nodes by srun: fine here


def test_cuda_requested_without_gpu(tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():  # pragma: no cover - a GPU machine
        pytest.skip("a GPU is visible")
    rc, _, err = cli_in_process(capsys, monkeypatch, *DIGITS, "--device", "cuda", "--results_dir", tmp_path / "r")
    assert rc == 2 and ("parameter 'device'" in err or "parameter 'gpus'" in err), err


def test_unwritable_results_dir(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    rc, _, err = cli_in_process(capsys, monkeypatch, *DIGITS, "--results_dir", blocker / "runs")
    assert rc == 2 and "parameter 'results_dir'" in err and "not writable" in err


def test_missing_dataset_names_fetch_command(tmp_path, capsys, monkeypatch):
    rc, _, err = cli_in_process(
        capsys, monkeypatch, "--dataset", "cifar10", "--data_dir", tmp_path / "empty", "--results_dir", tmp_path / "r"
    )
    assert rc == 2
    assert "lab fetch cifar10" in err
    assert not (tmp_path / "r").exists()


def test_corrupt_dataset_rejected_before_any_record(cifar_root, tmp_path, capsys, monkeypatch):
    from kernels.data import cifar10

    root, _, _ = cifar_root  # the official md5s refuse this set's files: the first checked is data_batch_1
    f = cifar10.batch_dir(root) / "data_batch_1"
    f.write_bytes(f.read_bytes()[:-10])
    rc, _, err = cli_in_process(
        capsys, monkeypatch, "--dataset", "cifar10", "--data_dir", root, "--results_dir", tmp_path / "r"
    )
    assert rc == 2 and "data_batch_1" in err and "checksum mismatch" in err
    assert not (tmp_path / "r").exists()


def test_batch_larger_than_dataset_fails_before_record(tmp_path, capsys, monkeypatch):
    rc, _, err = cli_in_process(
        capsys,
        monkeypatch,
        *DIGITS,
        "--batch",
        "512",
        "--train_samples",
        "100",
        "--width",
        "4",
        "--results_dir",
        tmp_path / "r",
    )
    assert rc == 2 and "fewer than one global batch" in err
    assert not (tmp_path / "r").exists()


def test_notebook_style_values_are_typed_strictly():
    cfg = resolve({"gpus": "2", "batch": 64.0, "compile": "false", "lr": "0.1"})
    assert (cfg.gpus, cfg.batch, cfg.compile, cfg.lr) == (2, 64, False, 0.1)
    with pytest.raises(ConfigError, match="parameter 'gpus'"):
        resolve({"gpus": True})
    with pytest.raises(ConfigError, match="parameter 'batch'"):
        resolve({"batch": 64.5})


def test_help_lists_every_parameter(capsys, monkeypatch):
    with pytest.raises(SystemExit) as stop:
        cli_in_process(capsys, monkeypatch, "--help")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for prm in config.table():
        assert f"--{prm.name}" in out


def test_submit_without_slurm_prints_the_line_and_says_so(tmp_path, monkeypatch, capsys):
    """`lab submit ... --cluster leonardo-booster --account ehpc123` on a laptop ended in a FileNotFoundError
    traceback for 'sbatch'. It prints the line it would submit, then one line saying Slurm is not here (exit 2);
    `lab study submit` likewise."""
    from kernels.notebook import submit

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on it
    rc = submit.main(
        [
            str(ROOT / "notebooks" / "01_train.ipynb"),
            "--gpus",
            "8",
            "--cluster",
            "leonardo-booster",
            "--account",
            "ehpc123",
            "-p",
            "dataset",
            "digits",  # data here: the one line is the missing sbatch
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 2 and out.startswith("sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 "), out + err
    assert err.count("\n") == 1 and "sbatch is not on PATH" in err and "--dry-run" in err, err
    # a study goes through the same check (kernels.slurm.study.run_sbatch, which sweeps use too)
    from kernels.slurm import study

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    rc = study.main(["submit", str(ROOT / "studies" / "strong_resnet18.yaml")])
    out, err = capsys.readouterr()
    assert rc == 2 and out.startswith("sbatch --parsable --array="), out + err
    assert err.strip().splitlines()[-1].startswith("error: Slurm's sbatch is not on PATH here, so the array for"), err
    assert not (tmp_path / "results" / "studies" / "strong_resnet18" / "submissions.json").exists()


@pytest.fixture
def immutable(tmp_path):
    """A folder nothing can be written in, even by root (chattr +i); skipped where that cannot be set."""
    import shutil
    import subprocess

    folder = tmp_path / "immutable"
    folder.mkdir()
    chattr = shutil.which("chattr")
    if not chattr or subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (root, on a file system with immutable files)")
    yield folder
    subprocess.run([chattr, "-i", str(folder)], check=True)


@pytest.mark.parametrize(
    "command,needle",
    [
        (
            ["fetch", "fashion-mnist", "--root", "{x}/data", "--from", "{x}"],
            "error: {x}/data: Operation not permitted; it, or a folder above it, is read-only, immutable or not "
            "yours: choose another location or fix its permissions",
        ),
        (
            ["sysinfo", "--out", "{x}/SYSTEM.md"],
            "error: --out: cannot write {x}/SYSTEM.md (Operation not permitted): the file or its folder is "
            "read-only, immutable, full or not yours; pass another --out",
        ),
        (
            ["comm", "bench", "--gpus", "2", "--results_dir", "{x}/comm"],
            "error: parameter 'results_dir': cannot write in {x}/comm (Operation not permitted): it is read-only, "
            "immutable or not yours; pass results_dir=<a directory you own>",
        ),
        (
            ["paper", "--results", "{x}/results"],
            "error: --results: cannot write in {x}/results (Operation not permitted); pass a folder you can write",
        ),
        (
            ["train", "--workload", "dcrnn", "--dataset", "synthetic", "--data_dir", "{x}"],
            "error: --root: cannot write the metr-la set in {x}/traffic-synthetic-metr-la (Operation not permitted); "
            "pass a data root you can write (data_dir= for a run)",
        ),
    ],
    ids=["fetch", "sysinfo", "comm-bench", "paper", "train-synthetic-traffic"],
)
@pytest.mark.integration  # chattr is a process
@pytest.mark.faults
def test_a_folder_a_command_cannot_write_is_one_line_before_any_work(immutable, capsys, command, needle):
    """Each command that writes somewhere the user names: one line naming the option and the folder, exit 2,
    before any download, rank or notebook starts (a traceback from deep inside before)."""
    import time

    from kernels import cli

    t0 = time.monotonic()
    rc = cli.main([a.replace("{x}", str(immutable)) for a in command])
    err = capsys.readouterr().err
    shown = command[:5] if command[0] == "train" else command[:2]  # the train case's workload and data set
    record_fault(f"`lab {' '.join(shown)}` into an immutable folder", 10, time.monotonic() - t0, rc, "one line")
    assert rc == 2 and err.strip().splitlines()[-1] == needle.replace("{x}", str(immutable)), err
    assert "Traceback" not in err


def test_exit_status_says_a_write_error_in_one_line_and_leaves_other_errors_to_their_traceback(capsys):
    """What a command's wrapper turns into one line: the lab's own write error (a full disk too) as it is, and a
    file or folder it may not write, named; an OSError it cannot name (no file) keeps its traceback."""
    import errno

    from kernels.base.errors import exit_status
    from kernels.base.files import write_error

    def fails(e):
        def body():
            raise e

        return body

    full = write_error(Path("/scratch/x.json"), 10, OSError(errno.ENOSPC, "No space left on device"), "results_dir")
    assert exit_status(fails(full)) == 2
    assert capsys.readouterr().err == (
        "error: cannot write /scratch/x.json (10 bytes): No space left on device; free space there or choose "
        "another results_dir\n"
    )
    # a writer that names no option (the fix used to say results_dir whatever was written) says "elsewhere"
    denied = write_error(Path("/shared/SYSTEM.md"), 5, OSError(errno.EROFS, "Read-only file system"))
    assert exit_status(fails(denied)) == 2
    assert capsys.readouterr().err == (
        "error: cannot write /shared/SYSTEM.md (5 bytes): Read-only file system; the file or its directory is "
        "read-only, immutable or not yours: write it elsewhere\n"
    )
    assert exit_status(fails(PermissionError(errno.EACCES, "Permission denied", "/shared/data"))) == 2
    assert capsys.readouterr().err.startswith("error: /shared/data: Permission denied; it, or a folder above it,")
    with pytest.raises(PermissionError):
        exit_status(fails(PermissionError(errno.EPERM, "Operation not permitted")))  # os.kill's: no file to name
    with pytest.raises(FileNotFoundError):
        exit_status(fails(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")))


@pytest.mark.faults
def test_a_log_folder_others_may_write_to_is_refused_before_sbatch(tmp_path, capsys, monkeypatch):
    """Slurm opens a job's log by name and follows a link planted there: lab submit (and lab study, lab sweep)
    refuse a log folder others may write to, naming the fix, before anything is submitted; the user's own
    folder is made when missing and accepted."""
    from kernels.notebook import submit
    from kernels.slurm.study import log_folder

    assert log_folder(tmp_path / "new" / "logs").is_dir()
    logs = tmp_path / "results" / "logs"
    logs.mkdir(parents=True)
    logs.chmod(0o775)
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    args = [NOTEBOOK, "--gpus", "1", "--gpus-per-node", "1", "--dry-run", "-p", "dataset", "digits"]
    rc = submit.main(args)
    err = capsys.readouterr().err
    record_fault("job-log folder writable by the group (lab submit)", 5, 0.0, rc, "refused before sbatch")
    assert rc == 2 and err.strip() == (
        f"error: job logs: {logs} is writable by others (mode 775); Slurm writes the job's log there by name and "
        f"would follow a link another user planted: make it yours alone (chmod go-w {logs}) or set LAB_RESULTS "
        f"to a folder of yours"
    ), err
    logs.chmod(0o755)
    assert submit.main(args) == 0 and "sbatch --nodes=1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "profile,needle",
    [
        ("gpus_per_node: four", "key 'gpus_per_node': 'four' must be a whole number >= 0: GPUs per node"),
        ("gpus_per_node: true", "key 'gpus_per_node': True must be a whole number >= 0"),
        ("gpus_per_node: 4\ncpus_per_task: 0", "key 'cpus_per_task': 0 must be a whole number >= 1: CPU cores"),
        ("gpus_per_node: 4\nmax_nodes: -3", "key 'max_nodes': -3 must be a whole number >= 0: nodes in the partition"),
        ("gpus_per_node: 4\ntime: 2h", "key 'time': '2h' is not a Slurm time limit; write hours:minutes:seconds"),
        ("gpus_per_node: 4\nsbatch_extra: --exclusive", "key 'sbatch_extra': '--exclusive' must be a list of strings"),
        ("gpus_per_node: 4\nsbatch_extra: [exclusive]", "key 'sbatch_extra': 'exclusive' is not an sbatch option"),
        ("gpus_per_node: 4\nmodules: cuda/12.8", "key 'modules': 'cuda/12.8' must be a list of strings, e.g. [cuda"),
        (
            "gpus_per_node: 4\npartition: my part",
            "key 'partition': 'my part' must be one word (no spaces or line breaks)",
        ),
        ("gpus_per_node: 4\nenv: [A]", "key 'env': ['A'] must map variable names to values"),
        ("gpus_per_node: 4\nenv: {A: 'x,y'}", "key 'env.A': 'x,y' must be one line of text without ','"),
        ("gpus_per_node: 4\nenv: {WANDB_API_KEY: abc}", "key 'env.WANDB_API_KEY': looks like a secret"),
    ],
)
def test_a_cluster_profile_value_of_the_wrong_kind_is_one_line_naming_its_key(tmp_path, capsys, profile, needle):
    """A word where a count belongs ended in a TypeError traceback; a string where a list belongs reached sbatch one
    character per option (`- - e x c l u s i v e`); '2h' reached sbatch. Each is one line naming the profile and
    the key, from `lab submit` before it prints a line, and from a study on that profile alike."""
    from kernels.notebook import submit
    from kernels.slurm import study

    path = tmp_path / "c.yaml"
    path.write_text(profile + "\naccount: x\n")
    rc = submit.main([NOTEBOOK, "--gpus", "8", "--cluster", str(path), "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out and err.count("\n") == 1, out + err
    assert err.startswith(f"error: cluster profile {path}: {needle}"), err
    spec = tmp_path / "s.yaml"
    spec.write_text(f"cluster: {path}\ngpus: [1]\nfixed: {{dataset: digits}}\n")
    with pytest.raises(ConfigError) as e:
        study.load(spec)
    assert f"error: {e.value}\n" == err


def test_an_unquoted_time_is_text_not_a_base_60_number():
    """YAML 1.1 (PyYAML) reads `time: 12:00:00` as 43200, which sbatch would take as 43200 minutes (30 days); the
    lab's YAML reads it as the text it is. Numbers without ':' stay numbers."""
    from kernels.base import yamlfile

    got = yamlfile.loads("time: 12:00:00\nshort: 1:30\nminutes: 90\nratio: 1.5\nquoted: '02:00:00'")
    assert got == {"time": "12:00:00", "short": "1:30", "minutes": 90, "ratio": 1.5, "quoted": "02:00:00"}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpus", "3", "-p", "batch", "64"], "parameter 'batch': the global batch 64 is not divisible by gpus=3"),
        (["--gpus", "2", "-p", "batchh", "64"], "unknown parameter 'batchh' (injected into the notebook"),
        (["--gpus", "2", "-p", "precision", "fp8"], "parameter 'precision': unknown value 'fp8'"),
        (["--gpus", "2", "--time", "2h"], "--time: '2h' is not a Slurm time limit"),
    ],
)
def test_submit_checks_what_the_job_would_find_only_after_the_queue(tmp_path, capsys, monkeypatch, args, needle):
    """A misspelt notebook parameter, a batch the ranks cannot share, a time limit sbatch cannot read: each used to
    be submitted and to fail when the job left the queue (hours later); now one line before the sbatch line is
    printed or anything is written."""
    from kernels.notebook import submit

    monkeypatch.chdir(tmp_path)
    rc = submit.main([NOTEBOOK, "--cluster", "leonardo-booster", "--account", "x", "--dry-run", *args])
    out, err = capsys.readouterr()
    assert rc == 2 and not out and err.count("\n") == 1 and err.startswith(f"error: {needle}"), out + err
    assert not list(tmp_path.iterdir())  # no results/logs either


def test_a_single_submitted_run_gets_the_profile_environment_a_study_gets(tmp_path, capsys, monkeypatch):
    """`lab submit --cluster` passed the geometry and account but not the profile's modules, container, network
    interface or variables, which the batch script sets up before Python starts: a run on Leonardo let NCCL pick
    its interface where a study's run used ib0. Both now export the same variables."""
    import shlex

    from kernels.notebook import submit
    from kernels.slurm import study

    profile = tmp_path / "gpu.yaml"
    profile.write_text(
        "partition: boost\naccount: x\ngpus_per_node: 4\nmax_nodes: 4\ntime: 1:30:00\ncontainer: /x/lab.sif\n"
        "modules: [cuda/12.8, nccl]\nnccl_ifname: ib0\nenv: {OMP_NUM_THREADS: 8}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAB_RESULTS", raising=False)
    assert submit.main([NOTEBOOK, "--gpus", "8", "--cluster", str(profile), "--dry-run"]) == 0
    line = shlex.split(capsys.readouterr().out)
    exported = {"OMP_NUM_THREADS=8", "LAB_CONTAINER=/x/lab.sif", "LAB_NCCL_IFNAME=ib0", "LAB_MODULES=cuda/12.8 nccl"}
    assert "--time=1:30:00" in line  # an unquoted 1:30:00, not 5400 minutes
    assert set(next(a for a in line if a.startswith("--export=ALL,"))[13:].split(",")) == exported, line
    spec = tmp_path / "s.yaml"
    spec.write_text(f"cluster: {profile}\ngpus: [8]\nfixed: {{dataset: digits, batch: 64}}\n")
    st = study.load(spec)
    cmd = study.sbatch_command(st, 2, 4, 1, tmp_path / "list.txt")
    assert exported <= set(next(a for a in cmd if a.startswith("--export=ALL,"))[13:].split(",")), cmd


@pytest.mark.integration  # a process whose reader leaves
def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`lab study points ... | head -1` printed a BrokenPipeError traceback (or 'Exception ignored' at exit): the
    command now ends quietly with the shell's status for a closed pipe (141)."""
    import subprocess

    p = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "lab"), "study", "points", "studies/strong_resnet18.yaml"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # the reader leaves before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err


def test_submit_warns_of_a_data_set_the_job_would_find_missing(tmp_path, capsys, monkeypatch):
    """A job whose data set is not fetched stops at its start, after its wait in the queue, on nodes that often
    cannot download: lab submit says so from here, as a warning after the line (the job's nodes may see a
    data_dir this node does not); a data set that is there, or needs no files, says nothing."""
    from kernels.notebook import submit

    monkeypatch.chdir(tmp_path)
    base = [NOTEBOOK, "--gpus", "2", "--gpus-per-node", "4", "--dry-run", "-p", "data_dir", str(tmp_path / "data")]
    assert submit.main(base) == 0
    out, err = capsys.readouterr()
    assert out.startswith("sbatch --nodes=1 ") and err.startswith("warning: the job would stop at its start: ")
    assert f"`lab fetch cifar10 --root {tmp_path / 'data'}`" in err and err.count("\n") == 1, err
    assert submit.main([*base, "-p", "dataset", "digits"]) == 0
    assert capsys.readouterr().err == ""


def test_study_submit_warns_once_of_a_data_set_its_jobs_would_find_missing(tmp_path, capsys, monkeypatch):
    """As lab submit: each missing data set of a study's points is one warning before the arrays, however many
    points use it."""
    from kernels.slurm import study

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    spec = tmp_path / "s.yaml"
    spec.write_text(f"gpus: [1, 2]\nrepeats: 2\nfixed: {{batch: 64, data_dir: {tmp_path / 'data'}}}\n")
    assert study.main(["submit", str(spec), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: the study's jobs would stop at their start: dataset 'cifar10': ") == 1, err
    spec.write_text("gpus: [1, 2]\nfixed: {batch: 64, dataset: digits}\n")
    assert study.main(["submit", str(spec), "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_submit_from_any_folder_names_the_files_as_the_job_finds_them(tmp_path, capsys, monkeypatch):
    """`lab` runs from any folder, but the sbatch line named slurm/papermill_run.sbatch relative to it (sbatch could
    not open it) and the job, which runs in the repository, would not find a relative -f file. lab submit runs
    sbatch in the repository, names the notebook from there and -f files by their full path, says where the line
    runs, and with LAB_RESULTS set sends the job's log there, as a study does."""
    import shlex

    from kernels.notebook import submit

    (tmp_path / "mine.yaml").write_text("epochs: 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    assert submit.main([NOTEBOOK, "--gpus", "2", "--gpus-per-node", "4", "--dry-run", "-f", "mine.yaml"]) == 0
    line, note = capsys.readouterr().out.splitlines()
    assert shlex.split(line) == [
        "sbatch",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--gpus-per-node=2",
        f"--output={tmp_path / 'results' / 'logs'}/%x-%j.out",
        "slurm/papermill_run.sbatch",
        "notebooks/01_train.ipynb",
        "-p",
        "gpus",
        "2",
        "-f",
        str(tmp_path / "mine.yaml"),
    ]
    assert note == f"  (the line runs from {ROOT}, where lab submit runs it)"
    assert (tmp_path / "results" / "logs").is_dir()


@pytest.mark.integration  # chattr, and the renderer's processes
@pytest.mark.faults
def test_an_html_page_that_cannot_be_written_is_a_warning_not_a_traceback(immutable, capsys):
    """The executed notebook's HTML page is a view of it: when neither the renderer's helper nor a new process can
    write it (a disk that filled as the notebook ended, a folder made read-only), the runner says so and goes on
    to report the run; a CalledProcessError traceback ended it before."""
    import shutil
    import subprocess
    import time

    from kernels.notebook.html import HtmlRenderer

    subprocess.run(["chattr", "-i", str(immutable)], check=True)
    notebook = immutable / "executed.ipynb"
    shutil.copy(ROOT / "notebooks" / "03_commbench.ipynb", notebook)
    subprocess.run(["chattr", "+i", str(immutable)], check=True)
    t0 = time.monotonic()
    renderer = HtmlRenderer()
    try:
        page = renderer.render(notebook)
    finally:
        renderer.close()
    err = capsys.readouterr().err
    record_fault("the HTML page cannot be written (immutable folder)", 60, time.monotonic() - t0, 0, "warning")
    assert page is None and err.strip().splitlines()[-1].startswith(f"warning: no HTML page for {notebook}: "), err


@pytest.mark.parametrize(
    "content,why",
    [
        ("{bad", "not JSON (Expecting property name"),
        ('[{"array_job_id": 5}]', "not a list of job arrays, each with its array_job_id and points"),
        ('"x"', "not a list of job arrays"),
    ],
)
def test_a_damaged_submissions_file_is_one_line_naming_it(tmp_path, capsys, monkeypatch, content, why):
    """A study's submissions.json cut short or edited by hand was a JSONDecodeError, KeyError or TypeError
    traceback from `lab study status` and `resubmit`; now one line naming the file and what removing it costs."""
    from kernels.slurm import study

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    spec = tmp_path / "s.yaml"
    spec.write_text("gpus: [1, 2]\nfixed: {batch: 64, dataset: digits}\n")
    log = tmp_path / "results" / "studies" / "s" / "submissions.json"
    log.parent.mkdir(parents=True)
    log.write_text(content)
    for command in (["status", str(spec)], ["resubmit", str(spec), "--dry-run"]):
        assert study.main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {log}: {why}") and "Restore it, or remove it" in err, err
        assert err.count("\n") == 1, err


def test_a_damaged_sweep_exit_code_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """`lab sweep collect` read each task's exit_code.txt with int(): a file holding anything else was a ValueError
    traceback; now one line naming the file and the fix."""
    from kernels.slurm import sweep

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    spec = tmp_path / "sw.yaml"
    spec.write_text('name: sw\ncommand: "echo {n}"\ngrid: {n: [1, 2]}\n')
    task = tmp_path / "results" / "sweeps" / "sw" / "1"
    task.mkdir(parents=True)
    (task / "exit_code.txt").write_text("oops\n")
    assert sweep.main(["collect", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {task / 'exit_code.txt'}: 'oops' is not an exit status; the task writes it when its command ends: "
        f"remove the file (the task then shows as not run) or run the task again\n"
    )


@pytest.mark.parametrize(
    "content,why",
    [("{bad", "is not a node description written by `lab sysinfo --json`"), ("5", "lacks a node's facts")],
)
def test_a_damaged_node_file_names_the_option_it_came_from(tmp_path, content, why):
    """A target system's node file (under --systems-dir) was reported as '--merge: ...', and one holding a bare
    number was a TypeError traceback."""
    from kernels.base.sysinfo import read_node

    node = tmp_path / "n1.json"
    node.write_text(content)
    with pytest.raises(ConfigError) as e:
        read_node(node, "--systems-dir")
    assert str(e.value).startswith(f"--systems-dir: {node} {why}"), e.value


@pytest.mark.parametrize(
    "args,line",
    [
        (["cifar10", "--md5", "xyz"], "error: --md5: 'xyz' is not an md5 (32 hex digits)"),
        (["cifar10", "--url", "notaurl"], "error: --url: 'notaurl' is not a URL; give https://..., or file:///path/"),
        (["mnist", "--url", "https://x"], "error: --url: only CIFAR-10 takes it; mnist comes from its official files"),
    ],
)
def test_fetch_options_for_another_set_or_malformed_are_refused_before_any_download(tmp_path, capsys, args, line):
    """--url for MNIST was ignored without a word, a URL urllib cannot open was a ValueError traceback, and an md5
    of the wrong form was only found after the download."""
    from kernels import cli

    assert cli.main(["fetch", *args, "--root", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "env,needle",
    [
        ("{HF_TOKEN: abc}", "key 'env.HF_TOKEN': looks like a secret, and values here reach the sbatch command line"),
        ("{A: 'x,y'}", "key 'env.A': 'x,y' must be one line of text without ','"),
    ],
)
def test_a_study_or_sweep_env_holds_no_secret_and_no_comma(tmp_path, monkeypatch, env, needle):
    """Values under `env` go onto the sbatch command line, which every user of a login node can read in `ps` while
    sbatch runs, and into the printed line: a secret's name is refused with where to put it instead. A comma in a
    study's env was blamed on the cluster profile."""
    from kernels.slurm import study, sweep

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    spec = tmp_path / "s.yaml"
    spec.write_text(f"gpus: [1]\nfixed: {{batch: 64, dataset: digits}}\nenv: {env}\n")
    with pytest.raises(ConfigError, match=re.escape(f"study file {spec}: {needle}")):
        study.load(spec)
    spec.write_text(f'name: sw\ncommand: "echo {{n}}"\ngrid: {{n: [1]}}\nenv: {env}\n')
    with pytest.raises(ConfigError, match=re.escape(f"sweep file {spec}: {needle}")):
        sweep.load(spec)


@pytest.mark.parametrize(
    "body,needle",
    [
        ("gpus: [1]\nfixed: [a]", "key 'fixed' must map parameter names to values, e.g. {batch: 512}, got ['a']"),
        ("gpus: [1]\nsweep: [lr]", "key 'sweep' must map parameter names to lists of values"),
        ("gpus: [1]\nsweep: {lr: 0.1}", "key 'sweep.lr': 0.1 is not a grid; give a list of values"),
        ("gpus: [1]\nrepeats: true", "key 'repeats' must be an integer >= 1, got True"),
        (
            "gpus: [1]\nnotebook: notebooks/10_analyse_scaling.ipynb",
            "key 'notebook': notebooks/10_analyse_scaling.ipynb runs no training or benchmark point",
        ),
    ],
)
def test_a_study_file_of_the_wrong_shape_is_one_line(tmp_path, body, needle):
    """`fixed: [a]` was a ValueError traceback, `repeats: true` ran one repeat, and a study of the analysis notebook
    passed 01_train's parameters to it (each point failed at its start)."""
    from kernels.slurm import study

    spec = tmp_path / "s.yaml"
    spec.write_text(body + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"study file {spec}: {needle}")):
        study.load(spec)


@pytest.mark.parametrize(
    "body,needle",
    [
        ('command: "echo {n}"\ngrid: [n]', "key 'grid' must map names to lists of values"),
        ('command: "echo {n}"\ngrid: {n: 5}', "key 'grid.n': 5 is not a grid; give a list of values"),
        ("command: [echo]\ngrid: {n: [5]}", "key 'command' must be one command line (text), got ['echo']"),
    ],
)
def test_a_sweep_file_of_the_wrong_shape_is_one_line(tmp_path, body, needle):
    """`grid: [n]` was an AttributeError traceback; a command given as a list was taken as its Python text."""
    from kernels.slurm import sweep

    spec = tmp_path / "sw.yaml"
    spec.write_text("name: sw\n" + body + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"sweep file {spec}: {needle}")):
        sweep.load(spec)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["-p", "system", "nosuch"], "parameter 'system': unknown system 'nosuch'; choose one of marenostrum5-acc"),
        (["-p", "plan", "/nowhere/plan.yaml"], "parameter 'plan': /nowhere/plan.yaml not found"),
    ],
)
def test_the_analysis_notebook_checks_its_system_and_plan_before_a_kernel_starts(args, needle):
    """`lab run notebooks/10_analyse_scaling.ipynb -p system nosuch` failed inside the notebook, after the records
    were read; the runner now checks it as it checks the training notebooks' parameters."""
    from kernels.notebook.runner import precheck

    with pytest.raises(ConfigError, match=re.escape(needle)):
        precheck(ROOT / "notebooks" / "10_analyse_scaling.ipynb", args)
