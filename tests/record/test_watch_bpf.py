"""Real breakpoints: `ctracer trace --watch` on samples/watch's program (-O2, inlined
helpers), checked against the program's own count of its stores per source line and
against binutils' reading of the program (objdump's disassembly for the writing
instruction, its decoded line table for the line), both independent of ctracer.

Skipped, with the reason, only when not root or when the kernel refuses uprobes or
user-space write breakpoints here.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest

from support import bpfcheck
from support import groundtruth as gt
from ctracer.tracefile import writes

pytestmark = pytest.mark.bpf

WATCHDEMO = os.path.join(gt.ROOT, "samples", "watch", "build", "watchdemo")
SETTLE_MS = 300


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("not root: loading BPF programs and breakpoints needs root")
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    from ctracer.errors import CtracerError
    from ctracer.record.breakpoints import refusal
    try:
        bpfcheck.uprobe_self_test(WATCHDEMO, "main")
    except CtracerError as e:
        pytest.skip(str(e))
    why = refusal(kernel=False)
    if why:
        pytest.skip(f"user-space write breakpoints refused here: {why}")
    out = tmp_path_factory.mktemp("watch") / "w.ctrace"
    run = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "account",
                          "--binary", WATCHDEMO, "--watch", "balance", "-o", str(out), "--",
                          WATCHDEMO, "--accounts", "3", "--settle-ms", str(SETTLE_MS)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    own = {int(m[0]): int(m[1]) for m in re.findall(r"watchdemo: site (\d+) (\d+)", run.stderr)}
    total = int(re.search(r"watchdemo: writes (\d+)", run.stderr).group(1))
    db = sqlite3.connect(out)
    rows = writes.read_writes(db)
    sites = writes.read_sites(db)
    arms = writes.read_arms(db)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    db.close()
    return dict(stderr=run.stderr, own=own, total=total, rows=rows, sites=sites, arms=arms,
                meta=meta, path=str(out))


def _objdump_writers() -> dict[int, int]:
    """Instruction end -> its start, for every instruction of the program (objdump -d)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", WATCHDEMO],
                          capture_output=True, text=True, check=True).stdout
    starts = [int(m, 16) for m in re.findall(r"^\s+([0-9a-f]+):\t", text, re.M)]
    return {b: a for a, b in zip(starts, starts[1:])}


def _objdump_lines() -> list[tuple[int, int]]:
    """(address, line) rows of watchdemo.c from objdump's decoded line table."""
    text = subprocess.run(["objdump", "--dwarf=decodedline", WATCHDEMO],
                          capture_output=True, text=True, check=True).stdout
    rows = [(int(m[1], 16), int(m[0]))
            for m in re.findall(r"^watchdemo\.c\s+(\d+)\s+(0x[0-9a-f]+)", text, re.M)]
    return sorted(rows, key=lambda r: r[0])


def _symbol_addresses() -> dict[str, int]:
    text = subprocess.run(["nm", WATCHDEMO], capture_output=True, text=True, check=True).stdout
    return {m[1]: int(m[0], 16) for m in re.findall(r"^([0-9a-f]+) [Tt] (\S+)$", text, re.M)}


def _program_writes(recorded) -> list:
    """The writes whose writer is in the program itself (not the C library's free)."""
    sites = recorded["sites"]
    return [w for w in recorded["rows"]
            if sites[(w.pid, w.ip, "writer")].module == "watchdemo"]


def test_every_store_of_the_program_is_recorded_at_its_line(recorded):
    found = Counter(sites.line for w in _program_writes(recorded)
                    for sites in [recorded["sites"][(w.pid, w.ip, "writer")]])
    assert recorded["total"] == sum(recorded["own"].values()) > 0
    assert dict(found) == recorded["own"], recorded["stderr"]


def test_writers_are_the_instructions_and_lines_binutils_sees(recorded):
    ends = _objdump_writers()
    lines = _objdump_lines()
    symbols = _symbol_addresses()
    addresses = [a for a, _ in lines]
    import bisect
    checked = 0
    for (pid, ip, kind), site in recorded["sites"].items():
        if kind != "writer" or site.module != "watchdemo":
            continue
        start = symbols[site.function] + site.offset
        assert start in ends.values(), f"{site.where} is no instruction's start"
        trap_file_address = next(b for b, a in ends.items() if a == start)
        # the instruction the site names ends where the trap was (ip, rebased)
        assert (ip - trap_file_address) % 4096 == 0
        line = lines[bisect.bisect_right(addresses, start) - 1][1]
        assert site.line == line, (site, line)
        assert site.file == "watchdemo.c"
        checked += 1
    assert checked >= 5   # the five store sites of account_work and account_close


