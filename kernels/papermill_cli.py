"""Papermill's own command line (what `python -m papermill` runs), started without one optional import.

Reading a notebook loads nbformat, whose validator loads jsonschema, which imports the optional IRI checker
rfc3987_syntax if it is installed (jupyter-events installs it for the JupyterLab server). That import compiles a
grammar: about 0.9 s of every notebook run on a 2-core machine, for a check no notebook needs, since nbformat's
schemas have no IRI formats. Here, and in the HTML helper (kernels/notebook_html), the import is skipped; the
rest is Papermill as installed.

    python -m kernels.papermill_cli NOTEBOOK OUTPUT [papermill's options]
"""
from __future__ import annotations

import sys


def without_iri_checker() -> None:
    """Make `import rfc3987_syntax` fail fast, as when it is not installed (jsonschema then skips the IRI formats)."""
    sys.modules.setdefault("rfc3987_syntax", None)


if __name__ == "__main__":
    without_iri_checker()
    from papermill.cli import papermill

    papermill()
