"""`lab`: the one command of the scaling lab (installed into .venv/bin by `make setup`).

    lab train     ...   train from the command line (python -m kernels.train)
    lab run NB    ...   run a notebook headless with Papermill, filed with its record
    lab notebooks sync|parameters
    lab submit    ...   sbatch a notebook run with the geometry computed from --gpus
    lab study     submit|status|resubmit|points STUDY.yaml
    lab sweep     submit|collect SWEEP.yaml
    lab sysinfo   ...   describe this node (writes SYSTEM.md)
    lab fetch     ...   download and verify a data set
    lab bigmnist  build|submit|verify|info   the 72 M-sample bigMNIST in shards
    lab paper     ...   records -> analysis -> paper, proposal and slides
    lab jupyter   ...   JupyterLab on this repository (.py notebooks open as notebooks)
    lab records-doc     print the record schema (results/README.md)
    lab --version       the lab's version (also in every record's config.json versions.lab)

`lab <command> --help` describes each. Every command is also `python -m kernels.<module>`.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

COMMANDS = {
    "train": ("kernels.train", "train from the command line"),
    "run": ("kernels.notebook.runner", "run a notebook headless with Papermill"),
    "notebooks": ("kernels.notebook.runner", "regenerate the parameters cell and the .ipynb twins"),
    "submit": ("kernels.notebook.submit", "sbatch a notebook run with the geometry computed from --gpus"),
    "study": ("kernels.slurm.study", "scaling studies on Slurm: submit, status, resubmit, points"),
    "comm": (
        "kernels.comm.__main__",
        "collective microbenchmarks (nccl-tests layout), alpha-beta fits, scaling prediction",
    ),
    "sweep": ("kernels.slurm.sweep", "sweep any executable over a grid as a job array"),
    "sysinfo": ("kernels.slurm.system_doc", "describe the target systems and this machine; writes SYSTEM.md"),
    "fetch": ("kernels.data.fetch", "download and verify a data set"),
    "bigmnist": ("kernels.slurm.bigmnist_jobs", "build (here or as a job array), verify and describe bigMNIST"),
    "paper": ("kernels.report.documents", "records -> analysis -> paper, proposal and slides"),
    "jupyter": (None, "JupyterLab on this repository"),
    "records-doc": ("kernels.records.schema", "print the run-record schema as Markdown"),
}


def jupyter(argv: list[str]) -> int:
    """JupyterLab rooted at the repository; jupytext (installed with the lab) opens notebooks/*.py as notebooks."""
    from kernels.base.files import PROJECT_ROOT

    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={PROJECT_ROOT}", "--no-browser"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    os.execv(sys.executable, cmd + argv)
    return 0  # not reached


def usage() -> str:
    width = max(map(len, COMMANDS))
    return (
        "usage: lab COMMAND [ARGS]\n\n"
        + "\n".join(f"  {k:<{width}}  {doc}" for k, (_, doc) in COMMANDS.items())
        + "\n\n`lab COMMAND --help` describes each command."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from kernels import __version__

        print(f"scaling-lab {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(cmd, COMMANDS, n=1)
        print(
            f"lab: unknown command '{cmd}'" + (f"; did you mean '{close[0]}'?" if close else "") + "\n\n" + usage(),
            file=sys.stderr,
        )
        return 2
    if cmd == "jupyter":
        return jupyter(rest)
    module = importlib.import_module(COMMANDS[cmd][0])
    if cmd == "run":
        rest = ["run", *rest]
    if cmd == "records-doc":
        from kernels.workloads import record_fields

        print(module.schema_markdown(record_fields()), end="")
        return 0
    sys.argv = [f"lab {cmd}", *rest]
    try:
        rc = module.main(rest)
        sys.stdout.flush()  # here, not at the interpreter's exit, where a reader that left is a traceback too
    except BrokenPipeError:  # the reader left (`lab study status ... | head`): no traceback, the shell's status
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 128 + signal.SIGPIPE
    if cmd == "run":  # the run is over: this process ends without the interpreter's teardown (0.3 s)
        module.exit_without_teardown(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
