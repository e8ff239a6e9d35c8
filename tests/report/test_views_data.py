"""The data of the interactive call graph and the flame view: families read from names,
names made safe inside the page's JSON island, and a big stack tree pruned so that every
frame kept has its callers and the weights still add up."""

import json

import numpy as np

from ctracer.analysis.callgraph import ROOT, CallGraphCounts
from ctracer.analysis.stacks import StackTree
from ctracer.report.flame import flame_data
from ctracer.report.pages.site import json_island as _json_island
from ctracer.report.interactive_graph import family_of, graph_data


def test_families_from_names():
    assert family_of("__inet_stream_connect") == "inet"
    assert family_of("tcp_v4_connect") == "tcp"
    assert family_of("apparmor_socket_sendmsg") == family_of("security_socket_sendmsg") == "security"
    assert family_of("skb_release_data") == family_of("__dev_queue_xmit") == "skb/dev"
    assert family_of("ip6_xmit") == family_of("ip_queue_xmit") == "ip"
    assert family_of("tp:inet_sock_set_state") == "tracepoints"


def test_a_hostile_name_stays_data_in_the_island():
    evil = "</script><img src=x onerror=alert(1)>&amp;"
    counts = CallGraphCounts([1, 2], [3, 1], [0, 0], [(ROOT, 1), (1, 2)], [3, 1])
    data = graph_data(counts, {1: evil, 2: "tcp_close"}, "0xffff", {2: 1},
                      lambda fid: (0, fid), {})
    island = str(_json_island({"graph": data}))
    assert "<" not in island and ">" not in island and "&" not in island
    back = json.loads(island)["graph"]
    assert back["nodes"][0][0] == evil
    # a family of one function is not folded
    assert [row[5] for row in back["nodes"]] == ["", ""]
    assert back["edges"] == [[-1, 0, 3], [0, 1, 1]]


def chain_tree(width: int, depth: int) -> StackTree:
    """A root with ``width`` chains of ``depth`` frames under it, chain k called k+1
    times at every frame."""
    parent, fn, d, calls = [-1], [0], [0], [1]
    for k in range(width):
        p = 0
        for level in range(1, depth + 1):
            parent.append(p)
            fn.append(1 + k * depth + level)
            d.append(level)
            calls.append(k + 1)
            p = len(parent) - 1
    n = len(parent)
    a = lambda v: np.array(v, np.int64)  # noqa: E731
    return StackTree(np.zeros(n, np.int64), a(parent), a(fn), a(d), a(calls), a(calls) * 10,
                     a(calls) * 10, np.zeros(n, np.int64), np.arange(n), np.zeros(n, bool))


def test_a_big_tree_is_pruned_to_its_busiest_frames_with_their_callers():
    tree = chain_tree(width=50, depth=4)
    data = flame_data(tree, {}, lambda i: (0, i), timed=True, limit=41)
    kept = len(data["p"])
    assert kept <= 41 and data["dropped"] == len(tree) - kept
    # every kept frame's caller is kept (parents first, indexes into the kept frames)
    assert all(p < i for i, p in enumerate(data["p"]))
    assert data["p"][0] == -1 and all(p >= 0 for p in data["p"][1:])
    # the calls and time of the frames dropped are their callers' now: totals unchanged
    assert sum(data["c"]) == int(tree.calls.sum())
    assert sum(data["s"]) == int(tree.self_ns.sum())
    # kept: the root and the 40 frames with most calls below them (a caller first)
    below = {1 + k * 4 + level: (k + 1) * (4 - level + 1) for k in range(50)
             for level in range(1, 5)}
    busiest = sorted(below, key=lambda f: (-below[f], (f - 1) % 4))[:40]
    kept_functions = [int(data["names"][i].split("#")[1]) for i in data["f"]]
    assert sorted(kept_functions[1:]) == sorted(busiest)
    assert sum(data["more"]) == data["dropped"] and data["more"][0] > 0
