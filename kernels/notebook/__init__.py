"""Notebook plumbing: the Papermill runner, its arguments and command line, the notebook kernel, the executed
notebook's HTML and tables, `lab submit` (one notebook run as a Slurm job, checked first) and `make demo`."""
