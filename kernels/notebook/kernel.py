"""The kernel a notebook run executes in, started before Papermill asks for it.

A Python kernel takes about 1 s of CPU to start (ipykernel's imports and IPython's shell), and Papermill starts it
only once it has imported itself, read the notebook and written the first copy of the output. `start(env)` launches
it first, so that it boots while the runner checks the parameters and Papermill gets ready: on two cores the two
proceed side by side. The engine (papermill_cli.py) then takes this kernel as if it had started it, when it is
the kernel Papermill would start: the same kernel name, arguments, working directory and environment. If not (a
`--kernel` or `--cwd` of the caller's), it stops this one and starts its own, as Papermill does.

The kernel is ipykernel's, launched by this module (`launch`) instead of ipykernel_launcher when the kernel's
spec is ipykernel's own (`python -m ipykernel_launcher -f {connection_file}`): the same kernel, without the
debugger. ipykernel imports debugpy as it starts, for JupyterLab's visual debugger, which a run that no one
attaches to never uses: 0.24 of the kernel's 0.8 s of start-up CPU. Once the kernel has started, a cell can
import debugpy as always. The launcher can also import libraries the notebook will import (`start(preload=)`)
in a thread, while the kernel waits for Papermill and runs the notebook's first cells: the runner asks for pandas
for the lab's own notebooks, whose first imports it is (0.3-0.6 s on a 2-core machine).
"""

from __future__ import annotations

import os
import sys

NAME = "python3"  # the kernel the runner asks Papermill for (--kernel)
LAUNCHER = ["-m", "ipykernel_launcher"]  # after the interpreter in ipykernel's kernel spec; `launch` replaces it
# The kernel logs errors only: its one warning in a run says it speaks TCP without encryption, to this node over
# loopback, and would reach the job's log unfiltered. History in memory, as nbclient gives every kernel it starts.
ARGUMENTS = ["--IPKernelApp.log_level=ERROR", "--HistoryManager.hist_file=:memory:"]


PRELOAD = "--preload="  # the launcher's own option: modules to import in a thread, comma-separated


def start(env: dict[str, str], preload: tuple[str, ...] = ()) -> "Kernel | None":
    """The kernel started now, or None where it cannot be (no such kernel, no Python to run it): Papermill then
    tries itself and reports the problem as it always has. preload: modules it imports in a thread once started."""
    from jupyter_client.kernelspec import NoSuchKernel

    try:
        return Kernel(env, preload)
    except (NoSuchKernel, OSError):
        return None


class Kernel:
    """A started kernel's manager, with what it was started with."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = ()):
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        # Papermill's command line sets this for its kernels (a debugger warning Python 3.11 would print)
        self.env = {"PYDEVD_DISABLE_FILE_VALIDATION": "1", **os.environ, **env}
        self.cwd = os.getcwd()

        class Manager(AsyncKernelManager):
            def format_kernel_cmd(self, extra_arguments=None):
                """ipykernel's command, with this module as its launcher (`launch`)."""
                cmd = super().format_kernel_cmd(extra_arguments)
                if cmd[1:3] != LAUNCHER:
                    return cmd
                return [cmd[0], "-m", __name__, *([PRELOAD + ",".join(preload)] if preload else []), *cmd[3:]]

        self.km = Manager(kernel_name=NAME)
        run_sync(self.km.start_kernel)(extra_arguments=ARGUMENTS, env=self.env)

    def take(self, kernel_name: str | None, arguments: list[str]):
        """The manager, for a client that would start `kernel_name` with `arguments` in this process's working
        directory and environment; None for any other, this kernel stopped and the difference printed."""
        differs = [
            what
            for what, same in (
                ("kernel name", kernel_name == NAME),
                ("arguments", arguments == ARGUMENTS),
                ("working directory", os.getcwd() == self.cwd),
                ("environment", dict(os.environ) == self.env),
                ("kernel alive", self.km.has_kernel),
            )
            if not same
        ]
        if not differs:
            return self.km
        self.stop()
        print(
            f"notebook: the kernel started ahead differs from the one asked for ({', '.join(differs)}); "
            f"Papermill starts its own",
            file=sys.stderr,
            flush=True,
        )
        return None

    def stop(self) -> None:
        """Kill the kernel unless its client has stopped it already (a run that never reached it, an error)."""
        from jupyter_core.utils import run_sync

        if self.km.has_kernel:
            run_sync(self.km.shutdown_kernel)(now=True)


def launch() -> None:
    """ipykernel_launcher's work (its kernel app, given this process's arguments), with debugpy unimportable while
    the kernel starts: ipykernel then starts without its debugger, as where debugpy is not installed. A first
    argument --preload=MODULE,... is the launcher's: those modules are imported in a thread once the kernel has
    started (a failed import is left for the cell that imports the module to report).

    SIGINT is ignored from the first line, as ipykernel ignores it once initialised (IPKernelApp.init_signal): a
    run refused before Papermill starts stops the kernel (an interrupt, then a kill), and an interrupt that lands
    during the imports would print a KeyboardInterrupt traceback under the refusal's one-line error."""
    import signal
    from pathlib import Path

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    if sys.path[0] == "" or Path(sys.path[0]) == Path.cwd():  # as ipykernel_launcher: the shell adds it back
        del sys.path[0]
    preload = []
    if len(sys.argv) > 1 and sys.argv[1].startswith(PRELOAD):
        preload = [m for m in sys.argv.pop(1)[len(PRELOAD) :].split(",") if m]
    blocked = "debugpy" not in sys.modules
    if blocked:
        sys.modules["debugpy"] = None
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize()
    if blocked:
        del sys.modules["debugpy"]  # the kernel has decided; a cell may import it
    if preload:
        import threading

        threading.Thread(target=_import_quietly, args=(preload,), name="preload", daemon=True).start()
    app.start()


def _import_quietly(modules: list[str]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the notebook's own import raises it where it belongs
            pass


if __name__ == "__main__":
    launch()
