"""The interactive call graph's data: what ``_static/callgraph.js`` draws with
Cytoscape.js (pan, zoom, search, focus, families folded, a threshold on counts, the
functions that changed fields and the paths to them).

The data is a JSON island in the page (`graph_data`): per function its name, calls,
summed time, field changes, whether it is a tracepoint, its family, and where its first
timeline row is; per edge caller, callee and calls (``-1``: the root, "not called by a
traced function").  Names reach the page only as JSON text made safe for a ``<script>``
element, and the script puts them in the graph as data, never as markup.

Families are read from names: the first word of a name, leading underscores dropped
(``__inet_stream_connect`` is an ``inet`` function), with the words kernel engineers
read as one subsystem merged (`FAMILY_OF`): ``apparmor``/``selinux`` under
``security``, ``dev``/``netif``/``napi`` with ``skb``, ``ip6`` with ``ip``.  A family
of one function is not folded.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from ctracer.analysis.callgraph import ROOT, CallGraphCounts
from ctracer.analysis.model import function_label

#: words that name one subsystem together (the second is the family shown)
FAMILY_OF = {
    "apparmor": "security", "selinux": "security", "smack": "security", "lsm": "security",
    "bpf": "bpf", "dev": "skb/dev", "skb": "skb/dev", "netif": "skb/dev", "napi": "skb/dev",
    "netdev": "skb/dev", "ip6": "ip", "ipv6": "ip", "ipv4": "ip", "sk": "sock",
    "sock": "sock", "tcp": "tcp", "inet": "inet", "inet6": "inet", "udp": "udp",
}
_WORD = re.compile(r"_*([A-Za-z0-9]+)")


def family_of(name: str) -> str:
    """The family a function's name puts it in (``tp:`` tracepoints are one family)."""
    if name.startswith("tp:"):
        return "tracepoints"
    m = _WORD.match(name)
    if not m:
        return name
    word = m.group(1).lower()
    return FAMILY_OF.get(word, word)


def graph_data(counts: CallGraphCounts, names: dict[int, str], root_label: str,
               changed_by: dict[int, int], first_row: Callable[[int], Optional[tuple[int, int]]],
               stems: dict[int, str]) -> dict:
    """The island's data: ``first_row(fid)`` gives (page number, seq) of a function's
    first row (None: not on these pages); ``stems`` its methods entry's anchor."""
    index = {fid: i for i, fid in enumerate(counts.functions)}
    labels = [function_label(names, fid) for fid in counts.functions]
    families: dict[str, int] = {}
    for label in labels:
        f = family_of(label)
        families[f] = families.get(f, 0) + 1
    nodes = []
    for fid, label, calls, total in zip(counts.functions, labels, counts.calls,
                                        counts.total_ns):
        family = family_of(label)
        row = first_row(fid)
        nodes.append([label, calls, total, changed_by.get(fid, 0),
                      1 if fid in counts.hits else 0,
                      family if families[family] > 1 else "",
                      row[0] if row else -1, row[1] if row else -1, stems.get(fid, "")])
    edges = [[index[a] if a != ROOT else -1, index[b], n]
             for (a, b), n in zip(counts.edges, counts.edge_calls)]
    return {"root": root_label, "nodes": nodes, "edges": edges,
            "node_columns": ["name", "calls", "total_ns", "changes", "hit", "family",
                             "page", "seq", "stem"]}
