"""The scaling lab's importable core: everything that crosses a process boundary.

Needs torch and numpy only. See kernels/ddp_core.py for the training loop,
kernels/base/params.py for the parameters and kernels/records/schema.py for run records.
"""

__version__ = "1.0.0"  # the one place: pyproject.toml, CITATION.cff and .zenodo.json read or match it
