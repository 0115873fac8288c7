"""The 01_train notebook: its twin, its parameters cell, and real Papermill runs (no Slurm)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from kernels.notebook import runner as notebooks
from kernels.launch.config import table

from conftest import ROOT, merge_p, record_fault

pytestmark = pytest.mark.unit

NB = ROOT / "notebooks" / "01_train.ipynb"
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
    "32",
    "-p",
    "precision",
    "fp32",
    "-p",
    "train_samples",
    "128",
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


def run_notebook(tmp_path, *args, notebook=NB):
    env = {**os.environ, "LAB_RESULTS": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "kernels.notebook.runner", "run", str(notebook), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def interrupted_run(tmp_path, notebook, args, when: str, limit_s: float):
    """`lab run NOTEBOOK ARGS` in its own process group, sent SIGINT (Ctrl-C as a terminal sends it) once its log
    shows `when`; (the process, its log file)."""
    import signal
    import time

    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        p = subprocess.Popen(
            [sys.executable, "-m", "kernels.notebook.runner", "run", str(notebook), *map(str, args)],
            cwd=ROOT,
            env={**os.environ, "LAB_RESULTS": str(tmp_path)},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    t0 = time.monotonic()
    while when not in log.read_text():
        assert p.poll() is None and time.monotonic() - t0 < limit_s, log.read_text()[-3000:]
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    return p, log


def write_notebook(path, cells: list[str]) -> None:
    """A Python notebook of these code cells, the first tagged 'parameters'."""
    import nbformat

    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )
    nb.cells = [
        nbformat.v4.new_code_cell(c, metadata={"tags": ["parameters"]} if i == 0 else {}) for i, c in enumerate(cells)
    ]
    nbformat.write(nb, path)


def test_ipynb_twins_are_up_to_date_without_outputs():
    """Each notebooks/*.py has an .ipynb twin with the same cells, no outputs and a kernelspec."""
    sources = sorted((ROOT / "notebooks").glob("*.py"))
    assert sources
    for py in sources:
        twin = py.with_suffix(".ipynb")
        assert twin.exists(), f"{twin} missing: run `make notebooks`"
        have = json.loads(twin.read_text())
        want = notebooks.twin_ipynb(py)
        assert have["metadata"]["kernelspec"]["name"] == "python3"
        assert [(c["cell_type"], "".join(c["source"]), c["metadata"].get("tags", [])) for c in have["cells"]] == [
            (c.cell_type, c.source, c.metadata.get("tags", [])) for c in want.cells
        ], f"{twin} is out of date with {py.name}: run `make notebooks`"
        for c in have["cells"]:
            assert not c.get("outputs") and not c.get("execution_count"), f"{twin} has outputs committed"


def test_make_notebooks_on_a_clean_checkout_changes_nothing():
    """The committed twins are byte for byte what `make notebooks` writes (stable cell ids, no random ones)."""
    import jupytext

    for py in sorted((ROOT / "notebooks").glob("*.py")):
        # jupytext.write ends the file with a newline
        want = jupytext.writes(notebooks.twin_ipynb(py), fmt="ipynb") + "\n"
        assert py.with_suffix(".ipynb").read_text() == want, f"{py.name}: run `make notebooks` and commit"
        assert notebooks.twin_ipynb(py).cells[0]["id"] == notebooks.twin_ipynb(py).cells[0]["id"]


def test_parameters_cell_is_generated_from_the_one_definition():
    src = (ROOT / "notebooks" / "01_train.py").read_text()
    assert notebooks.with_parameters_cell(src) == src, "run `make notebooks`"
    # 02_profile's: the same table, with profiling on by default
    from kernels.notebook.runner import PROFILE_DEFAULTS, profile_params

    prof = (ROOT / "notebooks" / "02_profile.py").read_text()
    assert notebooks.with_parameters_cell(prof, profile_params()) == prof, "run `make notebooks`"
    assert [p.name for p in profile_params()] == [p.name for p in table()]
    assert "profile_steps = 5 " in prof and PROFILE_DEFAULTS["profile_steps"] == 5
    lines = notebooks.parameters_cell().splitlines()
    cell = [line for line in lines if not line.lstrip().startswith("#")]
    assert [line.split(" = ")[0] for line in cell] == [p.name for p in table()]
    assert all("#" in line for line in cell)
    # a long comment goes on under itself: no line runs off a printed page
    assert max(map(len, lines)) <= notebooks.CELL_WIDTH and len(lines) > len(cell) + 4
    # papermill's parameter inference cannot parse a comment that holds '='
    assert all("=" not in p.doc for p in table())
    # a section per registered workload, after the common parameters
    sections = [line for line in notebooks.parameters_cell().splitlines() if line.startswith("# ---")]
    assert sections == [
        "# --- common parameters",
        "# --- workload resnet18: its own parameters, used only when workload is 'resnet18'",
        "# --- workload cnn: its own parameters, used only when workload is 'cnn'",
        "# --- workload dcrnn: its own parameters, used only when workload is 'dcrnn'",
    ]


@pytest.mark.integration
def test_notebook_runs_one_process_and_files_outputs_with_the_record(tmp_path):
    res = tmp_path / "runs"
    p = run_notebook(tmp_path, *TINY_P, "-p", "results_dir", res)
    assert p.returncode == 0, p.stdout + p.stderr
    (run,) = [d for d in res.iterdir() if d.is_dir()]
    executed = list(run.glob("01_train-local-*.ipynb"))
    assert len(executed) == 1 and executed[0].with_suffix(".html").exists()
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
    nb = json.loads(executed[0].read_text())
    text = json.dumps(nb)
    assert "epoch 1/1 done" in text  # progress streamed into the notebook
    assert "image/png" in text  # the plots were drawn
    # and the HTML says what they show (a screen reader reads the alt text, not the chart)
    html = executed[0].with_suffix(".html").read_text()
    assert html.count('<img alt="Figure (') == 1 and "No description has been provided" not in html
    assert "loss: loss against epoch for train, eval" in html
    # results first: the resolved configuration is folded under one line, and wide tables scroll in the page
    assert "<details><summary>the resolved configuration:" in html and 'style="overflow-x: auto;' in html
    assert not nb["metadata"]["papermill"]["exception"]
    assert "epoch 1/1 done" in p.stdout + p.stderr  # and into the log (--log-output)
    # where the log prints a figure, it says what the figure shows
    assert "IPython.core.display" not in p.stdout + p.stderr and "loss: loss against epoch" in p.stdout + p.stderr
    assert "started ahead differs" not in p.stdout + p.stderr  # the kernel started ahead ran it
    assert not list((tmp_path / "notebooks").iterdir())  # nothing left in staging, not even its private folder
    # the log without noise: no cell markers, no kernel transport warning, no cut or wrapped tables, no
    # scientific notation or NaN; every parameter as name=value; the whole tables in the notebook
    log = p.stdout + p.stderr
    for noise in ("Executing Cell", "Ending Cell", "without encryption", "rows x", "<Figure size", "NaN", "e+0"):
        assert noise not in log, (noise, log[-3000:])
    assert "lr_warmup_epochs=" in log and "train_flops_per_sample" in log
    assert "lr_warmup_epochs" in html and "...</td>" not in html
    assert "HTML helper failed" not in log  # the page came from the helper that imported nbconvert early
    # the helper's page is the page a fresh process renders
    again = tmp_path / "again" / executed[0].name  # the same name: the page's title is the notebook's
    again.parent.mkdir()
    again.write_bytes(executed[0].read_bytes())
    subprocess.run([sys.executable, "-m", "kernels.notebook.html", str(again)], check=True, cwd=ROOT)
    assert again.with_suffix(".html").read_text() == html
    # and it is nbconvert's own lab page but for the figures' alt text (the lab template's code cells, escaped
    # source included, without its second sanitising pass), as BeautifulSoup reads both
    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    lab, _ = HTMLExporter(template_name="lab").from_filename(str(again))
    ours = str(BeautifulSoup(html, features="html.parser"))
    assert "&lt;" in lab and re.sub(r' alt="[^"]*"', "", ours) == re.sub(r' alt="[^"]*"', "", lab)
    assert html.count('tabindex="0"') == lab.count('tabindex="0"') > 10  # every cell's input and output


def test_the_page_gets_htmlexporters_alt_text_and_tabindex_without_its_second_parse():
    """LabPage writes HTMLExporter's last pass into the template's markup: the same document for images without
    alt text (markdown, JPEG, a text/html output's) and for cells' inputs and outputs, including HTML outputs
    that carry those classes themselves or a tabindex of their own."""
    import logging

    import nbformat
    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    from kernels.notebook.html import NO_ALT, TEMPLATE, exporter

    v4 = nbformat.v4
    jpeg = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAP" + "A" * 40
    html_out = (
        '<div class="jp-OutputArea-output x" data-a="1 > 0">a</div><div tabindex="-1" '
        'class="jp-Cell-inputWrapper">b</div><img src="y.png"/><IMG SRC="z.png" ALT="kept">'
    )
    nb = v4.new_notebook(
        cells=[
            v4.new_markdown_cell('text <img src="x.png"> and ![described](d.png)'),
            v4.new_code_cell("print(1)", outputs=[v4.new_output("stream", name="stdout", text="1\n")]),
            v4.new_code_cell("jpeg()", outputs=[v4.new_output("display_data", data={"image/jpeg": jpeg})]),
            v4.new_code_cell(
                "html()",
                outputs=[
                    v4.new_output("execute_result", execution_count=3, data={"text/html": html_out, "text/plain": "h"})
                ],
            ),
        ]
    )
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    ours_exporter = exporter()
    ours_exporter.log.addHandler(handler)
    ours, _ = ours_exporter.from_notebook_node(nb)
    ours_exporter.log.removeHandler(handler)
    theirs, _ = HTMLExporter(template_file=str(TEMPLATE)).from_notebook_node(nb)
    assert str(BeautifulSoup(ours, features="html.parser")) == theirs
    assert ours.count(f'alt="{NO_ALT}"') == 3 and 'ALT="kept"' in ours and 'alt="described"' in ours
    assert warnings == ["Alternative text is missing on 3 image(s)."]


@pytest.mark.integration
def test_the_runners_checks_do_not_import_torch():
    """The runner checks the parameters and the launcher picks the run id and port before any rank starts;
    none of it imports torch (seconds on a small machine, paid by every notebook run's runner and kernel), nor
    does `lab train`'s driver around the ranks (its start and its exit: 2-4 s of every CLI run here)."""
    code = (
        "import sys, tempfile; from pathlib import Path; from kernels import train; "
        "from kernels.launch import ranks as launch; from kernels.notebook import runner as notebooks; "
        "from kernels.launch.config import resolve; train.start = lambda *a, **k: 0; "
        "assert train.main(['--gpus', '2', '--dataset', 'digits', '--results_dir', tempfile.mkdtemp()]) == 0; "
        "notebooks.precheck(Path('notebooks/01_train.ipynb'), ['-p', 'gpus', '2', '-p', 'dataset', 'digits']); "
        "[resolve({'workload': w}) for w in ('resnet18', 'cnn', 'dcrnn')]; "
        "launch.prepare(resolve({'gpus': 2, 'dataset': 'digits', 'results_dir': tempfile.mkdtemp()}), 'local'); "
        "from kernels.base.ports import free_port; free_port(); "
        "print(sorted(m for m in sys.modules if m == 'torch'))"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "[]", p.stdout + p.stderr


@pytest.mark.integration
@pytest.mark.faults
def test_a_failing_cell_fails_the_run_and_keeps_what_the_kernel_wrote(tmp_path):
    """Any notebook, outside the lab's: exit status 1, the cell's error in the log, the executed copy with the
    error kept in staging (no run directory), and what a cell left to the interpreter's exit (a file not closed)
    written: such a kernel is asked to stop, not killed. Papermill's --cwd is the kernel's working directory (the
    kernel started ahead in the runner's is not used). A link planted at the executed copy's name in the shared
    staging folder is replaced, never written through, though Papermill writes after every cell; the notebook an
    earlier run of the name left in its private folder when killed outright is named, and left alone."""
    out = tmp_path / "left-open.txt"
    mine = tmp_path / "mine.ipynb"
    write_notebook(
        mine, ["x = 1", f"f = open({out.name!r}, 'w'); f.write('kept')", "raise ValueError(f'boom at x={x}')"]
    )
    victim, executed = tmp_path / "victim", tmp_path / "notebooks" / "mine-run.ipynb"
    victim.write_text("precious")
    killed = tmp_path / "notebooks" / ".mine-run.0123abcd" / "mine-run.ipynb"  # a run killed outright left it
    killed.parent.mkdir(parents=True)
    killed.write_text("{}")
    executed.symlink_to(victim)
    t0 = time.monotonic()
    p = run_notebook(tmp_path, "-p", "x", "3", "--cwd", tmp_path, "--name", "mine-run", notebook=mine)
    record_fault(
        "a link planted at the executed notebook's name in staging (the notebook fails)",
        60,
        time.monotonic() - t0,
        p.returncode,
        "link replaced by the notebook, the file it pointed to untouched",
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "differs from the one asked for (working directory); Papermill starts its own" in p.stderr
    assert "ValueError: boom at x=3" in p.stderr and "error: the notebook failed" in p.stderr
    assert victim.read_text() == "precious" and not executed.is_symlink()
    assert "boom at x=3" in executed.read_text() and executed.with_suffix(".html").exists()
    assert sorted(f.name for f in executed.parent.iterdir()) == [killed.parent.name, "mine-run.html", "mine-run.ipynb"]
    assert f"note: {killed} is the notebook of an earlier run of this name that was killed outright" in p.stdout
    assert out.read_text() == "kept"


@pytest.mark.integration
def test_ctrl_c_lets_the_interrupted_cell_end_before_the_kernel_stops(tmp_path):
    """Any notebook: Ctrl-C interrupts the running cell, whose cleanup may take longer (3 s here) than the 2.5 s
    after which a kernel asked to stop gets SIGTERM; the kernel is asked only once the cell has ended, and the next
    cell never starts. Exit status 130, no traceback but the cell's own."""
    done, never = tmp_path / "cleaned-up.txt", tmp_path / "next-cell.txt"
    mine = tmp_path / "mine.ipynb"
    write_notebook(
        mine,
        [
            "x = 1",
            "import time\ntry:\n    print('waiting', flush=True); time.sleep(600)\n"
            "except KeyboardInterrupt:\n    time.sleep(3)\n"
            f"    open({str(done)!r}, 'w').write('kept')\n    raise",
            f"open({str(never)!r}, 'w')",
        ],
    )
    p, log = interrupted_run(tmp_path, mine, [], when="waiting", limit_s=120)
    assert p.wait(timeout=60) == 130, log.read_text()[-3000:]
    assert done.read_text() == "kept" and not never.exists(), log.read_text()[-3000:]
    assert "\nTraceback (most recent call last):" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.integration
def test_a_results_folder_it_cannot_write_is_one_line_naming_it(tmp_path):
    """Where the executed notebook cannot be staged (an immutable results folder: root ignores modes), the runner
    says so in one line naming the folder and LAB_RESULTS, exit status 2, before Papermill starts."""
    import shutil

    mine, results = tmp_path / "mine.ipynb", tmp_path / "results"
    write_notebook(mine, ["x = 1"])
    results.mkdir()
    chattr = shutil.which("chattr")
    if not chattr or subprocess.run([chattr, "+i", str(results)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (root, on a file system with immutable files)")
    try:
        p = run_notebook(results, notebook=mine)
    finally:
        subprocess.run([chattr, "-i", str(results)], check=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == (
        f"error: cannot write the executed notebook in {results / 'notebooks'} (Operation not permitted); "
        "set LAB_RESULTS to a results folder you can write"
    )


@pytest.mark.integration
@pytest.mark.faults
def test_sigterm_ends_the_runner_at_once_leaving_the_notebook_so_far_in_staging(tmp_path):
    """SIGTERM to the runner alone (`kill`; Slurm sends it to every process of the job): it dies of the signal as
    before, but the executed notebook so far is in staging under its name, not in the private folder Papermill
    writes in, and that folder is gone."""
    import signal

    mine = tmp_path / "mine.ipynb"
    write_notebook(mine, ["x = 1", "print('first cell done', flush=True)", "import time; time.sleep(600)"])
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        p = subprocess.Popen(
            [sys.executable, "-m", "kernels.notebook.runner", "run", str(mine), "--name", "mine-run"],
            cwd=ROOT,
            env={**os.environ, "LAB_RESULTS": str(tmp_path)},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        t0 = time.monotonic()
        while "first cell done" not in log.read_text():
            assert p.poll() is None and time.monotonic() - t0 < 120, log.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(0.5)  # Papermill writes the notebook after the cell's output
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
        record_fault(
            "notebook runner terminated (SIGTERM) mid-cell", 30, time.monotonic() - t0, 128 - rc, "notebook in staging"
        )
        assert rc == -signal.SIGTERM, log.read_text()[-3000:]
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the kernel, left running as any SIGTERM to the runner alone leaves it
    staging = tmp_path / "notebooks"
    assert [f.name for f in staging.iterdir()] == ["mine-run.ipynb"], log.read_text()[-3000:]
    assert "first cell done" in (staging / "mine-run.ipynb").read_text()


@pytest.mark.integration
def test_ctrl_c_checkpoints_the_ranks_and_files_the_notebook(tmp_path):
    """Ctrl-C on `lab run` (SIGINT to its process group, as a terminal sends it): the kernel is interrupted, the
    ranks checkpoint, the record says 'preempted', the executed notebook is filed with it; exit status 75."""
    res = tmp_path / "runs"
    p, log = interrupted_run(
        tmp_path,
        NB,
        merge_p(*TINY_P, "-p", "epochs", "200", "-p", "results_dir", res),
        when="epoch 1/200 done",
        limit_s=300,
    )
    assert p.wait(timeout=120) == 75, log.read_text()[-3000:]
    (run,) = [d for d in res.iterdir() if d.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted" and "SIGINT" in summary["error"], summary
    assert (run / "checkpoint.pt").exists() and list(run.glob("01_train-local-*.html"))
    # the kernel was asked to stop only once its cell had ended: no traceback from it or from the runner
    text = log.read_text()
    assert "\nTraceback (most recent call last):" not in text and "interrupted (Ctrl-C)" in text, text[-3000:]
    executed = json.loads(next(run.glob("01_train-local-*.ipynb")).read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert [e["ename"] for e in errors] == ["KeyboardInterrupt"], errors


@pytest.mark.integration
def test_the_kernel_started_ahead_runs_without_the_debugger_and_preloads_what_it_is_asked():
    """The runner's kernel is ipykernel's without debugpy imported at start (a cell may still import it), and it
    imports the preload modules in a thread; a module that fails to import there does not stop the kernel."""
    from jupyter_core.utils import run_sync

    from kernels.notebook import kernel as notebook_kernel

    kernel = notebook_kernel.start({}, preload=("pandas", "no_such_module_for_this_test"))
    assert kernel is not None
    client, printed = kernel.km.client(), []
    client.start_channels()
    code = (
        "import sys, threading\n"
        "print(sorted(m for m in ('debugpy', 'pandas') if m in sys.modules))\n"  # as the first cell finds it
        "[t.join() for t in threading.enumerate() if t.name == 'preload']\n"
        "import ipykernel.debugger, debugpy\n"
        "print('pandas' in sys.modules, ipykernel.debugger._is_debugpy_available, debugpy.__name__)"
    )
    try:
        run_sync(client._async_wait_for_ready)(timeout=60)
        reply = run_sync(client._async_execute_interactive)(
            code, timeout=120, output_hook=lambda m: printed.append(m["content"].get("text", ""))
        )
    finally:
        client.stop_channels()
        kernel.stop()
    assert reply["content"]["status"] == "ok", reply["content"]
    first, then = "".join(printed).splitlines()
    assert "debugpy" not in first and then == "True False debugpy"


@pytest.mark.integration
def test_an_interrupt_while_the_kernel_imports_prints_nothing(tmp_path):
    """CI at b53d20b: a run refused for a misspelt parameter stops the kernel started ahead (jupyter_client sends
    SIGINT, then SIGKILL); on a loaded machine the SIGINT landed in ipykernel's imports and a KeyboardInterrupt
    traceback followed the one-line error. The launcher ignores SIGINT from its first line, as ipykernel does once
    initialised."""
    import signal
    import time

    p = subprocess.Popen(
        [sys.executable, "-m", "kernels.notebook.kernel", "-f", str(tmp_path / "kernel.json")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.3)  # in its imports: they take about 0.8 s
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert p.poll() is None, "the interrupt stopped the kernel"
    finally:
        p.kill()
    assert "KeyboardInterrupt" not in p.communicate()[1]


def test_what_the_kernel_preloads_is_what_each_of_the_labs_notebooks_imports():
    import ast

    for py in sorted((ROOT / "notebooks").glob("*.py")):
        imported = {
            a.name.split(".")[0]
            for node in ast.walk(ast.parse(py.read_text()))
            if isinstance(node, ast.Import)
            for a in node.names
        }
        assert set(notebooks.KERNEL_PRELOAD) <= imported, py.name


@pytest.mark.integration
def test_the_html_helper_leaves_when_the_runner_has_no_notebook():
    from kernels.notebook.html import HtmlRenderer

    helper = HtmlRenderer()
    helper.proc.stdin.close()  # the runner ended before any notebook existed
    assert helper.proc.wait(timeout=60) == 0
    helper = HtmlRenderer()
    helper.close()  # or ends it
    assert helper.proc.returncode is not None


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,needle",
    [
        (["-p", "gpu", "2"], "unknown parameter 'gpu'.*did you mean 'gpus'"),
        (["-p", "epochs", "two"], "parameter 'epochs': 'two' is not a valid int"),
        (["-p", "gpus", "3"], "parameter 'batch': the global batch 32 is not divisible by gpus=3"),
    ],
)
def test_bad_parameters_fail_the_notebook_before_any_record(tmp_path, args, needle):
    """Refused by the runner before Papermill starts a kernel: exit 2, one line, no record, no executed copy."""
    res = tmp_path / "runs"
    p = run_notebook(tmp_path, *merge_p(*TINY_P, "-p", "results_dir", res, *args))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert re.search(needle, p.stderr), p.stdout[-3000:] + p.stderr[-3000:]
    assert not res.exists() and not list(tmp_path.glob("**/01_train-*"))


