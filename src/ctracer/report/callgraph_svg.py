"""Call graphs: who called whom on an object (networkx), laid out to SVG by graphviz.

`call_graph` turns the call counts of some events (`ctracer.analysis.callgraph`) into a
`networkx.DiGraph` whose nodes are functions (plus one root standing for "not called by
a traced function") and whose edges count calls.  Thousands of objects of one struct
share a handful of graph shapes (the same functions calling each other, with other
counts; `shape_key`, read from the counts), so `layout_shapes` lays out one graph of
each shape with graphviz's ``dot`` (many shapes per process, room reserved for any
count) and `svg` draws each object's graph straight from its counts as inline SVG on
its shape's layout, with links from each function to its timeline rows and methods
entry.
Labels come from the trace: passed through `graphviz.escape` for dot (never read as
HTML-like labels) and through `markupsafe.escape` into the SVG.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Optional

import graphviz
import networkx as nx
from markupsafe import Markup, escape

from ctracer.analysis.callgraph import ROOT, CallGraphCounts
from ctracer.analysis.model import function_label
from ctracer.report.values import format_duration

#: layouts beyond this many nodes take dot too long and are unreadable anyway
MAX_NODES = 400
_FONT = "DejaVu Sans"


def call_graph(counts: CallGraphCounts, names: dict[int, str], root_label: str,
               changed_by: Optional[dict[int, int]] = None) -> nx.DiGraph:
    """A graph of the calls `ctracer.analysis.callgraph` counted: node per function id,
    edge caller → callee; a tracepoint's node (``hit``) counts its hits, under the call
    running at each.  ``changed_by`` counts the field changes each function made (by
    function id), to mark those nodes."""
    nodes, edges = _nodes_and_edges(counts, names, root_label, changed_by or {})
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((a, b, {"calls": n}) for a, b, n in edges)
    return g


#: what a node's second line may hold at most: the layout reserves this width, so one
#: layout serves every object whose graph has the same shape, whatever its counts
_DETAIL_WIDEST = "888888 calls · 888.8 µs · 8888 chg"
_EDGE_WIDEST = "8888888"
_ROOT_WIDEST = "0xffff888812345678-888"
_PX = 72.0  # dot's plain output is in inches; SVG user units are points


def shape_key(counts: CallGraphCounts, names: dict[int, str]) -> tuple:
    """What decides the layout of `call_graph(counts, names, ...)`: the functions and who
    calls whom, not the counts (read from the counts: no graph is built for it)."""
    return (tuple(sorted((fid, function_label(names, fid)) for fid in counts.functions)),
            tuple(sorted(counts.edges)))


def node_count(counts: CallGraphCounts) -> int:
    """The nodes of `call_graph(counts, ...)`: its functions and the root."""
    return len(counts.functions) + 1


def _node_id(fid: int) -> str:
    return "root" if fid == ROOT else f"f{fid}" if fid >= 0 else f"m{-fid}"


def _dot_source(g: nx.DiGraph) -> str:
    """The graph for dot, with the widest labels any count could need."""
    d = graphviz.Digraph(graph_attr={"rankdir": "LR", "nodesep": "0.25", "ranksep": "0.45"},
                         node_attr={"fontname": _FONT, "fontsize": "11", "shape": "box",
                                    "margin": "0.12,0.06"},
                         edge_attr={"fontname": _FONT, "fontsize": "9"})
    for fid, data in sorted(g.nodes(data=True)):
        if fid == ROOT:
            d.node("root", _ROOT_WIDEST, shape="ellipse")  # the object's name, any
        else:
            d.node(_node_id(fid), graphviz.escape(data["label"]) + "\n" + _DETAIL_WIDEST)
    for a, b in sorted(g.edges()):
        d.edge(_node_id(a), _node_id(b), label=_EDGE_WIDEST)
    return d.source


@dataclass
class DotLayout:
    """A layout from dot: node boxes (centre x, y, width, height) and edge splines, in
    SVG units with y down."""

    width: float
    height: float
    nodes: dict[str, tuple[float, float, float, float]]
    edges: dict[tuple[str, str], tuple[list[tuple[float, float]], Optional[tuple[float, float]]]]
    #: each edge's SVG path data, made once per shape however many graphs it draws
    _paths: dict[tuple[str, str], str] = field(default_factory=dict)

    def path(self, edge: tuple[str, str]) -> Optional[str]:
        """The SVG path data of an edge's spline (None: dot drew no such edge)."""
        d = self._paths.get(edge)
        if d is None:
            spline = self.edges.get(edge)
            if spline is None:
                return None
            points = spline[0]
            d = f"M{points[0][0]:.1f},{points[0][1]:.1f}"
            for i in range(1, len(points) - 2, 3):
                (x1, y1), (x2, y2), (x3, y3) = points[i:i + 3]
                d += f" C{x1:.1f},{y1:.1f} {x2:.1f},{y2:.1f} {x3:.1f},{y3:.1f}"
            self._paths[edge] = d
        return d


