"""The executed notebook's HTML page: nbconvert's lab page, with each figure's alternative text (kernels/base/alttext,
written by kernels/notebook/templates/lab_alt.html.j2).

Importing nbconvert and compiling its templates took about 2 s of every notebook run, after the notebook had
finished. `HtmlRenderer` starts a helper process when the run starts: it does that work at the lowest CPU priority
while Papermill starts its kernel, then waits, idle, for the executed notebook and renders it. Should the helper
fail, the page is rendered in a fresh process as before; either way the page is the same file.

nbconvert's HTMLExporter ends by parsing its whole page with BeautifulSoup and writing it out again, to give
each image without alt text its placeholder and make each cell's input and output focusable (tabindex="0"):
0.35 of the 0.5 s it took to render 01_train's executed page. `LabPage` writes the same attributes into the
template's own markup (`accessible`), without the second parse: the page is the same document, as
BeautifulSoup reads it (tests/test_notebooks.py).

    python -m kernels.notebook.html NOTEBOOK.ipynb    # render one page (what the runner falls back to)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from kernels.base import files

TEMPLATE = Path(__file__).resolve().parent / "templates" / "lab_alt.html.j2"
SERVE = "--serve"


NO_ALT = "No description has been provided for this image"  # HTMLExporter's placeholder
START_TAG = re.compile(
    r"<(div|img)\b((?:\s+[^\s=/>]+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+))?)*)\s*(/?)>", re.IGNORECASE
)
ATTRIBUTE = re.compile(r"""([^\s=/>]+)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s"'=<>`]+))?""")
FOCUSABLE = {"jp-Cell-inputWrapper", "jp-OutputArea-output"}  # the divs HTMLExporter gives tabindex="0"


def accessible(html: str) -> tuple[str, int]:
    """(`html` with HTMLExporter's last pass applied, images that lacked alt text): the placeholder alt for each
    image without one, tabindex="0" on each cell's input wrapper and output, each appended to its tag as
    BeautifulSoup appends an attribute. The page's body is the template's .jp-Notebook, so every such div is in it."""
    missing = 0

    def tag(m: re.Match) -> str:
        nonlocal missing
        name, attrs, slash = m.group(1).lower(), m.group(2), m.group(3)
        found = {a.group(1).lower(): (a.group(2) or "").strip("\"'") for a in ATTRIBUTE.finditer(attrs)}
        if name == "img" and "alt" not in found:
            missing += 1
            attrs += f' alt="{NO_ALT}"'
        elif name == "div" and FOCUSABLE & set(found.get("class", "").split()):
            if "tabindex" not in found:
                attrs += ' tabindex="0"'
            elif found["tabindex"] != "0":  # set in place, where BeautifulSoup keeps an existing attribute
                attrs = ATTRIBUTE.sub(
                    lambda a: 'tabindex="0"' if a.group(1).lower() == "tabindex" else a.group(0), attrs
                )
            else:
                return m.group(0)
        else:
            return m.group(0)
        return f"<{m.group(1)}{attrs}{slash}>"

    return START_TAG.sub(tag, html), missing


def exporter():
    from kernels.notebook.papermill_cli import without_format_checkers

    without_format_checkers()  # nbformat's jsonschema would import checkers no notebook needs (papermill_cli.py)
    from nbconvert import HTMLExporter
    from nbconvert.exporters.templateexporter import TemplateExporter
    from nbconvert.filters.highlight import Highlight2HTML
    from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

    class LabPage(HTMLExporter):
        """HTMLExporter with its last pass done on the template's markup (`accessible`) instead of a parsed copy."""

        def from_notebook_node(self, nb, resources=None, **kw):
            """HTMLExporter.from_notebook_node (nbconvert 7.17) up to its BeautifulSoup pass, then `accessible`."""
            langinfo = nb.metadata.get("language_info", {})
            lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
            highlight_code = self.filters.get("highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self))
            resources = self._init_resources(resources)
            filter_data_type = WidgetsDataTypeFilter(
                notebook_metadata=self._nb_metadata, parent=self, resources=resources
            )
            self.register_filter("highlight_code", highlight_code)
            self.register_filter("filter_data_type", filter_data_type)
            html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
            html, missing = accessible(html)
            if missing:
                self.log.warning("Alternative text is missing on %s image(s).", missing)
            return html, resources

    return LabPage(template_file=str(TEMPLATE))


def render(notebook: Path, html_exporter=None) -> Path:
    """<notebook>.html beside the notebook."""
    notebook = Path(notebook)
    body, _ = (html_exporter or exporter()).from_filename(str(notebook))
    out = notebook.with_suffix(".html")
    files.atomic_write_text(out, body)
    return out


class HtmlRenderer:
    """A helper process that has imported nbconvert by the time the notebook ends; one page per helper."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernels.notebook.html", SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def render(self, notebook: Path) -> Path | None:
        """The HTML page of the executed notebook; None, said on stderr, when neither the helper nor a new process
        could write it (a full disk): the page is a view of the notebook, whose run has ended either way."""
        try:
            out, _ = self.proc.communicate(f"{notebook}\n", timeout=600)
            if self.proc.returncode == 0 and out.strip() and Path(out.strip()).is_file():
                return Path(out.strip())
        except (OSError, subprocess.TimeoutExpired):
            self.close()
        print(
            f"notebook: the HTML helper failed (exit status {self.proc.returncode}); rendering in a new process",
            file=sys.stderr,
            flush=True,
        )
        p = subprocess.run([sys.executable, "-m", "kernels.notebook.html", str(notebook)])
        if p.returncode == 0:
            return Path(notebook).with_suffix(".html")
        print(
            f"warning: no HTML page for {notebook}: the renderer failed again (exit status {p.returncode}, its "
            f"error above); the notebook itself is there, and `python -m kernels.notebook.html {notebook}` renders "
            f"it once the cause is fixed",
            file=sys.stderr,
            flush=True,
        )
        return None

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
        print("usage: python -m kernels.notebook.html NOTEBOOK.ipynb", file=sys.stderr)
        return 2
    print(render(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