def test_inlined_helpers_are_named(recorded):
    named = {s.inlined for s in recorded["sites"].values()
             if s.kind == "writer" and s.module == "watchdemo"}
    assert {"deposit", "charge_fee"} <= named


def test_where_helpers_were_inlined_is_binutils_chain(recorded):
    """``inlined_from``: the call lines of the inlined chain, as ``addr2line -i`` says."""
    symbols = _symbol_addresses()
    checked = 0
    for site in recorded["sites"].values():
        if site.kind != "writer" or site.module != "watchdemo" or not site.inlined:
            continue
        start = symbols[site.function] + site.offset
        out = subprocess.run(["addr2line", "-i", "-f", "-e", WATCHDEMO, f"{start:#x}"],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        # function, file:line pairs, innermost first; each outer pair is where the
        # inner function was inlined
        pairs = [(out[i], os.path.basename(out[i + 1].split()[0]))
                 for i in range(0, len(out) - 1, 2)]
        assert pairs[0] == (site.inlined, f"{site.file}:{site.line}")
        chain = ", ".join(f"{line} in {fn}" for fn, line in pairs[1:])
        assert site.inlined_from == chain, (site, pairs)
        checked += 1
    assert checked >= 2   # deposit's and charge_fee's stores


def test_unchanged_writes_are_counted_not_dropped(recorded):
    sites = recorded["sites"]
    same = [w for w in _program_writes(recorded) if w.unchanged]
    lines = Counter(sites[(w.pid, w.ip, "writer")].line for w in same)
    store_same = next(n for n, text in enumerate(open(os.path.join(
        gt.ROOT, "samples", "watch", "watchdemo.c")), 1) if "leaves the value as it was" in text)
    assert lines[store_same] == recorded["own"][store_same]
    assert all(w.value == w.old for w in same)
    assert recorded["meta"]["watch"] and f'"unchanged": {len([w for w in recorded["rows"] if w.unchanged])}' \
        in recorded["meta"]["watch"]


def test_values_follow_the_program(recorded):
    rows = _program_writes(recorded)
    # each account: deposits add i + 1, the last store of account_close sets 0
    by_object_arm = {}
    for w in rows:
        by_object_arm.setdefault(w.object, []).append(w)
    for w in rows:
        if w.old is not None and not w.unchanged:
            assert w.value != w.old
    closes = [w for w in rows if recorded["sites"][(w.pid, w.ip, "writer")].function ==
              "account_close"]
    assert len(closes) == 3 and all(w.value == 0 for w in closes)


def test_arming_comes_before_the_program_writes_and_moves_on(recorded):
    arms = recorded["arms"]
    assert len(arms) == 3
    assert all(a.ended == "its life ended" for a in arms)
    assert all(0 < (a.armed_ns - a.admitted_ns) / 1e6 < SETTLE_MS for a in arms)
    assert "watch: 1 word (balance) on 3 objects" in recorded["stderr"]


def test_report_and_exports_name_the_writers(recorded, tmp_path):
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "ctracer", "callgraph", recorded["path"],
                          "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    pages = [p for p in out.rglob("changes.html") if "many_objects" not in str(p)]
    text = "".join(p.read_text() for p in pages)
    close_line = next(n for n, t in enumerate(open(os.path.join(
        gt.ROOT, "samples", "watch", "watchdemo.c")), 1) if "STORE(a, 0);" in t
        and n > 70)
    # a change's writer, with the path that led there
    assert f"written at watchdemo.c:{close_line} in account_close, called from" in text
    # the field's writers, ranked: the inlined deposit line wrote most
    ranked = re.findall(r'<table class="data writers-table">.*?<td class="mono">([^<]+)</td>',
                        text, re.S)
    assert ranked and "in deposit (inlined in account_work+0x" in ranked[0]
    export = tmp_path / "events.jsonl"
    run = subprocess.run([sys.executable, "-m", "ctracer", "export", recorded["path"],
                          "-f", "jsonl", "-o", str(export)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    import json
    rows = [json.loads(line) for line in open(tmp_path / "events.writes.jsonl")]
    assert len(rows) == len(recorded["rows"])
    assert sum(r["unchanged"] for r in rows) == sum(w.unchanged for w in recorded["rows"])
    assert {r["line"] for r in rows if r["file"] == "watchdemo.c"} == set(recorded["own"])
