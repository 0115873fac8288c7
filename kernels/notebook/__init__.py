"""Notebook plumbing: the Papermill runner, its arguments and command line, the notebook kernel, the executed
notebook's HTML and tables, and `make demo`."""
