"""Papermill's own command line, run inside the notebook runner's process, without one optional import.

`execute(args, env)` runs what `papermill ARGS` would run (every option of Papermill's, parsed by its own
command) in this process: the runner has already imported Papermill to check the parameters, so a second Python
process that imports it again (about 1 s on a 2-core machine) is not started. The kernel gets `env` on top of
this process's environment; Papermill's log reaches stderr as whole lines, without NOISE. The engine is
Papermill's own with two settings its command line cannot pass (register_engine).

Reading a notebook loads nbformat, whose validator loads jsonschema, which imports the optional format checkers
that are installed (jupyter-events installs them for the JupyterLab server). The IRI checker rfc3987_syntax
compiles a grammar: 0.9-2.4 s of every notebook run on a 2-core machine; the duration checker isoduration brings
arrow and dateutil, and the others their own modules: 0.06 s more. No notebook needs them: nbformat's schemas use
no "format" keyword, and nbformat validates without a format checker. `without_format_checkers()` skips them; the
runner and the HTML helper (kernels/notebook/html.py) call it before anything imports nbformat.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import signal
import sys
import threading
import traceback

# Papermill's lines that say nothing about the run: cell markers, the paths papermill echoes that the runner
# prints itself, and a figure's text form (the figure is in the HTML).
NOISE = re.compile(
    r"^(Executing|Ending) Cell \d+-*\s*$"
    r"|^Executing notebook with kernel: |^(Input|Output) Notebook: "
    r"|^<Figure size \d+x\d+ with \d+ Axes>\s*$"
)


# jsonschema's optional format checkers (jsonschema/_format.py) that nothing else the runner or the HTML helper
# imports. Not idna (requests needs it) nor jsonpointer (under 1 ms).
FORMAT_CHECKERS = (
    "rfc3987_syntax",
    "rfc3987",
    "rfc3986_validator",
    "rfc3339_validator",
    "isoduration",
    "webcolors",
    "uri_template",
    "fqdn",
)


def without_format_checkers() -> None:
    """Make each optional checker's import fail fast, as when it is not installed (jsonschema then skips that
    format). Only where it is not imported already: a process that has it keeps it."""
    for name in FORMAT_CHECKERS:
        sys.modules.setdefault(name, None)


class Lines(io.TextIOBase):
    """A text stream that passes each whole line on to `dst` unless it matches NOISE."""

    def __init__(self, dst):
        self.dst, self.part = dst, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.part = (self.part + text).split("\n")
        for line in lines:
            if not NOISE.search(line):
                self.dst.write(line + "\n")
        self.dst.flush()
        return len(text)

    def flush(self) -> None:
        self.dst.flush()

    def close(self) -> None:
        if self.part and not NOISE.search(self.part):
            self.dst.write(self.part)
        self.part = ""
        self.dst.flush()
        super().close()


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _own_logging():
    """Papermill configures the root logger (logging.basicConfig); put it back as it was afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(h)
        root.setLevel(level)


ENGINE = "lab"


def _unretrieved(record: logging.LogRecord) -> bool:
    """asyncio's report of the cell Ctrl-C cut short, when its task is collected: the cell's error (the
    kernel's KeyboardInterrupt) is in the log and the notebook already; its 60 lines of traceback say nothing."""
    return not record.getMessage().startswith("Task exception was never retrieved")


