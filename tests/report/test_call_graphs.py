"""A call graph's shape (what its layout depends on) read from its counts is the shape of
the graph drawn from them: one layout serves every object of that shape."""

import numpy as np
import pytest

from ctracer import analysis
from ctracer.analysis import callgraph
from ctracer.analysis.callgraph import ROOT
from ctracer.report import callgraph_svg as graphs
from support.synthetic_trace import write_synthetic_trace


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs") / "sim.ctrace"
    write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=5,
                          addresses_per_thread=2, seed=3)
    return analysis.load(str(path))


def _drawn_shape(g):
    return (tuple(sorted((n, d["label"]) for n, d in g.nodes(data=True) if n != ROOT)),
            tuple(sorted(g.edges())))


def test_shape_from_counts_is_the_drawn_graphs(loaded):
    ev = loaded.events
    names = dict(loaded.function_names)
    del names[next(iter(names))]  # a function without a name is drawn as function#id
    shapes = set()
    for o in range(len(loaded.objects)):
        counts = callgraph.call_counts(ev, loaded.objects.events(o), ev.object_caller)
        g = graphs.call_graph(counts, names, "root", {})
        assert graphs.shape_key(counts, names) == _drawn_shape(g)
        assert g.number_of_nodes() == graphs.node_count(counts) == len(counts.functions) + 1
        shapes.add(graphs.shape_key(counts, names))
    assert len(shapes) > 1
    assert any("function#" in label for shape in shapes for _, label in shape[0])


def test_svg_drawn_from_counts_lists_nodes_and_edges_as_the_graph_does(loaded):
    """The SVG is drawn from the counts in the order networkx lists the graph's nodes
    and edges (the drawing of every shape's graph is the same, text for text)."""
    ev = loaded.events
    names = dict(loaded.function_names)
    counted = [callgraph.call_counts(ev, loaded.objects.events(o), ev.object_caller)
               for o in range(len(loaded.objects))]
    counted.append(callgraph.call_counts(ev, np.arange(len(ev)), ev.thread_caller))
    for counts in counted:
        changed_by = {counts.functions[-1]: 3}
        g = graphs.call_graph(counts, names, "root", changed_by)
        nodes, edges = graphs._nodes_and_edges(counts, names, "root", changed_by)
        assert nodes == list(g.nodes(data=True))
        assert edges == list(g.edges(data="calls"))
    # edges counted in an order that is not networkx's: listed by caller node
    counts = callgraph.CallGraphCounts([1, 2, 3], [1, 1, 2], [0, 5, 0],
                                  [(ROOT, 1), (1, 2), (ROOT, 3), (2, 3)], [1, 1, 1, 1],
                                  frozenset({3}))
    g = graphs.call_graph(counts, {1: "f", 2: "g"}, "root")
    nodes, edges = graphs._nodes_and_edges(counts, {1: "f", 2: "g"}, "root", {})
    assert edges == list(g.edges(data="calls")) == [(ROOT, 1, 1), (ROOT, 3, 1), (1, 2, 1),
                                                    (2, 3, 1)]
    assert nodes == list(g.nodes(data=True)) and nodes[3][1]["hit"]
