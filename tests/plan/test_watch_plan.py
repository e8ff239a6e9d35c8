"""`--watch`'s words (`ctracer.plan.watch`) on a real struct's DWARF, and its bad input:
a field not in the struct, more words than the debug registers, breakpoints the kernel
refuses: one line, a non-zero exit, no trace file."""

from __future__ import annotations

import os
import subprocess

import pytest

from support import groundtruth as gt
from ctracer.cli import main
from ctracer.errors import UsageError
from ctracer.plan.watch import DEBUG_REGISTERS, plan_watch, words_for

WATCHDEMO = os.path.join(gt.ROOT, "samples", "watch", "build", "watchdemo")


@pytest.fixture(scope="module")
def account():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples", "watch")], check=True)
    from ctracer.commands.options import TypeSource
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.plan.selection import open_struct
    _, graph, _ = open_struct(TypeSource(binary=WATCHDEMO), "account", ShapeKind.STRUCT)
    return graph


def test_a_word_field_is_one_breakpoint(account):
    plan = plan_watch(account, ["balance"])
    assert [(w.field, w.offset, w.length) for w in plan.words] == [("balance", 0, 8)]
    assert plan.objects_at_once == DEBUG_REGISTERS


def test_a_wider_field_is_split_into_aligned_words(account):
    plan = plan_watch(account, ["owner", "ops"])
    assert [(w.field, w.offset, w.length) for w in plan.words] == [
        ("owner", 16, 8), ("owner", 24, 8), ("ops", 8, 4)]
    assert plan.objects_at_once == 1


@pytest.mark.parametrize("offset,size,words", [
    (0, 8, [(0, 8)]), (4, 4, [(4, 4)]), (2, 4, [(2, 2), (4, 2)]),
    (1, 3, [(1, 1), (2, 2)]), (8, 16, [(8, 8), (16, 8)]), (3, 1, [(3, 1)])])
def test_words_are_aligned_to_their_length_and_cover_the_field(offset, size, words):
    assert words_for(offset, size) == words
    covered = {b for at, n in words for b in range(at, at + n)}
    assert covered == set(range(offset, offset + size))
    assert all(at % n == 0 and n in (1, 2, 4, 8) for at, n in words)


def test_a_field_not_in_the_struct_is_refused_with_close_names(account):
    with pytest.raises(UsageError, match=r"--watch balanse: no such member.*balance"):
        plan_watch(account, ["balanse"])


def test_more_words_than_registers_say_what_is_left_out(account):
    with pytest.raises(UsageError, match=r"needs 5 breakpoint words.*limit would be left out"):
        plan_watch(account, ["balance", "owner", "ops", "limit"])


def _trace(tmp_path, capsys, *watch):
    out = tmp_path / "t.ctrace"
    status = main(["trace", "struct", "account", "--binary", WATCHDEMO, "-o", str(out),
                   "--watch", *watch, "--", "/bin/true"])
    err = capsys.readouterr().err.strip().splitlines()
    return status, err, out


def test_bad_watch_input_is_one_line_and_no_trace(account, tmp_path, capsys):
    status, err, out = _trace(tmp_path, capsys, "nosuch")
    assert status == 2 and len(err) == 1 and "--watch nosuch: no such member" in err[0]
    assert not out.exists()


def test_refused_breakpoints_are_one_line_and_no_trace(account, tmp_path, capsys,
                                                       monkeypatch):
    from ctracer.record import breakpoints
    monkeypatch.setattr(breakpoints, "refusal",
                        lambda kernel: "EPERM: not permitted here (test)")
    status, err, out = _trace(tmp_path, capsys, "balance")
    assert status != 0 and len(err) == 1
    assert "refuses user-space write breakpoints here (EPERM" in err[0]
    assert not out.exists()


def _kernel_trace(tmp_path, capsys, *args):
    out = tmp_path / "k.ctrace"
    status = main(["trace", "struct", "sock", "-o", str(out), "-d", "1", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return status, err, out


@pytest.mark.parametrize("args,status,says", [
    (["--vmlinux", WATCHDEMO], 2, "--vmlinux names the lines of --watch's kernel writers"),
    (["--watch", "skc_state", "--vmlinux", "/nonexistent/vmlinux"], 1,
     "--vmlinux: cannot read /nonexistent/vmlinux"),
    (["--watch", "skc_state", "--vmlinux", "/etc/hostname"], 1, "is not an ELF file"),
    (["--watch", "skc_state", "--vmlinux", WATCHDEMO], 1, "is another kernel build"),
])
def test_a_bad_vmlinux_is_one_line_and_no_trace(account, tmp_path, capsys, args, status,
                                                says):
    got, err, out = _kernel_trace(tmp_path, capsys, *args)
    assert got == status and len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_vmlinux_is_for_kernel_objects(account, tmp_path, capsys):
    status, err, out = _trace(tmp_path, capsys, "balance", "--vmlinux", WATCHDEMO)
    assert status == 2 and len(err) == 1 and "--vmlinux is for kernel objects" in err[0]
    assert not out.exists()


def test_a_vmlinux_without_dwarf_lines_is_refused(tmp_path):
    from ctracer.host.vmlinux import problem
    stripped = tmp_path / "stripped"
    subprocess.run(["objcopy", "--strip-debug", WATCHDEMO, str(stripped)], check=True)
    assert "has no DWARF line table" in problem(str(stripped), None)
    from ctracer.debuginfo.elf import build_id
    assert problem(WATCHDEMO, build_id(WATCHDEMO)) is None


def test_the_trace_meta_reads_the_watch_plan_typed(account):
    """The meta ``watch_plan`` the recorder writes reads back as the `WatchPlan` armed;
    absent, it is None."""
    from ctracer.tracefile.meta import TraceMeta
    plan = plan_watch(account, ["balance", "owner"], budget=7)
    back = TraceMeta({"watch_plan": plan.to_json()}, "t.ctrace").watch_plan
    assert back == plan and back.fields == ["balance", "owner"] and back.budget == 7
    assert TraceMeta({}, "t.ctrace").watch_plan is None


@pytest.mark.parametrize("stored", ['{"budget": 5}', '{"words": [{"field": "x"}]}',
                                    '{"words": [{"field": "x", "offset": "8", "length": 4, '
                                    '"field_offset": 8, "field_size": 4}]}', '[1, 2]', '{'])
def test_a_damaged_watch_plan_is_one_trace_file_error(stored):
    from ctracer.errors import TraceFileError
    from ctracer.tracefile.meta import TraceMeta
    with pytest.raises(TraceFileError, match=r"^t\.ctrace is damaged: its meta entry "
                                             r"'watch_plan' is (not JSON|not a watch plan)"):
        TraceMeta({"watch_plan": stored}, "t.ctrace").watch_plan
