"""Call graphs of the report's pages: counted per object and for all objects, laid out
once per shape (`ctracer.report.callgraph_svg`), and drawn inline or as the interactive
views' data.
"""

from __future__ import annotations

from typing import Any
import numpy as np

from ctracer.analysis.callgraph import (CallGraphCounts, call_counts, grouped_call_counts,
                                        with_folded)
from ctracer.analysis.model import counts_per_group
from ctracer.report import callgraph_svg as graphs
from ctracer.report import views as interactive_views
from ctracer.report.pages.site import ALL_DIR, METHODS_DIR, PAGE_ROWS, ReportSite, json_island


def prepare_graphs(site: ReportSite, chosen: list[int]) -> None:
    """Count the call graphs of the pages of the objects ``chosen`` and of the
    all-objects page (laid out later, by shape)."""
    data, ev = site.data, site.data.events
    rows = data.objects
    site.stacks = interactive_views.stack_trees(data, chosen, ALL_DIR)
    if len(ev) and not site.stacks:
        site.notes.append("the flame views were left out: counting their stacks would "
                          "not fit the memory limit ctracer runs under")
    positions, offsets = rows.event_groups(chosen)
    counted = grouped_call_counts(ev, positions, offsets, ev.object_caller)
    positions, offsets = rows.change_groups(chosen)
    made = counts_per_group(data.changes.function[positions], offsets)
    for o, counts, changed_by in zip(chosen, counted, made):
        # calls folded by --calls changes: counts on the edge from their caller
        _prepare_graph(site, rows.dirnames[o], with_folded(data, counts, o), rows.labels[o],
                       changed_by)
    if len(ev):
        made_all = counts_per_group(data.changes.function, np.array([0, len(data.changes)]))
        _prepare_graph(site, ALL_DIR,
                       with_folded(data, call_counts(ev, np.arange(len(ev)), ev.thread_caller)),
                       f"{len(rows)} objects", made_all[0])


def _prepare_graph(site: ReportSite, directory: str, counts: CallGraphCounts, root_label: str,
                   changed_by: dict[int, int]) -> None:
    if not counts.functions:
        return
    key = graphs.shape_key(counts, site.names)
    shape = site._shapes.setdefault(key, key)  # one tuple a shape, however many graphs
    nodes = graphs.node_count(counts)
    if site.dot and nodes <= graphs.MAX_NODES and shape not in site.shape_graphs:
        site.shape_graphs[shape] = graphs.call_graph(counts, site.names, root_label,
                                                     changed_by)
    site.graphs[directory] = (counts, root_label, changed_by, shape, nodes)


def layout_graphs(site: ReportSite) -> None:
    """Lay out every call-graph shape the pages asked for, at once."""
    site.placed, notes = graphs.layout_shapes(site.shape_graphs)
    site.shape_graphs = {}
    site.notes.extend(notes)


def graph_for(site: ReportSite, directory: str, rows: np.ndarray,
              files: list[str]) -> tuple[Any, str]:
    """The inline SVG of ``directory``'s call graph, or why there is none."""
    if not site.dot:
        return None, "graphviz's dot is not installed, so the call graph was not drawn."
    made = site.graphs.get(directory)
    if made is None:
        return None, "No calls were recorded."
    counts, root_label, changed_by, shape, nodes = made
    if nodes > graphs.MAX_NODES:
        return None, f"{nodes - 1} functions: too many to draw; see the methods table."
    placed = site.placed.get(shape)
    if placed is None:
        return None, "dot could not lay out this call graph."
    ev = site.data.events
    fids, first = np.unique(ev.function[rows], return_index=True)
    at = {f: (i, s) for f, i, s in zip(fids.tolist(), first.tolist(),
                                      ev.seq[rows[first]].tolist())}
    root = "../" * (directory.count("/") + 1)

    def links(fid: int) -> tuple[str, str]:
        found = at.get(fid)
        rows_href = f"{files[found[0] // PAGE_ROWS]}#e{found[1]}" if found else "#timeline"
        stem = site.function_stem.get(fid, "")
        return rows_href, f"{root}{METHODS_DIR}/index.html#fn-{stem}"

    return graphs.svg(counts, site.names, root_label, changed_by, placed, links), ""


def views_for(site: ReportSite, directory: str, rows: np.ndarray, files: list[str]) -> Any:
    """The interactive call graph's and the flame view's data (a JSON island) of
    ``directory``'s page, or None when it has no calls."""
    made = site.graphs.get(directory)
    tree = site.stacks.get(directory)
    if made is None and tree is None:
        return None
    counts, root_label, changed_by = made[:3] if made else (None, "", {})
    data = interactive_views.views_data(
        site.data, rows, counts, root_label, changed_by, tree, files, PAGE_ROWS,
        site.function_stem, root="../" * (directory.count("/") + 1),
        methods_dir=METHODS_DIR)
    return json_island(data)
