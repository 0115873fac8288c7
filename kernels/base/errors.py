"""The lab's one error type for bad input, and how a command turns it into exit status 2.

A leaf: every layer raises ConfigError, so it imports nothing of the lab.
"""

from __future__ import annotations

import sys


class ConfigError(ValueError):
    """A parameter or input is wrong; the message names it and the fix."""


def exit_status(body) -> int:
    """Run a command's body: a ConfigError becomes one line on stderr and exit status 2, the lab's convention."""
    try:
        return body() or 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
