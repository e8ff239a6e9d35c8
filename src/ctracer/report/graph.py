"""Call graphs: who called whom on an object (networkx), laid out to SVG by graphviz.

`call_graph` turns timeline rows into a `networkx.DiGraph` whose nodes are functions
(plus one root standing for "not called by a traced function") and whose edges count
calls.  `write_svgs` lays graphs out with graphviz's ``dot``; many graphs go through one
``dot`` process, since starting it dominates for small graphs.  Labels come from the
trace, so they are passed through `graphviz.escape` and never read as HTML-like labels.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterable, Optional

import graphviz
import networkx as nx

from ctracer.event import PHASE_ENTRY
from ctracer.report.data import Row
from ctracer.report.values import format_duration

ROOT = -1
#: layouts beyond this many nodes take dot too long and are unreadable anyway
MAX_NODES = 400
_FONT = "DejaVu Sans"


def call_graph(rows: Iterable[Row], names: dict[int, str], root_label: str,
               changed_by: Optional[dict[int, int]] = None) -> nx.DiGraph:
    """A graph of calls among ``rows``: node per function id, edge caller → callee.

    Nesting is per thread among the rows given: one object's rows give calls made on
    that object inside calls on that object; all rows give the threads' nesting.  ``changed_by``
    counts the field changes each function made (by function id), to mark those nodes.
    """
    g = nx.DiGraph()
    g.add_node(ROOT, label=root_label, calls=0, total_ns=0, changes=0)
    stacks: dict[int, list[int]] = {}
    for row in rows:
        stack = stacks.setdefault(row.tid, [])
        fid = row.function_id
        if row.phase == PHASE_ENTRY:
            caller = stack[-1] if stack else ROOT
            if fid not in g:
                g.add_node(fid, label=names.get(fid, f"function#{fid}"), calls=0,
                           total_ns=0, changes=0)
            g.nodes[fid]["calls"] += 1
            if g.has_edge(caller, fid):
                g.edges[caller, fid]["calls"] += 1
            else:
                g.add_edge(caller, fid, calls=1)
            stack.append(fid)
        else:
            if fid in stack:
                while stack and stack.pop() != fid:
                    pass
            if fid not in g:  # an exit whose entry was lost
                g.add_node(fid, label=names.get(fid, f"function#{fid}"), calls=1,
                           total_ns=0, changes=0)
                g.add_edge(stack[-1] if stack else ROOT, fid, calls=1)
            if row.duration_ns is not None:
                g.nodes[fid]["total_ns"] += row.duration_ns
    if changed_by:
        for fid, data in g.nodes(data=True):
            if fid != ROOT:
                data["changes"] = changed_by.get(fid, 0)
    return g


def _dot_source(g: nx.DiGraph) -> str:
    d = graphviz.Digraph(graph_attr={"rankdir": "LR", "fontname": _FONT, "bgcolor": "white",
                                     "nodesep": "0.25", "ranksep": "0.45"},
                         node_attr={"fontname": _FONT, "fontsize": "11", "shape": "box",
                                    "style": "rounded,filled", "color": "#5f6b7a",
                                    "fillcolor": "#ffffff", "margin": "0.12,0.06"},
                         edge_attr={"fontname": _FONT, "fontsize": "9", "color": "#7d8896",
                                    "fontcolor": "#4a5360", "arrowsize": "0.6"})
    most = max((c for _, _, c in g.edges(data="calls")), default=1)
    for fid, data in g.nodes(data=True):
        node = "root" if fid == ROOT else f"f{fid}"
        if fid == ROOT:
            d.node(node, graphviz.escape(data["label"]), shape="ellipse", style="filled",
                   fillcolor="#e8edf3", color="#8795a5")
            continue
        calls, total = data["calls"], data["total_ns"]
        detail = f"{calls} call{'s' if calls != 1 else ''}"
        if total and calls:
            detail += f", avg {format_duration(total // calls)}"
        if data["changes"]:
            detail += f"\n{data['changes']} field change{'s' if data['changes'] != 1 else ''}"
        label = graphviz.escape(data["label"]) + "\n" + graphviz.escape(detail)
        attrs = {"tooltip": graphviz.escape(f"{data['label']}: {detail}")}
        if data["changes"]:
            attrs.update(fillcolor="#fbe3e1", color="#b03a2e")
        d.node(node, label, **attrs)
    for a, b, calls in g.edges(data="calls"):
        width = 0.8 + 2.2 * math.log1p(calls) / math.log1p(most)
        d.edge("root" if a == ROOT else f"f{a}", "root" if b == ROOT else f"f{b}",
               label=str(calls), penwidth=f"{width:.2f}")
    return d.source


@dataclass
class SvgJob:
    graph: nx.DiGraph
    path: str  # where the SVG goes


def dot_available() -> bool:
    return shutil.which("dot") is not None


def write_svgs(jobs: list[SvgJob], batch: int = 150) -> list[str]:
    """Lay out every graph to its SVG file; return one note per graph that was skipped."""
    notes = []
    todo = []
    for job in jobs:
        if job.graph.number_of_nodes() > MAX_NODES:
            notes.append(f"{job.path}: {job.graph.number_of_nodes()} functions, too many to lay out")
        else:
            todo.append(job)
    with tempfile.TemporaryDirectory(prefix="ctracer-dot-") as tmp:
        for start in range(0, len(todo), batch):
            chunk = todo[start:start + batch]
            sources = []
            for i, job in enumerate(chunk):
                src = os.path.join(tmp, f"g{start + i}.gv")
                with open(src, "w", encoding="utf-8") as f:
                    f.write(_dot_source(job.graph))
                sources.append(src)
            # -O writes <source>.svg next to each input, all from one process
            done = subprocess.run(["dot", "-Tsvg", "-O", *sources], capture_output=True,
                                  text=True)
            for job, src in zip(chunk, sources):
                out = src + ".svg"
                if os.path.exists(out):
                    shutil.move(out, job.path)
                else:
                    notes.append(f"{job.path}: dot failed: {done.stderr.strip()[:200]}")
    return notes
