"""The kernel a notebook run executes in, started before Papermill asks for it.

A Python kernel takes about 1 s of CPU to start (ipykernel's imports and IPython's shell), and Papermill starts it
only once it has imported itself, read the notebook and written the first copy of the output. `start(env)` launches
it first, so that it boots while the runner checks the parameters and Papermill gets ready: on two cores the two
proceed side by side. The engine (kernels/papermill_cli) then takes this kernel as if it had started it, when it is
the kernel Papermill would start: the same kernel name, arguments, working directory and environment. If not (a
`--kernel` or `--cwd` of the caller's), it stops this one and starts its own, as Papermill does.
"""
from __future__ import annotations

import os
import sys

NAME = "python3"  # the kernel the runner asks Papermill for (--kernel)
# The kernel logs errors only: its one warning in a run says it speaks TCP without encryption, to this node over
# loopback, and would reach the job's log unfiltered. History in memory, as nbclient gives every kernel it starts.
ARGUMENTS = ["--IPKernelApp.log_level=ERROR", "--HistoryManager.hist_file=:memory:"]


def start(env: dict[str, str]) -> "Kernel | None":
    """The kernel started now, or None where it cannot be (no such kernel, no Python to run it): Papermill then
    tries itself and reports the problem as it always has."""
    from jupyter_client.kernelspec import NoSuchKernel

    try:
        return Kernel(env)
    except (NoSuchKernel, OSError):
        return None


class Kernel:
    """A started kernel's manager, with what it was started with."""

    def __init__(self, env: dict[str, str]):
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        # Papermill's command line sets this for its kernels (a debugger warning Python 3.11 would print)
        self.env = {"PYDEVD_DISABLE_FILE_VALIDATION": "1", **os.environ, **env}
        self.cwd = os.getcwd()
        self.km = AsyncKernelManager(kernel_name=NAME)
        run_sync(self.km.start_kernel)(extra_arguments=ARGUMENTS, env=self.env)

    def take(self, kernel_name: str | None, arguments: list[str]):
        """The manager, for a client that would start `kernel_name` with `arguments` in this process's working
        directory and environment; None for any other, this kernel stopped and the difference printed."""
        differs = [what for what, same in (("kernel name", kernel_name == NAME), ("arguments", arguments == ARGUMENTS),
                                           ("working directory", os.getcwd() == self.cwd),
                                           ("environment", dict(os.environ) == self.env),
                                           ("kernel alive", self.km.has_kernel)) if not same]
        if not differs:
            return self.km
        self.stop()
        print(f"notebook: the kernel started ahead differs from the one asked for ({', '.join(differs)}); "
              f"Papermill starts its own", file=sys.stderr, flush=True)
        return None

    def stop(self) -> None:
        """Kill the kernel unless its client has stopped it already (a run that never reached it, an error)."""
        from jupyter_core.utils import run_sync

        if self.km.has_kernel:
            run_sync(self.km.shutdown_kernel)(now=True)