def _parse_plain(text: str) -> DotLayout:
    width = height = 0.0
    nodes: dict = {}
    edges: dict = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "graph":
            width, height = float(parts[2]) * _PX, float(parts[3]) * _PX
        elif parts[0] == "node":
            x, y, w, h = (float(v) * _PX for v in parts[2:6])
            nodes[parts[1]] = (x, height - y, w, h)
        elif parts[0] == "edge":
            n = int(parts[3])
            coords = [float(v) * _PX for v in parts[4:4 + 2 * n]]
            points = [(coords[i], height - coords[i + 1]) for i in range(0, len(coords), 2)]
            rest = parts[4 + 2 * n:]
            label = None
            if len(rest) >= 5:  # label x y style color
                label = (float(rest[1]) * _PX, height - float(rest[2]) * _PX)
            edges[(parts[1], parts[2])] = (points, label)
    return DotLayout(width, height, nodes, edges)


def layout_shapes(shapes: dict[tuple, nx.DiGraph], batch: int = 200
                  ) -> tuple[dict[tuple, DotLayout], list[str]]:
    """Lay out one graph of each shape (`shape_key` -> a graph of it), many graphs per
    ``dot`` process; return the layouts by shape and a note per shape dot failed on."""
    placed: dict[tuple, DotLayout] = {}
    notes = []
    items = list(shapes.items())
    with tempfile.TemporaryDirectory(prefix="ctracer-dot-") as tmp:
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            sources = []
            for i, (_, g) in enumerate(chunk):
                src = os.path.join(tmp, f"g{start + i}.gv")
                with open(src, "w", encoding="utf-8") as f:
                    f.write(_dot_source(g))
                sources.append(src)
            done = subprocess.run(["dot", "-Tplain", "-O", *sources], capture_output=True,
                                  text=True)
            for (key, _), src in zip(chunk, sources):
                out = src + ".plain"
                if os.path.exists(out):
                    with open(out, encoding="utf-8") as f:
                        placed[key] = _parse_plain(f.read())
                else:
                    notes.append(f"dot failed on a call graph: {done.stderr.strip()[:200]}")
    return placed, notes


def _count(data: dict) -> str:
    """``3 calls``, ``1 hit`` (a tracepoint's node)."""
    n = data["calls"]
    return f"{n} {'hit' if data.get('hit') else 'call'}{'s' if n != 1 else ''}"


def _detail(data: dict) -> str:
    calls, total = data["calls"], data["total_ns"]
    detail = _count(data)
    if total and calls:
        detail += f" · {format_duration(total // calls)}"
    if data["changes"]:
        detail += f" · {data['changes']} chg"
    return detail


def _tooltip(data: dict) -> str:
    calls, total = data["calls"], data["total_ns"]
    text = _count(data)
    if total and calls:
        text += f", average {format_duration(total // calls)}"
    if data["changes"]:
        text += f", {data['changes']} field change{'s' if data['changes'] != 1 else ''}"
    return text + " (click: its timeline rows; counts: its methods entry)"


