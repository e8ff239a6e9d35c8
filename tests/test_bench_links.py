"""The halving search the kprobe.multi benches use to name what a refused link is
refused on (`bench_tracing_multi.refused_parts`), on a fake kernel that refuses some
names alone and one pair only together."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_tracing_multi as tm  # noqa: E402

NAMES = [f"f{i}" for i in range(37)]


def _kernel(alone: dict, together: tuple = ()):
    """A link attempt: the errno of the first name refused alone in the part, E2BIG
    when the part holds every name of ``together``, else 0; and the parts tried."""
    tried: list = []

    def attempt(part):
        tried.append(list(part))
        for name in part:
            if name in alone:
                return alone[name]
        return errno.E2BIG if together and set(together) <= set(part) else 0
    return attempt, tried


def test_names_refused_alone_are_found_each_with_its_errno():
    attempt, tried = _kernel({"f3": errno.EINVAL, "f30": errno.ENOENT})
    assert tm.refused_parts(NAMES, attempt, errno.EINVAL) == [
        (["f3"], errno.EINVAL), (["f30"], errno.ENOENT)]
    assert len(tried) < len(NAMES)   # halving, not one name at a time


def test_a_part_refused_only_as_a_whole_is_given_whole():
    attempt, _ = _kernel({}, together=("f1", "f35"))
    assert tm.refused_parts(NAMES, attempt, errno.E2BIG) == [(NAMES, errno.E2BIG)]
    attempt, _ = _kernel({}, together=("f1", "f5"))
    assert tm.refused_parts(NAMES, attempt, errno.E2BIG) == [(NAMES[:9], errno.E2BIG)]
