"""The executed notebook's HTML page: nbconvert's lab page, with each figure's alternative text (kernels/alttext,
written by kernels/templates/lab_alt.html.j2).

Importing nbconvert and compiling its templates took about 2 s of every notebook run, after the notebook had
finished. `HtmlRenderer` starts a helper process when the run starts: it does that work at the lowest CPU priority
while Papermill starts its kernel, then waits, idle, for the executed notebook and renders it. Should the helper
fail, the page is rendered in a fresh process as before; either way the page is the same file.

    python -m kernels.notebook_html NOTEBOOK.ipynb    # render one page (what the runner falls back to)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "templates" / "lab_alt.html.j2"
SERVE = "--serve"


def exporter():
    from kernels.papermill_cli import without_iri_checker

    without_iri_checker()  # nbformat's jsonschema would compile an unused IRI grammar (kernels/papermill_cli)
    from nbconvert import HTMLExporter

    return HTMLExporter(template_file=str(TEMPLATE))


def render(notebook: Path, html_exporter=None) -> Path:
    """<notebook>.html beside the notebook."""
    notebook = Path(notebook)
    body, _ = (html_exporter or exporter()).from_filename(str(notebook))
    out = notebook.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return out


class HtmlRenderer:
    """A helper process that has imported nbconvert by the time the notebook ends; one page per helper."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "kernels.notebook_html", SERVE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def render(self, notebook: Path) -> Path:
        try:
            out, _ = self.proc.communicate(f"{notebook}\n", timeout=600)
            if self.proc.returncode == 0 and out.strip() and Path(out.strip()).is_file():
                return Path(out.strip())
        except (OSError, subprocess.TimeoutExpired):
            self.close()
        print(f"notebook: the HTML helper failed (exit status {self.proc.returncode}); rendering in a new process",
              file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "kernels.notebook_html", str(notebook)], check=True)
        return Path(notebook).with_suffix(".html")

    def close(self) -> None:
        """End the helper if it still waits (the run ended without a notebook to render)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def serve() -> int:
    """The helper: import and compile at the lowest priority, then render the one notebook named on stdin."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the runner decides: it ends the helper, or its exit closes stdin
        signal.signal(sig, signal.SIG_IGN)
    os.nice(19)  # yields to the kernel's start and to the ranks, should it still be importing when they run
    html_exporter = exporter()
    import nbformat

    html_exporter.from_notebook_node(nbformat.v4.new_notebook())  # compiles the templates now
    line = sys.stdin.readline().strip()
    if not line:  # the runner closed the pipe: no notebook to render
        return 0
    print(render(Path(line), html_exporter), flush=True)
    os._exit(0)  # the page is written and named: the runner, waiting for this exit, need not wait for the teardown


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == [SERVE]:
        return serve()
    if len(args) != 1:
        print("usage: python -m kernels.notebook_html NOTEBOOK.ipynb", file=sys.stderr)
        return 2
    print(render(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