def _nodes_and_edges(counts: CallGraphCounts, names: dict[int, str], root_label: str,
                     changed_by: dict[int, int]) -> tuple[list[tuple[int, dict]], list]:
    """The nodes (id, data) and edges (caller, callee, calls) of `call_graph`, in the
    order networkx lists them (nodes as added; edges by their caller's node, then as
    added), without building the graph."""
    nodes = [(ROOT, {"label": root_label, "calls": 0, "total_ns": 0, "changes": 0})]
    for fid, n, total in zip(counts.functions, counts.calls, counts.total_ns):
        nodes.append((fid, {"label": function_label(names, fid), "calls": n, "total_ns": total,
                            "changes": changed_by.get(fid, 0), "hit": fid in counts.hits}))
    rank = {fid: i for i, (fid, _) in enumerate(nodes)}
    edges = sorted(((a, b, n) for (a, b), n in zip(counts.edges, counts.edge_calls)),
                   key=lambda e: rank[e[0]])
    return nodes, edges


def svg(counts: CallGraphCounts, names: dict[int, str], root_label: str,
        changed_by: dict[int, int], placed: DotLayout,
        links: Callable[[int], tuple[str, str]]) -> Markup:
    """The call graph of ``counts`` (as `call_graph` makes it) as inline SVG: each
    function's box links to its first timeline row (``links(fid)[0]``) and its second
    line to its methods entry (``links(fid)[1]``).  Every text is escaped; counts are
    this graph's, positions the shape's."""
    nodes, edges = _nodes_and_edges(counts, names, root_label, changed_by)
    most = max((c for _, _, c in edges), default=1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="callgraph" '
           f'width="{placed.width + 8:.0f}" height="{placed.height + 8:.0f}" '
           f'viewBox="-4 -4 {placed.width + 8:.1f} {placed.height + 8:.1f}" role="img">'
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#7d8896"/></marker></defs>']
    for a, b, calls in edges:
        edge = (_node_id(a), _node_id(b))
        d = placed.path(edge)
        if d is None:
            continue
        label = placed.edges[edge][1]
        width = 0.8 + 2.2 * math.log1p(calls) / math.log1p(most)
        out.append(f'<path class="edge" d="{d}" stroke-width="{width:.2f}" '
                   'marker-end="url(#arrow)"/>')
        if label:
            out.append(f'<text class="edge-label" x="{label[0]:.1f}" y="{label[1] + 3:.1f}">'
                       f'{int(calls)}</text>')
    for fid, data in nodes:
        box = placed.nodes.get(_node_id(fid))
        if box is None:
            continue
        x, y, w, h = box
        if fid == ROOT:
            out.append(f'<g class="node root"><ellipse cx="{x:.1f}" cy="{y:.1f}" '
                       f'rx="{w / 2:.1f}" ry="{h / 2:.1f}"/><text x="{x:.1f}" y="{y + 4:.1f}">'
                       f'{escape(data["label"])}</text></g>')
            continue
        rows_href, methods_href = links(fid)
        changed = " changed" if data["changes"] else ""
        detail = _detail(data)
        out.append(
            f'<g class="node{changed}" data-function="{escape(data["label"])}">'
            f'<title>{escape(data["label"])}: {escape(_tooltip(data))}</title>'
            f'<a href="{escape(rows_href)}" class="to-rows"><rect x="{x - w / 2:.1f}" '
            f'y="{y - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4"/>'
            f'<text x="{x:.1f}" y="{y - 2:.1f}">{escape(data["label"])}</text></a>'
            f'<a href="{escape(methods_href)}" class="to-method"><text class="detail" '
            f'x="{x:.1f}" y="{y + 11:.1f}">{escape(detail)}</text></a></g>')
    out.append("</svg>")
    return Markup("".join(out))


def dot_available() -> bool:
    """Whether Graphviz's ``dot`` is on the PATH."""
    return shutil.which("dot") is not None
