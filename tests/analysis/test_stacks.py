"""Stack trees (`ctracer.analysis.stacks`) against a plain stack walk over the same events,
per object and for all objects, and the folded lines read back."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from ctracer import analysis
from ctracer.analysis.stacks import folded_lines, stack_tree
from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT
from support.synthetic_trace import write_synthetic_trace


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("stacks") / "sock.ctrace"
    truth = write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=3, lost_events=0)
    return analysis.load(str(path)), truth


def walk(a, rows, depth_of_thread_stack):
    """Reference: per thread, a stack of open calls; each entry or hit is a call under
    the calls open; an exit closes the innermost open call of its function."""
    ev = a.events
    stacks = defaultdict(list)
    calls, times = Counter(), Counter()
    open_at = {}
    for r in rows.tolist():
        tid, fid, ph, ts = int(ev.tid[r]), int(ev.function[r]), int(ev.phase[r]), int(ev.ts_ns[r])
        st = stacks[tid]
        name = a.function_names.get(fid, str(fid))
        if ph == PHASE_ENTRY:
            path = tuple(f for f, _ in st) + (name,)
            calls[path] += 1
            st.append((name, ts))
            open_at[id(st), len(st)] = path
        elif ph == PHASE_TRACEPOINT:
            calls[tuple(f for f, _ in st) + (name,)] += 1
        else:
            names = [f for f, _ in st]
            if name in names:
                while st:
                    f, t0 = st.pop()
                    if f == name:
                        times[tuple(names[:len(st)]) + (name,)] += ts - t0
                        break
            else:
                calls[tuple(names) + (name,)] += 1
    return calls, times


def tree_counts(a, tree):
    paths = tree.paths(lambda f: a.function_names.get(f, str(f)))
    calls = Counter({tuple(p): c for p, c in zip(paths, tree.calls.tolist()) if c})
    total = {tuple(p): t for p, t in zip(paths, tree.total_ns.tolist())}
    return calls, total


def test_all_objects_tree_matches_a_stack_walk(data):
    a, truth = data
    ev = a.events
    rows = np.arange(len(ev))
    tree = stack_tree(ev, rows, np.zeros(len(rows), np.int64), ev.depth,
                      a.changes.event, a.changes.function)
    calls, times = walk(a, rows, True)
    got, total = tree_counts(a, tree)
    assert got == calls
    # every call counted once: the tree's calls are the trace's entries and hits
    assert int(tree.calls.sum()) == sum(truth.calls.values())
    # a node's total is its calls' time (self + callees'), for stacks timed by the walk
    for path, t in times.items():
        assert total[path] >= t * 0.999
    # children fit in their parents
    for node, p in enumerate(tree.parent.tolist()):
        if p >= 0:
            assert tree.total_ns[node] <= tree.total_ns[p]
    assert (tree.self_ns >= 0).all()
    # each change is credited to one node whose function the change names
    assert int(tree.changes.sum()) == int((a.changes.function >= 0).sum())


def test_per_object_trees_match_a_stack_walk_each(data):
    a, _ = data
    ev = a.events
    chosen = list(range(len(a.objects)))
    positions, offsets = a.objects.event_groups(chosen)
    group = np.repeat(np.arange(len(chosen)), np.diff(offsets))
    cpos, coff = a.objects.change_groups(chosen)
    cgroup = np.repeat(np.arange(len(chosen)), np.diff(coff))
    rows_of_change = offsets[cgroup] + np.array(
        [np.searchsorted(positions[offsets[g]:offsets[g + 1]], e)
         for g, e in zip(cgroup.tolist(), a.changes.event[cpos].tolist())], np.int64)
    tree = stack_tree(ev, positions, group, ev.object_depth, rows_of_change,
                      a.changes.function[cpos])
    trees = tree.groups(len(chosen))
    assert sum(len(t) for t in trees) == len(tree)
    from ctracer.analysis.stacks import object_trees
    made = object_trees(a, chosen)
    for o, t, m in zip(chosen, trees, made):
        rows = a.objects.events(o)
        # first_row: where in the object's own events its first call is
        assert (ev.function[rows[m.first_row]] == m.function).all()
        calls, _ = walk(a, rows, False)
        got, _ = tree_counts(a, t)
        assert got == calls, a.objects.labels[o]
        assert int(t.changes.sum()) == int((a.changes.function[a.objects.changes(o)] >= 0).sum())
        assert (t.first_row[t.parent >= 0] >= t.first_row[t.parent[t.parent >= 0]]).all()


def parse_folded(lines):
    """What flamegraph.pl and inferno read: the count after the last space, frames split
    on ';'."""
    out = Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        assert stack and count.isdigit(), line
        out[tuple(stack.split(";"))] += int(count)
    return out


def test_folded_lines_read_back_to_the_tree(data):
    a, _ = data
    ev = a.events
    rows = np.arange(len(ev))
    tree = stack_tree(ev, rows, np.zeros(len(rows), np.int64), ev.depth,
                      a.changes.event, a.changes.function)
    label = lambda f: a.function_names.get(f, str(f))  # noqa: E731
    by_calls = parse_folded(folded_lines(tree, label, "calls"))
    assert by_calls == tree_counts(a, tree)[0]
    by_time = parse_folded(folded_lines(tree, label, "time", prefix="all;objects"))
    assert all(path[0] == "all:objects" for path in by_time)
    # a root's total time is the sum of the self times below it
    roots = {label(f): t for f, t, p in zip(tree.function.tolist(), tree.total_ns.tolist(),
                                             tree.parent.tolist()) if p < 0}
    summed = Counter()
    for path, ns in by_time.items():
        summed[path[1]] += ns
    assert summed == Counter({k: v for k, v in roots.items() if v})
