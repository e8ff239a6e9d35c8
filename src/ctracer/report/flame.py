"""The flame view's data: an object's (or all objects') stack tree
(`ctracer.analysis.stacks`) for ``_static/flame.js``, which draws it as an icicle
(callers above callees), each frame as wide as its time or its calls, a click zooming
into a frame, frames whose calls changed fields marked, each frame linked to the
timeline row of its first call.

A tree bigger than `MAX_FRAMES` keeps the frames with most calls below them (a frame's
callers are kept with it); what the others weighed is added to their nearest kept
caller's own calls and time, and that frame says how many it holds, so widths still add
up and the page stays small.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ctracer.analysis.model import function_label
from ctracer.analysis.stacks import StackTree

#: frames sent to the browser at most (a few tens of bytes each)
MAX_FRAMES = 6000


def _below(tree: StackTree, values: np.ndarray) -> np.ndarray:
    """Each node's value plus its descendants' (parents come before children)."""
    out = values.astype(np.int64).copy()
    for node in np.argsort(-tree.depth, kind="stable").tolist():
        p = int(tree.parent[node])
        if p >= 0:
            out[p] += out[node]
    return out


def _kept(tree: StackTree, limit: int) -> np.ndarray:
    """Which nodes to keep: the ``limit`` with most calls below them, ties broken by
    depth (a caller before its callees), so every kept node's caller is kept."""
    if len(tree) <= limit:
        return np.ones(len(tree), bool)
    below = _below(tree, tree.calls)
    order = np.lexsort((tree.depth, -below))
    keep = np.zeros(len(tree), bool)
    keep[order[:limit]] = True
    # an equal count and depth may still have left a caller out: keep the callers
    for node in np.flatnonzero(keep).tolist():
        p = int(tree.parent[node])
        while p >= 0 and not keep[p]:
            keep[p] = True
            p = int(tree.parent[p])
    return keep


def flame_data(tree: StackTree, names: dict[int, str], row_link: Callable[[int], tuple[int, int]],
               timed: bool, limit: int = MAX_FRAMES) -> dict:
    """The data of one flame view; ``row_link(first_row)`` gives (page number, seq) of
    a node's first call's row; ``timed``: the trace's calls have durations."""
    keep = _kept(tree, limit)
    calls = tree.calls.astype(np.int64).copy()
    self_ns = tree.self_ns.astype(np.int64).copy()
    changes = tree.changes.astype(np.int64).copy()
    folded_in = np.zeros(len(tree), np.int64)
    if not keep.all():
        # the nodes dropped hand their weights to their nearest kept caller
        target = np.arange(len(tree))
        for node in range(len(tree)):  # parents first: a parent's target is settled
            if not keep[node]:
                target[node] = target[int(tree.parent[node])]
        gone = np.flatnonzero(~keep)
        np.add.at(calls, target[gone], calls[gone])
        np.add.at(self_ns, target[gone], self_ns[gone])
        np.add.at(changes, target[gone], changes[gone])
        np.add.at(folded_in, target[gone], 1)
    nodes = np.flatnonzero(keep)
    small = tree.take(nodes)
    fids = small.function.tolist()
    distinct = sorted(set(fids))
    name_index = {fid: i for i, fid in enumerate(distinct)}
    links = [row_link(r) for r in small.first_row.tolist()]
    return {
        "names": [function_label(names, fid) for fid in distinct],
        "p": small.parent.tolist(), "f": [name_index[f] for f in fids],
        "c": calls[nodes].tolist(), "s": self_ns[nodes].tolist(),
        "x": changes[nodes].tolist(), "h": small.hit.astype(np.int8).tolist(),
        "more": folded_in[nodes].tolist(),
        "page": [link[0] for link in links], "seq": [link[1] for link in links],
        "timed": bool(timed and int(tree.self_ns.sum()) > 0),
        "dropped": int((~keep).sum()),
    }
