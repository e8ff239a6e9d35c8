"""What the guest modules share: the one-line refusal with its exit status, and the
cache the kernels and runs live in."""

from __future__ import annotations

import os
import re

from ctracer.errors import CtracerError


class Refused(CtracerError):
    """One line for the user, and the exit status."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status
        self.exit_status = status

def cache_root() -> str:
    """Where the guests' kernels are cached (``$XDG_CACHE_HOME/ctracer/vm``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ctracer", "vm")


def _version_key(text: str) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", text))
