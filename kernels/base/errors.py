"""The lab's one error type for bad input, and how a command turns it into exit status 2.

A leaf: every layer raises ConfigError, so it imports nothing of the lab.
"""

from __future__ import annotations

import errno
import sys


class ConfigError(ValueError):
    """A parameter or input is wrong; the message names it and the fix."""


# a file or folder the command may not write (or read): the user's to fix, not the lab's to trace back
NOT_PERMITTED = (errno.EACCES, errno.EPERM, errno.EROFS)


def exit_status(body) -> int:
    """Run a command's body: a ConfigError becomes one line on stderr and exit status 2, the lab's convention; so
    does a file or folder the command is not permitted to write, named with the fix."""
    try:
        return body() or 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:
        line = os_error_line(e)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        return 2


def os_error_line(e: OSError) -> str | None:
    """The one line an OSError is for the user, or None when it is not theirs to fix (no file to name): the lab's
    own write error as it is, and a file or folder they may not write, named with the fix."""
    if getattr(e, "path", None) and e.strerror:  # the lab's own write error (files.write_error) says it all
        return f"error: {e.strerror}"
    if e.errno not in NOT_PERMITTED or not e.filename:
        return None
    return (
        f"error: {e.filename}: {e.strerror}; it, or a folder above it, is read-only, immutable or not yours: "
        "choose another location or fix its permissions"
    )
