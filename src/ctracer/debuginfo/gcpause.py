"""Pausing Python's cyclic garbage collector while a bulk of long-lived objects is built.

A full collection walks every object alive, and building hundreds of thousands of
objects that all survive (a catalog's rows, pyelftools' DIE caches, the rows of a
kernel-sized query) triggers collection after collection that finds nothing to free:
on a vmlinux 0.7-1.3 s of a cold catalog and pauses of up to 0.2 s in single
`find_struct` calls.  `collector_paused` turns it off for such a build; with
``freeze``, what is alive afterwards leaves the collector's sight (`gc.freeze`), so
later collections no longer walk it either (for data kept for the life of the process).
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_paused(freeze: bool = False):
    """A context with the garbage collector off; with ``freeze``, what is alive at the end
    is frozen out of later collections."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if freeze:
                gc.freeze()
            gc.enable()
