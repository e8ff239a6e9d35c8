"""The kernel-function programs' thread state chosen when attaching, without a kernel: the
loads and links of `ctracer.record.kattach` replaced by fakes that refuse what a test
says.  Where the kernel refuses a task-storage program whose LRU-hash variant it loads
(6.1's verifier: the kretprobes of more routes, E2BIG), every function of the kind gets its
LRU-hash program, and the recording says why; a refusal of both variants keeps task
storage (the functions fail, named, as before)."""

from __future__ import annotations

import os

import pytest

from ctracer.probes import kfunctions
from ctracer.probes.kfunctions import KernelFunction
from ctracer.record import kattach

E2BIG = "the kernel refused to load it (E2BIG: Argument list too long)"


def _function(index: int, ways: int) -> KernelFunction:
    return KernelFunction(index, f"f{index}", f"f{index}", (None,) * ways, None, (), ())


#: one function per route count
FUNCTIONS = tuple(_function(i, n) for i, n in enumerate(kfunctions.ROUTE_COUNTS))


@pytest.fixture
def kernel(monkeypatch):
    """The names loaded (in order) and the (kind, function) linked, as perf kprobes (6.1
    has no kprobe.multi); ``refuse``: name -> why."""
    state = {"loaded": [], "linked": [], "refuse": {}}
    names = {}

    def load_program(insns, prog_type, attach_type=0, btf_id=0, btf_obj_fd=0, name=b""):
        state["loaded"].append(insns.decode())
        why = state["refuse"].get(insns.decode())
        if why:
            return -1, why
        fd = os.open(os.devnull, os.O_RDONLY)
        names[fd] = insns.decode()
        return fd, ""

    def perf_kprobe(symbol, retprobe):
        names[-1] = ("kretprobe" if retprobe else "kprobe", symbol)
        return os.open(os.devnull, os.O_RDONLY), ""

    def link(prog_fd, attach_type, target_fd=0, *, cookie=None, cookie_at=24):
        state["linked"].append(names[-1])
        return os.open(os.devnull, os.O_RDONLY), 0

    monkeypatch.setattr(kattach, "load_program", load_program)
    monkeypatch.setattr(kattach, "_perf_kprobe", perf_kprobe)
    monkeypatch.setattr(kattach, "_link", link)
    monkeypatch.setattr(kattach, "raise_open_files", lambda wanted: wanted)
    return state


def _attach(task_storage: bool = True) -> kattach.KernelLinks:
    # the program's "instructions" are its name: what the fake loader sees
    links = kattach.KernelLinks("kprobe", FUNCTIONS, lambda name: name.encode(),
                                task_storage=task_storage)
    links.attach(use_multi=False)
    return links


def _attached_programs(kernel) -> set[str]:
    """The programs loaded after the trial loads: those the links were made with."""
    return set(kernel["loaded"][-2 * len(kfunctions.ROUTE_COUNTS):])


def test_a_refused_task_storage_program_gives_every_function_its_lru_hash_variant(kernel):
    kernel["refuse"]["ctracer_kretprobe_r8"] = E2BIG
    links = _attach()
    try:
        assert all(r.complete for r in links.results), [(r.function.name, r.attached) for r in links.results]
        attached = _attached_programs(kernel)
        assert attached == {kfunctions.program_name(k, n, False) for k in ("kprobe", "kretprobe")
                            for n in kfunctions.ROUTE_COUNTS}
        assert "ctracer_kretprobe_r8" in links.thread_state and "E2BIG" in links.thread_state
        assert links.thread_state.startswith("LRU hashes") and links.fell_back
        assert sorted(kernel["linked"]) == sorted((k, f.name) for f in FUNCTIONS
                                                  for k in ("kprobe", "kretprobe"))
    finally:
        links.close()


def test_task_storage_kept_where_every_program_loads(kernel):
    links = _attach()
    try:
        assert all(r.complete for r in links.results)
        assert _attached_programs(kernel) == {kfunctions.program_name(k, n) for k in
                                              ("kprobe", "kretprobe")
                                              for n in kfunctions.ROUTE_COUNTS}
        assert links.thread_state == "task storage" and not links.fell_back
        # the trial loaded each task-storage program once, no LRU-hash one
        assert not any(n.endswith(kfunctions.HASHED_SUFFIX) for n in kernel["loaded"])
    finally:
        links.close()


def test_a_refusal_of_both_variants_keeps_task_storage_and_names_the_functions(kernel):
    kernel["refuse"]["ctracer_kretprobe_r8"] = E2BIG
    kernel["refuse"]["ctracer_kretprobe_r8_lru"] = E2BIG
    links = _attach()
    try:
        assert links.thread_state == "task storage"
        failed = {r.function.name: r.exit for r in links.results if not r.complete}
        assert failed == {"f3": E2BIG}   # the function of 8 routes, with the kernel's reason
    finally:
        links.close()


