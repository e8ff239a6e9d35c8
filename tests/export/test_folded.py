"""`ctracer export --format folded`: lines flamegraph.pl, inferno and speedscope read
(``frame;frame;frame N``), parsed back here as those tools parse them, against the
simulation's truth (every call once, by its stack)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from support.cli import ctracer
from support.synthetic_trace import write_synthetic_trace

#: flamegraph.pl's line: the stack, whitespace, a count (stackcollapse output)
LINE = re.compile(r"^(.*\S)\s+(\d+)$")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    d = tmp_path_factory.mktemp("folded")
    path = d / "sim.ctrace"
    truth = write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=6, seed=7)
    return d, path, truth


def parse(text):
    stacks = Counter()
    for line in text.splitlines():
        m = LINE.match(line)
        assert m, line
        frames = m.group(1).split(";")
        assert all(frames), line
        stacks[tuple(frames)] += int(m.group(2))
    return stacks


def test_calls_weight_counts_every_call_once_under_its_callers(simulated):
    d, path, truth = simulated
    r = ctracer("export", path, "--format", "folded", "--weight", "calls", cwd=d)
    assert r.returncode == 0, r.stderr
    stacks = parse(r.stdout)
    per_function = Counter()
    for frames, n in stacks.items():
        per_function[frames[-1]] += n
    assert per_function == Counter(truth.calls)
    # nested calls keep their callers: the simulation's sock_init_data runs inside sk_alloc
    assert any(len(f) > 1 for f in stacks)
    assert all(f[-2] == "sk_alloc" for f in stacks if f[-1] == "sock_init_data")


def test_time_weight_sums_to_the_roots_durations(simulated):
    d, path, truth = simulated
    out = d / "sim.folded"
    r = ctracer("export", path, "-f", "folded", "-o", out, cwd=d)
    assert r.returncode == 0, r.stderr
    stacks = parse(out.read_text())
    # time by default: what the outermost calls took, summed over their stacks
    roots = Counter()
    for frames, ns in stacks.items():
        roots[frames[0]] += ns
    top = {name: sum(durations) for name, durations in truth.durations.items()}
    for name, ns in roots.items():
        assert 0 < ns <= top[name]
    assert sum(roots.values()) == sum(ns for name, ns in top.items() if name in roots
                                      and not any(f[0] != name and name in f for f in stacks))


def test_per_object_stacks_start_with_the_object(simulated):
    d, path, truth = simulated
    r = ctracer("export", path, "-f", "folded", "--weight", "calls", "--per-object", cwd=d)
    assert r.returncode == 0, r.stderr
    stacks = parse(r.stdout)
    objects = {f[0] for f in stacks}
    assert objects and all(o.startswith("0x") for o in objects)
    assert len(objects) == len(truth.lifetimes)


def test_folded_options_belong_to_folded(simulated):
    d, path, _ = simulated
    r = ctracer("export", path, "-f", "jsonl", "--weight", "calls", cwd=d)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "--format folded" in r.stderr
