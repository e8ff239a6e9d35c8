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

from ctracer.analysis import Analysis
from ctracer.analysis.model import function_label
from ctracer.analysis.stacks import all_objects_tree, folded_lines, object_trees
from ctracer.files import staged_output

WEIGHTS = ("time", "calls")


def folded_text(a: Analysis, weight: str = "time", per_object: bool = False) -> list[str]:
    """The folded-stack lines of the trace (``a;b;c N``, weighted by time or calls): of all
    objects together, or with ``per_object`` each object's under its name."""
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