@pytest.mark.integration
def test_the_notebook_itself_refuses_what_the_runner_would(tmp_path):
    """Papermill run directly (no runner): the notebook's resolve cell gives the same error before any record."""
    res = tmp_path / "runs"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(ROOT / "notebooks" / "01_train.ipynb"),
            str(tmp_path / "out.ipynb"),
            "--kernel",
            "python3",
            *map(str, TINY_P),
            "-p",
            "results_dir",
            str(res),
            "-p",
            "gpu",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0 and "did you mean 'gpus'" in p.stdout + p.stderr
    assert not res.exists()


@pytest.mark.integration
def test_unknown_notebook_path_fails_fast(tmp_path):
    p = run_notebook(tmp_path, notebook=ROOT / "notebooks" / "nope.ipynb")
    assert p.returncode == 2 and "notebook" in p.stderr and "not found" in p.stderr


def test_slurm_duration_parsing():
    assert notebooks.parse_slurm_duration("1-02:03:04") == 93784
    assert notebooks.parse_slurm_duration("02:03:04") == 7384
    assert notebooks.parse_slurm_duration("03:04") == 184
    assert notebooks.parse_slurm_duration("UNLIMITED") is None


def test_a_log_axis_is_labelled_in_plain_numbers():
    """The train notebook's loss axis: 0.1, 1, 10 (and 0.2, 0.3 between them when few decades show), never mathtext's
    10^-1 nor 1e-01; which ticks carry a label stays matplotlib's choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kernels.base.axis_labels import plain_log_labels

    fig, (wide, narrow) = plt.subplots(1, 2)
    wide.plot([1, 2, 3], [12, 2.8, 0.07])
    narrow.plot([1, 2, 3], [0.9, 0.5, 0.3])
    for ax in (wide, narrow):
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)
    fig.canvas.draw()
    labels = {
        ax: [t.get_text() for t in ax.yaxis.get_ticklabels(which="both") if t.get_text()] for ax in (wide, narrow)
    }
    plt.close(fig)
    assert {"0.1", "1", "10"} <= set(labels[wide]), labels[wide]
    assert {"0.2", "0.3", "0.4"} <= set(labels[narrow]), labels[narrow]
    assert not any("$" in t or "e" in t for t in labels[wide] + labels[narrow]), labels


def test_figure_text_states_what_the_chart_shows_and_travels_with_the_png(tmp_path):
    """The alt text is built from the figure (titles, axes, legend), and a PNG the report saves carries it, so
    the analysis notebook can show it beside the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kernels.base.alttext import describe, png_description
    from kernels.analysis.figures import save_figure

    fig, (a, b) = plt.subplots(1, 2)
    a.plot([1, 2], [3, 4], label="strong")
    a.plot([1, 2], [3, 6], label="ideal")
    a.set(xlabel="ranks", ylabel="samples/s", title="throughput\nmedian")
    a.legend()
    b.bar(["x"], [1])
    b.set_ylabel("share (%)")
    fig.suptitle("CPU; torch")
    want = "Figure (CPU; torch). throughput median: samples/s against ranks for strong, ideal; share (%)."
    assert describe(fig) == want
    (tmp_path / "figures").mkdir()
    pdf, png = save_figure(fig, tmp_path, "t")
    assert png_description(png) == want and pdf.exists()
    plt.imsave(tmp_path / "bare.png", [[0.0, 1.0]])
    assert png_description(tmp_path / "bare.png") == "Figure bare."


def test_a_table_reads_whole_in_the_log_and_an_empty_one_says_so():
    """What a notebook displays: every row and column, plain numbers and blanks in the log; an empty table is a
    sentence, in the page and in the log, not pandas' "Empty DataFrame" with its column list."""
    import pandas as pd

    from kernels.notebook.tables import table

    t = table(pd.DataFrame({"samples_per_s": [13420416.0, None], "mfu": [0.00928, 0.5]}))
    assert repr(t).split("\n")[1].split() == ["0", "13,420,416", "0.00928"] and "nan" not in repr(t).lower()
    empty = table(pd.DataFrame(columns=["a", "b"]), none="no I/O records selected")
    assert repr(empty) == "no I/O records selected" and empty._repr_html_() == "<p><em>no I/O records selected</em></p>"
    assert "Empty DataFrame" not in repr(table(pd.DataFrame()))
