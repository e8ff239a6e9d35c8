"""Folded stacks (``a;b;c N``, one line per stack), which flamegraph.pl, inferno and
speedscope open: the stacks the report's flame view draws (`ctracer.analysis.stacks`).

Stacks are the threads' nesting over all events (what the all-objects flame view
shows), or with ``per_object`` each object's own calls nested as on its page, under a
first frame naming the object.  The weight is ``calls`` (the calls at exactly that
stack: a frame's width is then the calls it and its callees made) or ``time`` (the
nanoseconds spent in that stack's calls and not in traced calls they made: a frame's
width is its calls' time).
"""

from __future__ import annotations

import numpy as np

from ctracer.analysis import Analysis
from ctracer.analysis.model import function_label
from ctracer.analysis.stacks import StackTree, folded_lines, stack_tree
from ctracer.files import staged_output

WEIGHTS = ("time", "calls")


def all_objects_tree(a: Analysis) -> StackTree:
    """The threads' stacks over every event (one group)."""
    ev = a.events
    rows = np.arange(len(ev))
    return stack_tree(ev, rows, np.zeros(len(rows), np.int64), ev.depth, a.changes.event,
                      a.changes.function)


def object_trees(a: Analysis, chosen: list[int]) -> list[StackTree]:
    """Each chosen object's stacks, its calls nested among its own (one pass for all)."""
    ev = a.events
    positions, offsets = a.objects.event_groups(chosen)
    group = np.repeat(np.arange(len(chosen), dtype=np.int64), np.diff(offsets))
    cpos, coff = a.objects.change_groups(chosen)
    cgroup = np.repeat(np.arange(len(chosen), dtype=np.int64), np.diff(coff))
    # a change's event as an index into ``positions`` (groups' keys sorted, then search)
    width = len(ev) + 1
    keys = group * width + positions
    at = np.searchsorted(keys, cgroup * width + a.changes.event[cpos])
    tree = stack_tree(ev, positions, group, ev.object_depth, at, a.changes.function[cpos])
    return tree.groups(len(chosen))


def folded_text(a: Analysis, weight: str = "time", per_object: bool = False) -> list[str]:
    names = a.function_names

    def label(fid: int) -> str:
        return function_label(names, fid)

    if not per_object:
        return folded_lines(all_objects_tree(a), label, weight)
    chosen = list(range(len(a.objects)))
    out: list[str] = []
    for o, tree in zip(chosen, object_trees(a, chosen)):
        out += folded_lines(tree, label, weight, prefix=a.objects.labels[o])
    return out


def write_lines(lines: list[str], output) -> None:
    """Write folded lines to ``output`` (a path; None: stdout)."""
    text = "".join(line + "\n" for line in lines)
    if output is None:
        import sys

        sys.stdout.write(text)
        return
    with staged_output(output) as staged, open(staged, "w", encoding="utf-8") as f:
        f.write(text)