@contextlib.contextmanager
def _ctrl_c_lets_the_cell_end(client):
    """Ctrl-C interrupts the kernel and lets the cell it was running end; no other cell starts. The third stops the
    kernel without waiting.

    Without it, Ctrl-C raised KeyboardInterrupt in this process at once and nbclient asked the kernel to shut down
    while its cell still waited for the ranks to checkpoint: the kernel then failed to send the cell's reply on a
    socket already closed (a ZMQError traceback in the log), and was terminated 2.5 s later and killed 2.5 s after
    that, however far the ranks' checkpoint had got. Now the kernel gets SIGINT as Jupyter's interrupt sends it,
    and only once its cell has ended is it asked to stop. The lab's ranks checkpoint at their next agreed step on
    the first interrupt and leave at once on the second (the launcher kills any still there 3 s later), so the
    cell ends either way; a cell that ignores interrupts is what the third Ctrl-C is for."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from jupyter_core.utils import ensure_async, ensure_event_loop

    loop = ensure_event_loop()  # the loop nbclient's run_sync runs each cell on

    def on_int(signum, frame):
        if client.interrupted >= 2 or client.km is None:
            raise KeyboardInterrupt
        client.interrupted += 1
        if client.interrupted == 2:
            print(
                "papermill: Ctrl-C again: the kernel is interrupted once more; a third Ctrl-C stops it without "
                "waiting for its cell",
                file=sys.__stderr__,
                flush=True,
            )
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(ensure_async(client.km.interrupt_kernel())))

    previous = signal.signal(signal.SIGINT, on_int)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def register_engine(stop_now: bool = False, kernel=None) -> None:
    """Papermill's engine (nbclient) with four behaviours its command line cannot ask for, as engine "lab".

    - The kernel logs errors only (kernels/notebook/kernel.py: ARGUMENTS).
    - kernel: a kernels.notebook.kernel.Kernel started before Papermill was ready, taken instead of a new one
      when it is the kernel this client would start.
    - stop_now: once every cell has run (or one has failed), the kernel is killed instead of asked to stop:
      0.5-0.7 s sooner. Only for notebooks whose cells leave nothing for the interpreter's exit to finish (the
      lab's: no cell keeps a file open or registers exit handlers, and the launch cell returns after the ranks
      have ended). An interrupted or timed-out cell still gets the graceful stop, which sends the kernel's
      process group SIGINT, then SIGTERM, before it kills.
    - Ctrl-C interrupts the kernel's cell and waits for it to end, the ranks' chance to checkpoint, before the
      kernel is asked to stop (_ctrl_c_lets_the_cell_end).
    """
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger

    from kernels.notebook import kernel as notebook_kernel

    class LabClient(PapermillNotebookClient):
        interrupted = 0  # Ctrl-Cs so far: the cell they interrupted may end, no other starts

        def papermill_execute_cells(self):
            with _ctrl_c_lets_the_cell_end(self):
                super().papermill_execute_cells()
            if self.interrupted:  # the interrupted cell ended (its error is in the notebook): stop as Ctrl-C does
                raise KeyboardInterrupt
            if stop_now:  # every cell ended (papermill stops at a failed one): the kernel runs nothing
                self.shutdown_kernel = "immediate"

        def create_kernel_manager(self):
            km = kernel.take(self.kernel_name, self.extra_arguments) if kernel is not None else None
            if km is None:
                return super().create_kernel_manager()
            self.km = km
            return km

        def execute_cell(self, *args, **kwargs):
            if self.interrupted:  # Ctrl-C between two cells
                raise KeyboardInterrupt
            return super().execute_cell(*args, **kwargs)

    class LabEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(
            cls,
            nb_man,
            kernel_name,
            log_output=False,
            stdout_file=None,
            stderr_file=None,
            start_timeout=60,
            execution_timeout=None,
            **kwargs,
        ):
            """NBClientEngine's, with LabClient and the kernel's arguments."""
            timeout = execution_timeout or kwargs.get("timeout")
            for unused in ("input_path", "timeout", "startup_timeout"):  # as NBClientEngine drops them
                kwargs.pop(unused, None)
            return LabClient(
                nb_man,
                timeout=timeout,
                startup_timeout=start_timeout,
                kernel_name=kernel_name,
                log=logger,
                log_output=log_output,
                stdout_file=stdout_file,
                stderr_file=stderr_file,
                extra_arguments=list(notebook_kernel.ARGUMENTS),
                **kwargs,
            ).execute()

    papermill_engines.register(ENGINE, LabEngine)


def execute(args: list[str], env: dict[str, str], stop_now: bool = False, kernel=None) -> int:
    """`papermill --engine lab ARGS` in this process; its exit status (1 for a failed cell, 138 for a dead kernel,
    130 for Ctrl-C).

    stop_now: kill the kernel after the last cell; kernel: one already started (register_engine)."""
    without_format_checkers()
    import click
    from papermill.cli import papermill

    register_engine(stop_now, kernel)
    args = ["--engine", ENGINE, *args]  # a later --engine of the caller's wins

    out, err = Lines(sys.stdout), Lines(sys.stderr)
    try:
        with _environ(env), _own_logging(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                papermill.main(args, prog_name="papermill", standalone_mode=False)
            except SystemExit as e:  # papermill exits 138 for a dead kernel
                return e.code if isinstance(e.code, int) else 1
            except click.exceptions.Abort:  # Ctrl-C: the kernel was interrupted (its ranks checkpoint) and stopped
                print("papermill: interrupted (Ctrl-C); the notebook stopped in the cell it was running", file=err)
                logging.getLogger("asyncio").addFilter(_unretrieved)
                return 130
            except click.ClickException as e:
                e.show()
                return e.exit_code
            except Exception:  # a failed cell (PapermillExecutionError): its traceback, as papermill's exit shows it
                traceback.print_exc()
                return 1
            return 0
    finally:
        out.close()
        err.close()
