"""The interactive views of a timeline's first page: the call graph
(`ctracer.report.interactive_graph`) and the flame view (`ctracer.report.flame`), one
JSON island for both, with the links of their functions and frames to timeline rows.

`stack_trees` counts every chosen object's stacks in one pass, and all objects' (the
threads' stacks), before the pages are written; `views_data` makes one page's island.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ctracer.analysis import Analysis
from ctracer.analysis.callgraph import CallGraphCounts
from ctracer.analysis.memory import memory_limit
from ctracer.analysis.stacks import StackTree, all_objects_tree, object_trees
from ctracer.report.flame import flame_data
from ctracer.report.interactive_graph import graph_data


#: what counting stack trees holds per event while it runs (its int64 temporaries)
TREE_BYTES_PER_EVENT = 200


def trees_fit(events: int) -> bool:
    """Whether counting the stack trees of ``events`` events fits the memory limit the
    process runs under (a quarter of it; always without a limit): the count is made
    over every event at once, ~`TREE_BYTES_PER_EVENT` bytes each (2M events: ~400 MB)."""
    limit = memory_limit()
    return not limit or events * TREE_BYTES_PER_EVENT <= limit // 4


def stack_trees(a: Analysis, chosen: list[int], all_dir: str) -> dict[str, StackTree]:
    """The stack tree of each chosen object's page (by its directory) and of the
    all-objects page (``all_dir``); none where they would not fit the memory limit
    (`trees_fit`: the pages then show the call graph without the flame view)."""
    out: dict[str, StackTree] = {}
    if not len(a.events) or not trees_fit(len(a.events)):
        return out
    for o, tree in zip(chosen, object_trees(a, chosen)):
        out[a.objects.dirnames[o]] = tree
    out[all_dir] = all_objects_tree(a)
    return out


def views_data(a: Analysis, rows: np.ndarray, counts: Optional[CallGraphCounts], root_label: str,
               changed_by: dict[int, int], tree: Optional[StackTree], files: list[str],
               page_rows: int, stems: dict[int, str], *, root: str,
               methods_dir: str) -> dict[str, Any]:
    """One page's views: ``rows`` are its timeline's events (positions, in time order),
    shown ``page_rows`` a page in ``files``."""
    ev = a.events
    seq = ev.seq
    fids, first = np.unique(ev.function[rows], return_index=True)
    first_of = dict(zip(fids.tolist(), first.tolist()))

    def row_of(fid: int) -> Optional[tuple[int, int]]:
        i = first_of.get(fid)
        return None if i is None else (i // page_rows, int(seq[rows[i]]))

    def row_link(i: int) -> tuple[int, int]:
        return (i // page_rows, int(seq[rows[i]])) if 0 <= i < len(rows) else (-1, -1)

    timed = bool((ev.duration_ns[rows] >= 0).any()) if len(rows) else False
    out: dict[str, Any] = {"pages": files, "methods": f"{root}{methods_dir}/index.html"}
    if counts is not None and counts.functions:
        out["graph"] = graph_data(counts, a.function_names, root_label, changed_by, row_of,
                                  stems)
    if tree is not None and len(tree):
        out["flame"] = flame_data(tree, a.function_names, row_link, timed)
    return out
