"""Notebook plumbing: the parameters cell, injected-parameter checks, the driver, the runner.

The runner executes a parameterised notebook headless with Papermill and files
the executed notebook and its HTML rendering beside the run record:

    lab run notebooks/01_train.ipynb -p gpus 2 -p dataset digits

It is what slurm/papermill_run.sbatch calls inside a job and what `make demo`
calls on a laptop. Outputs are named from the Slurm job id (`01_train-<jobid>`,
`<jobid>_<task>` in an array; `local-<time>` outside Slurm). A notebook that
fails still leaves its executed copy (with the error) where it can be read, but
never a record that looks complete.

    lab notebooks parameters   # prints 01_train's parameters cell from kernels/base/params.py
    lab notebooks sync         # rewrites it in notebooks/01_train.py, then the .ipynb twins
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

from kernels.records import schema as records
from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT, RESULTS_ENV, results_home
from kernels.notebook.html import HtmlRenderer
from kernels.notebook import kernel as notebook_kernel
from kernels.launch.config import resolve, table
from kernels.base.params import COMMON, RunConfig, unknown_name_error
from kernels.base import files, sysinfo
from kernels.base.sysinfo import job_tag

HANDOFF_ENV = "LAB_HANDOFF"
CELL_WIDTH = 100  # characters per line of a generated parameters cell


def staging_dir() -> Path:
    """Where executed notebooks wait for their run directory (and stay when none was made)."""
    return results_home() / "notebooks"


# ------------------------------------------------------------ in the notebook
def parameters_cell(params=None) -> str:
    """The body of a `parameters` cell: literals only, one per line, each documented: beside it, going on under
    itself, or above a line longer than 40 characters, so that no line runs past CELL_WIDTH characters.

    01_train's (default): the common parameters first, then a section per registered
    workload; a per-workload common parameter is None, meaning "the workload's default".
    `params`: another notebook's table (03_commbench's, kernels/comm/bench.PARAMS).
    """
    params = table() if params is None else list(params)
    codes = [f"{p.name} = {p.default!r}" for p in params]
    width = max([len(c) for c in codes if len(c) <= 40] or [0])  # the comments' column; a longer line's goes above it
    lines, group = [], None
    for p, code in zip(params, codes):
        if p.group != group:
            group = p.group
            lines.append(
                "# --- common parameters"
                if group == "common"
                else "# --- communication benchmark (lab comm bench --help)"
                if group == "commbench"
                else f"# --- workload {group}: its own parameters, used only when workload is '{group}'"
            )
        if len(code) > width:
            lines += [*(f"# {d}" for d in textwrap.wrap(p.doc, CELL_WIDTH - 2)), code]
            continue
        doc = textwrap.wrap(p.doc, CELL_WIDTH - width - 4)
        lines += [f"{code:<{width}}  # {doc[0]}", *(f"{'':<{width}}  # {more}" for more in doc[1:])]
    return "\n".join(lines)


def check_parameter_names(new_names: set, allowed, where: str = " (injected into the notebook)") -> None:
    """Any notebook: names injected (papermill -p) that its parameters cell does not declare are errors."""
    allowed = list(allowed)
    for name in sorted({k for k in new_names if not k.startswith("_")} - set(allowed)):
        raise unknown_name_error(name, where=where, known=allowed)


def resolve_notebook_parameters(namespace: dict, new_names: set) -> RunConfig:
    """Typed RunConfig from the notebook's globals; unknown or mistyped injected names are errors.

    `new_names` are the globals that appeared between the start of the parameters
    cell and the first cell after it, i.e. what the parameters cell and Papermill's
    injected cell defined. Each must be a parameter: a common one, one of a registered
    workload, or one of the chosen plug-in workload (module:OBJECT). A parameter of
    another workload set to anything but its default is the CLI's error naming that
    workload.
    """
    from kernels.workloads import get_workload

    workload = namespace.get("workload") or COMMON[0].default
    params = table(workload)
    check_parameter_names(
        new_names, [p.name for p in params], where=" (injected into the notebook, e.g. by papermill -p)"
    )
    missing = [p.name for p in table() if p.name not in namespace]
    if missing:
        raise ConfigError(
            f"the notebook's parameters cell lacks {', '.join(missing)}; regenerate it with `lab notebooks sync`"
        )
    own = {p.name for p in get_workload(workload).params}
    raw = {}
    for p in params:
        if p.group == "common" or p.name in own:
            raw[p.name] = namespace[p.name]
        elif namespace.get(p.name, p.default) != p.default:
            raw[p.name] = namespace[p.name]  # resolve() names the workload it belongs to
    return resolve(raw)


def handoff(run_dir: Path) -> None:
    """Tell the runner (if any) which run directory this notebook is producing."""
    path = os.environ.get(HANDOFF_ENV)
    if path:
        Path(path).write_text(str(run_dir))


def preload(*modules: str):
    """Import `modules` in a background thread at the lowest CPU priority; the thread.

    Called before the launch cell: while the kernel only waits for the ranks, the plots' library loads (0.7-1 s on
    a 2-core machine), taking CPU only when the ranks leave it idle; the plot cell's import then finds it loaded
    (or waits for the rest of it: Python's import lock)."""
    import importlib
    import threading

    def load():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except OSError:
            pass  # elsewhere: at the kernel's priority
        for name in modules:
            importlib.import_module(name)

    thread = threading.Thread(target=load, name="preload", daemon=True)
    thread.start()
    return thread


def launch_from_notebook(cfg: RunConfig, stdout=None) -> Path:
    """The driver's launch: srun inside an allocation, local processes elsewhere; never in the kernel.

    Returns the run directory; raises if any rank failed.
    """
    from kernels.launch import ranks as launch
    from kernels.launch.launchers import EXIT_INTERRUPTED, EXIT_PREEMPTED, exit_cause

    launcher = cfg.launcher
    if launcher == "auto":
        launcher = "srun" if "SLURM_JOB_ID" in os.environ else "local"
    if launcher == "none":
        raise ConfigError("parameter 'launcher': the notebook is a driver, not a rank; use auto, local or srun")
    launcher, cfg = launch.prepare(cfg, launcher)
    run_dir = cfg.results_root / cfg.run_id
    handoff(run_dir)
    print(f"run {cfg.run_id}: {cfg.gpus} rank(s) via {launcher}; record in {run_dir}", flush=True)
    rc = launch.start(launcher, cfg, stdout or sys.stdout)
    if rc == EXIT_INTERRUPTED:
        raise KeyboardInterrupt(
            f"interrupted: the ranks checkpointed and stopped; running the same run_id again ({cfg.run_id}) resumes it"
        )
    if rc == EXIT_PREEMPTED:
        raise Preempted(
            f"the run was preempted: its ranks checkpointed and stopped on request; running the "
            f"same run_id again ({cfg.run_id}) resumes it (a requeued Slurm job does so by itself)"
        )
    if rc != 0:
        if records.mark_failed(run_dir, f"the ranks {exit_cause(rc)} (seen by the notebook driver)"):
            print(f"marked {run_dir} failed", flush=True)
        raise RuntimeError(
            f"training failed (exit status {rc}); the reason is in the output above "
            f"and in {run_dir / 'summary.json'} if the run got that far"
        )
    return run_dir


class Preempted(RuntimeError):
    """The run checkpointed and stopped on request; the runner exits with EXIT_PREEMPTED (launch/launchers)."""


NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"
# Room the executed notebook and its HTML page need where the runner writes them (about 1.2 MiB together for the
# demo's and the analysis' notebooks, figures inline): a full disk is one line before Papermill starts
NOTEBOOK_ROOM = 4 << 20
# what each of the lab's notebooks imports first: its kernel imports them while Papermill gets ready
KERNEL_PRELOAD = ("pandas",)


def labs_own(notebook: Path) -> bool:
    """One of the lab's own notebooks (notebooks/), whose cells the runner knows: they import KERNEL_PRELOAD and
    leave nothing for the kernel's exit to finish."""
    return notebook.resolve().parent == NOTEBOOK_DIR


PARAMS_MARK = '# %% tags=["parameters"]'


def with_parameters_cell(source: str, params=None) -> str:
    """`source` (a py:percent notebook) with its parameters cell regenerated from the parameter table."""
    head, sep, rest = source.partition(PARAMS_MARK + "\n")
    if not sep:
        raise ValueError(f"no {PARAMS_MARK} cell")
    nxt = rest.find("\n# %%")
    tail = rest[nxt:] if nxt >= 0 else "\n"
    return head + sep + parameters_cell(params) + "\n" + tail


def twin_ipynb(py: Path) -> dict:
    """The .ipynb that the py:percent source `py` should have: no outputs, python3 kernelspec."""
    import jupytext

    nb = jupytext.read(py)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    # nbformat draws random cell ids; ids from the notebook's name and the cell's position keep
    # `make notebooks` on a clean checkout from rewriting the twins.
    for i, cell in enumerate(nb.cells):
        cell["id"] = hashlib.sha1(f"{py.stem}:{i}".encode()).hexdigest()[:12]
    return nb


def sync(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """Regenerate the parameters cells of 01_train, 02_profile and 03_commbench, then write every .py source's
    .ipynb twin.

    The .py is always the source (jupytext --sync would take the newer file,
    which after a checkout may be the .ipynb).
    """
    import jupytext

    from kernels.comm.bench import PARAMS as COMM_PARAMS

    for name, params in (("01_train.py", None), ("02_profile.py", profile_params()), ("03_commbench.py", COMM_PARAMS)):
        src = directory / name
        text = src.read_text()
        if with_parameters_cell(text, params) != text:
            files.atomic_write_text(src, with_parameters_cell(text, params))  # whole, never through a link
    written = []
    for py in sorted(directory.glob("*.py")):
        out = py.with_suffix(".ipynb")
        text = jupytext.writes(twin_ipynb(py), fmt="ipynb")
        files.atomic_write_text(out, text if text.endswith("\n") else text + "\n")  # as jupytext.write ends it
        written.append(out)
    return written


# 02_profile's parameters: 01_train's table with these defaults (the same names: any run can be profiled
# from the CLI or 01_train by setting them)
PROFILE_DEFAULTS = {"profile_steps": 5, "epochs": 2}


def profile_params():
    """02_profile's parameters cell: the run's table with PROFILE_DEFAULTS."""
    from dataclasses import replace

    return [replace(p, default=PROFILE_DEFAULTS[p.name]) if p.name in PROFILE_DEFAULTS else p for p in table()]


# ------------------------------------------------------------------- runner


def slurm_time_left_s(environ=None) -> int | None:
    """Seconds left in the current Slurm job (squeue %L), or None."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env or not shutil.which("squeue"):
        return None
    p = subprocess.run(["squeue", "-h", "-j", env["SLURM_JOB_ID"], "-o", "%L"], capture_output=True, text=True)
    return parse_slurm_duration(p.stdout.strip())


def parse_slurm_duration(text: str) -> int | None:
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not m:
        return None
    d, h, mnt, s = (int(g) if g else 0 for g in m.groups())
    return ((d * 24 + h) * 60 + mnt) * 60 + s


def _comm_parameters(namespace: dict, names: set) -> None:
    from kernels.comm import bench

    check_parameter_names(names, bench.BY_NAME)
    bench.resolve({name: namespace[name] for name in bench.BY_NAME})


def _analysis_parameters(namespace: dict, names: set) -> None:
    """10_analyse_scaling: its names, a target system paper/systems.yaml knows, and a plan file that is there
    (a misspelt system failed inside the notebook, after the records were read)."""
    from kernels.base import yamlfile

    check_parameter_names(names, ("runs_dir", "out_dir", "plan", "system", "study"))
    plan = Path(namespace.get("plan") or PROJECT_ROOT / "paper" / "plan.yaml")
    if not plan.is_file():
        raise ConfigError(f"parameter 'plan': {plan} not found; pass the documents' plan (paper/plan.yaml)")
    system = namespace.get("system") or ""
    systems = yamlfile.read(PROJECT_ROOT / "paper" / "systems.yaml", "systems file")
    if system and system not in systems:
        raise ConfigError(
            f"parameter 'system': unknown system {system!r}; choose one of {', '.join(systems)} (paper/systems.yaml)"
        )


# How each notebook checks its parameters (its resolve cell); any other notebook: names only, against its cell
PARAMETER_CHECKS = {
    "01_train": resolve_notebook_parameters,
    "02_profile": resolve_notebook_parameters,
    "03_commbench": _comm_parameters,
    "10_analyse_scaling": _analysis_parameters,
}


def precheck(notebook: Path, papermill_args: list[str]) -> RunConfig | None:
    """The parameters the notebook will get, checked as its resolve cell checks them, before Papermill starts a
    kernel: a misspelt or malformed parameter is the CLI's one-line ConfigError and nothing is left behind. The
    training notebooks' resolved RunConfig is returned; None for the others."""
    from kernels.notebook import papermill_args as pa
    from kernels.notebook.papermill_cli import without_format_checkers

    without_format_checkers()  # Papermill's import reads nbformat's schemas: 0.9-2.4 s more with the IRI grammar
    given = pa.injected(papermill_args)
    cell = pa.defaults(notebook)
    check = PARAMETER_CHECKS.get(notebook.stem)
    if check is None:
        check_parameter_names(set(given), list(cell), where=" (injected into the notebook, e.g. by papermill -p)")
        return None
    return check({**cell, **given}, set(cell) | set(given))


def run(
    notebook: Path, papermill_args: list[str], timeout_s: int | None = None, name: str = "", staging: Path | None = None
) -> int:
    """Execute `notebook` with Papermill; file the executed copy and HTML with the run record.

    staging: where the executed notebook waits for its run directory (default: $LAB_RESULTS/notebooks).
    """
    notebook = Path(notebook)
    if not notebook.is_file():
        print(
            f"error: notebook {notebook} not found (cwd {Path.cwd()}); pass a path such as notebooks/01_train.ipynb",
            file=sys.stderr,
            flush=True,
        )
        return 2
    if notebook.suffix != ".ipynb":
        print(f"error: {notebook} is not an .ipynb; run the .ipynb twin of a jupytext source", file=sys.stderr)
        return 2
    tag = job_tag()
    staging = Path(staging) if staging else staging_dir()
    staged = staging / f"{name or notebook.stem + '-' + tag}.ipynb"
    # Papermill writes its output by name, again after every cell: it writes in a new folder only this user can
    # enter (made once the parameters pass), so a link planted in a shared results folder is never written
    # through; the notebook leaves it whole
    work = staging / f".{staged.stem}.{secrets.token_hex(8)}"
    env = {HANDOFF_ENV: str(work / "handoff"), "PYTHONUNBUFFERED": "1", "LAB_NOTEBOOK": notebook.stem}
    # boots while the parameters are checked and Papermill gets ready
    kernel = notebook_kernel.start(env, preload=KERNEL_PRELOAD if labs_own(notebook) else ())
    try:
        with _unstaged_on_term(work / staged.name, staged):
            return _checked_run(notebook, papermill_args, timeout_s, staged, work, env, kernel)
    finally:
        if kernel is not None:
            kernel.stop()
        _unstage(work / staged.name, staged)


def _unstage(partial: Path, staged: Path) -> None:
    """A notebook stopped before it was filed is left where the run would have left it; the private folder goes."""
    if partial.exists():
        os.replace(partial, staged)
    if partial.parent.is_dir():
        shutil.rmtree(partial.parent)


@contextmanager
def _unstaged_on_term(partial: Path, staged: Path):
    """SIGTERM (scancel, the time limit's kill, `kill`) still ends the runner at once, as by default, but the
    notebook so far is first left in staging under its name rather than in the private folder."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return

    def on_term(signum, frame):
        _unstage(partial, staged)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _checked_run(
    notebook: Path,
    papermill_args: list[str],
    timeout_s: int | None,
    staged: Path,
    work: Path,
    env: dict[str, str],
    kernel: notebook_kernel.Kernel | None,
) -> int:
    try:
        precheck(notebook, papermill_args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    short = sysinfo.short_of_room(work.parent, NOTEBOOK_ROOM)
    if short:  # before any folder is made: a refused run leaves nothing
        probe, has, needs = short
        print(
            f"error: {probe} has {has} free; the executed notebook and its HTML page need about {needs}: free space "
            f"there or set {RESULTS_ENV} to a results folder with room",
            file=sys.stderr,
            flush=True,
        )
        return 2
    try:
        work.parent.mkdir(parents=True, exist_ok=True)
        work.mkdir(mode=0o700)  # its random name is new: anything already there (a planted link) fails this
    except OSError as e:
        print(
            f"error: cannot write the executed notebook in {work.parent} ({e.strerror or e}); set "
            f"{RESULTS_ENV} to a results folder you can write",
            file=sys.stderr,
            flush=True,
        )
        return 2
    for left_behind in sorted(work.parent.glob(f".{staged.stem}.*/{staged.name}")):
        if left_behind.parent != work:  # SIGKILL gives no chance to move it out (the OOM killer, kill -9)
            print(f"note: {left_behind} is the notebook of an earlier run of this name that was killed outright")
    if timeout_s is None:
        left = slurm_time_left_s()
        timeout_s = max(60, left - 120) if left else 24 * 3600
    args = [
        str(notebook),
        str(work / staged.name),
        "--log-output",
        "--no-progress-bar",
        "--execution-timeout",
        str(timeout_s),
        "--kernel",
        notebook_kernel.NAME,
        *papermill_args,
    ]
    print("notebook: papermill " + " ".join(args), flush=True)
    html = HtmlRenderer()  # imports nbconvert while the kernel starts, renders when the notebook ends
    try:
        return _execute(args, env, kernel, notebook, staged, work, html)
    finally:
        html.close()


def _execute(
    args: list[str],
    env: dict[str, str],
    kernel: notebook_kernel.Kernel | None,
    notebook: Path,
    staged: Path,
    work: Path,
    renderer: HtmlRenderer,
) -> int:
    """Papermill, then the executed notebook and its HTML filed with the run record; the runner's exit status."""
    from kernels.notebook import papermill_cli

    rc = papermill_cli.execute(args, env, kernel=kernel, stop_now=labs_own(notebook))
    run_dir = Path((work / "handoff").read_text()) if (work / "handoff").exists() else None
    if not (work / staged.name).exists():
        print(f"error: papermill wrote no output notebook (exit status {rc})", file=sys.stderr, flush=True)
        return rc or 1
    final = run_dir / staged.name if run_dir is not None and run_dir.is_dir() else staged
    shutil.move(work / staged.name, final)  # replaces a previous one of the same name
    html = renderer.render(final)
    if run_dir is not None and "SLURM_JOB_ID" in os.environ and (run_dir / "config.json").is_file():
        from kernels.slurm import accounting  # the job's steps are done: Slurm's view of them goes into the record

        entry = accounting.store(os.environ["SLURM_JOB_ID"], [run_dir])
        print(f"sacct: {accounting.describe(entry)}", flush=True)
    if rc != 0 and run_dir is not None and _status(run_dir) == "preempted":
        from kernels.launch.launchers import EXIT_PREEMPTED

        print(
            f"notebook: the run was preempted and checkpointed; exit status {EXIT_PREEMPTED} "
            f"(the batch script requeues the job)",
            flush=True,
        )
        return EXIT_PREEMPTED
    state = "complete" if rc == 0 else f"FAILED (exit status {rc})"
    print(f"notebook {state}: {final}\nhtml: {html or 'none (the renderer failed, see above)'}", flush=True)
    if rc != 0:
        print(
            f"error: the notebook failed; the failing cell and its error are in {final} and in the log above",
            file=sys.stderr,
            flush=True,
        )
    return rc


def _status(run_dir: Path) -> str | None:
    try:
        return records.status_of(run_dir)
    except records.RecordError:
        return None


def exit_without_teardown(rc: int) -> None:
    """End this process with `rc` once the atexit handlers have run, without the interpreter's teardown: after a
    notebook run, freeing what Papermill, nbclient and ZeroMQ loaded took 0.3 s, with nothing left to write (the
    kernel and the HTML helper have exited, every file is closed)."""
    import atexit

    atexit._run_exitfuncs()  # what sys.exit would run first (logging's flush among them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lab notebooks", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute a notebook with papermill and file its outputs with the run record")
    r.add_argument("notebook", type=Path)
    r.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="per-cell execution timeout, s (default: the Slurm job's time left - 120 s, else 24 h)",
    )
    r.add_argument(
        "--name", default="", help="file name (without .ipynb) of the executed notebook (default: <notebook>-<job id>)"
    )
    sub.add_parser("parameters", help="print 01_train's parameters cell, generated from kernels/base/params.py")
    sub.add_parser("sync", help="regenerate the parameters cell and write the .ipynb twins of notebooks/*.py")
    args, rest = ap.parse_known_args(argv)
    if args.cmd == "parameters":
        print(parameters_cell())
        return 0
    if args.cmd == "sync":
        for path in sync():
            print(f"wrote {path.relative_to(PROJECT_ROOT)}")
        return 0
    return run(args.notebook, rest, args.timeout, args.name)


if __name__ == "__main__":
    exit_without_teardown(main())