def test_a_text_without_task_storage_loads_the_lru_hash_programs(kernel):
    links = _attach(task_storage=False)
    try:
        assert all(r.complete for r in links.results)
        assert all(n.endswith(kfunctions.HASHED_SUFFIX) for n in kernel["loaded"])
        assert links.thread_state.startswith("LRU hashes") and not links.fell_back
    finally:
        links.close()


def test_the_summary_says_where_the_thread_state_went_when_it_fell_back():
    from ctracer.record.recorder import RecordResult, summary_lines
    plain = RecordResult("t.ctrace", 1, 1, 0, 5, 0, 0, 1.0, 1.0, 2.0, "ctrl-c")
    assert not any("thread" in line for line in summary_lines(plain))
    why = f"LRU hashes, as the kernel refused ctracer_kretprobe_r8: {E2BIG}"
    fell = RecordResult("t.ctrace", 1, 1, 0, 5, 0, 0, 1.0, 1.0, 2.0, "ctrl-c",
                        thread_state_fallback=why)
    assert f"note: each thread's call depth and saved entries in {why}" in summary_lines(fell)


def test_the_last_line_says_when_more_than_a_few_functions_failed():
    """A recording whose probes failed on more than a few functions ends by saying so
    (its first lines, with the reasons, have scrolled away by then); a few failures
    are said only above."""
    from ctracer.record.recorder import FEW_FAILED, RecordResult, summary_lines
    few = RecordResult("t.ctrace", 1, 1, 0, 79, FEW_FAILED, 0, 1.0, 1.0, 2.0, "ctrl-c")
    assert summary_lines(few)[-1].startswith("wrote t.ctrace")
    many = RecordResult("t.ctrace", 1, 1, 0, 79, 369, 0, 1.0, 1.0, 2.0, "ctrl-c")
    assert summary_lines(many)[-1] == (
        "warning: 369 of 448 functions could not be probed: their calls are not in the "
        "trace (the kernel's reasons above and in the trace's functions table)")


def test_the_links_misses_are_read_before_the_links_close(kernel, monkeypatch):
    """The recorder asks for the misses after the detach: a kprobe.multi link's and a
    perf kprobe's misses live in the link, so they are read as the links close (a closed
    link's number answers nothing, or is soon another file's)."""
    import fcntl

    def is_open(fd):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            return True
        except OSError:
            return False

    monkeypatch.setattr(kattach, "perf_link_missed", lambda fd: 3 if is_open(fd) else 0)
    monkeypatch.setattr(kattach, "prog_recursion_misses", lambda fd: 0)
    links = _attach()
    try:
        assert links.missed() == {"recursion": 0, "kprobe_multi": 0,
                                  "kprobe": 3 * 2 * len(FUNCTIONS)}
        closed = list(links.perf_fds)
        links.close_links()
        assert not any(is_open(fd) for fd in closed)
        assert links.missed()["kprobe"] == 3 * 2 * len(FUNCTIONS)
    finally:
        links.close()
    assert links.missed()["kprobe"] == 3 * 2 * len(FUNCTIONS)


def test_the_summary_names_the_kinds_of_a_mixed_recording_and_what_fell_back():
    """Kernel functions on two entry kinds are counted per kind in the probes line;
    one kind alone is not (the probes line before recording names it); a function the
    kernel refused the trampoline on and then took on kprobes is named with its
    refusal."""
    from types import SimpleNamespace as NS
    from ctracer.record.recorder import RecordResult, attached_kinds, summary_lines
    results = [NS(kind="fentry.multi,fexit.multi", ok=True)] * 3 + [
        NS(kind="kprobe,kretprobe", ok=True), NS(kind="kprobe,kretprobe", ok=False),
        NS(kind="raw_tracepoint", ok=True)]
    assert attached_kinds(results) == {"fentry.multi": 3, "kprobe": 1}
    # the recording's own kind first, whatever order the functions came in
    assert list(attached_kinds(results[3:] + results[:3], "fentry.multi")) == \
        ["fentry.multi", "kprobe"]
    refused = ("failed: the kernel refused it on a tracing_multi link (EINVAL: Invalid "
               "argument): The function f has 14 arguments. Too many.")
    mixed = RecordResult("t.ctrace", 1, 1, 0, 5, 1, 0, 1.0, 1.0, 2.0, "ctrl-c",
                         kinds=attached_kinds(results), fell_back=[("f", refused)])
    lines = summary_lines(mixed)
    assert lines[2].startswith("probes on 5 functions (kernel functions: 3 on fentry.multi, "
                               "1 on kprobe), 1 failed (")
    assert lines[3] == ("  f: on kprobes, as the kernel refused the trampoline: the kernel "
                        "refused it on a tracing_multi link (EINVAL: Invalid argument): "
                        "The function f has 14 arguments. Too many.")
    one = RecordResult("t.ctrace", 1, 1, 0, 5, 0, 0, 1.0, 1.0, 2.0, "ctrl-c",
                       kinds={"fentry.multi": 4})
    assert summary_lines(one)[2].startswith("probes on 5 functions, 0 failed (")
