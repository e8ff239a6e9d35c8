"""Runs the ctracer command line in a child interpreter, as a user would, for tests that
check its output and exit status; a traceback on stderr fails the test at once."""

from __future__ import annotations

import subprocess
import sys


def ctracer(*args, cwd):
    """``python -m ctracer ARGS`` in ``cwd``; the completed process (text output)."""
    r = subprocess.run([sys.executable, "-m", "ctracer", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r
