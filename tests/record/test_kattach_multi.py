"""fentry.multi/fexit.multi attaching (`ctracer.record.kattach.KernelLinks` with the
tracing_multi links), without a kernel: loads and links replaced by fakes.  The fake
kernel takes a link whole or not at all, as 7.2's does (one function it cannot attach,
EINVAL for the whole link), and links a program only to the functions of the BTF
object it was loaded against (ENOENT otherwise)."""

from __future__ import annotations

import errno
import os
import struct

import pytest

from ctracer.probes.kfunctions import KernelFunction
from ctracer.record import kattach

#: BTF object fds: vmlinux is 0, a module's object its own fd
MODULE_FD = 7


def _function(index: int) -> KernelFunction:
    return KernelFunction(index, f"f{index}", f"f{index}", (None,), None, (), ())


FUNCTIONS = tuple(_function(i) for i in range(40))
#: function index -> (BTF object fd, BTF id): the last 8 in a module
TARGETS = {f.index: ((MODULE_FD if f.index >= 32 else 0), 1000 + f.index) for f in FUNCTIONS}


@pytest.fixture
def kernel(monkeypatch):
    """``refuse``: (attach type, BTF id) the kernel will not link; ``links``: each link
    made, as (attach type, BTF object fd, sorted BTF ids), closed ones removed;
    ``made`` and ``closed``: the links made and closed, in order; ``loads``: the
    programs loaded (attach type, BTF object fd); ``too_many_args``: function indexes whose plain fentry/fexit load the kernel refuses
    with its verifier line; ``asked``: the functions such a load was tried on."""
    state = {"refuse": set(), "links": {}, "tries": 0, "asked": [], "too_many_args": set(),
             "closed": [], "made": [], "loads": [], "code": []}
    programs: dict[int, tuple[int, int]] = {}

    def load_program(insns, prog_type, attach_type=0, btf_id=0, btf_obj_fd=0, name=b""):
        if btf_id:   # a plain fentry/fexit asked why a function was refused
            assert attach_type in (kattach._TRACE_FENTRY, kattach._TRACE_FEXIT)
            assert insns == kattach.RETURN_ZERO and TARGETS[btf_id - 1000][0] == btf_obj_fd
            state["asked"].append(btf_id - 1000)
            if btf_id - 1000 in state["too_many_args"]:
                return -1, ("the kernel refused to load it (EINVAL: Invalid argument): "
                            f"The function f{btf_id - 1000} has 14 arguments. Too many.")
            fd = os.open(os.devnull, os.O_RDONLY)
            return fd, ""
        fd = os.open(os.devnull, os.O_RDONLY)
        programs[fd] = (attach_type, btf_obj_fd)
        state["loads"].append((attach_type, btf_obj_fd))
        state["code"].append(insns)
        return fd, ""

    def tracing_multi_link(prog_fd, attach_type, btf_ids, cookies):
        state["tries"] += 1
        loaded_type, obj = programs[prog_fd]
        assert loaded_type == attach_type
        assert cookies == [i - 1000 for i in btf_ids], "each function's index is its cookie"
        if any(TARGETS[i - 1000][0] != obj for i in btf_ids):
            return -1, errno.ENOENT
        if any((attach_type, i) in state["refuse"] for i in btf_ids):
            return -1, errno.EINVAL
        fd = os.open(os.devnull, os.O_RDONLY)
        state["links"][fd] = (attach_type, obj, sorted(btf_ids))
        state["made"].append(state["links"][fd])
        return fd, 0

    real_close = os.close

    def close(fd):
        if fd in state["links"]:
            state["closed"].append(state["links"].pop(fd))
        real_close(fd)

    monkeypatch.setattr(kattach, "load_program", load_program)
    monkeypatch.setattr(kattach, "tracing_multi_link", tracing_multi_link)
    monkeypatch.setattr(kattach.os, "close", close)
    monkeypatch.setattr(kattach, "raise_open_files", lambda wanted: wanted)
    return state


def _attach() -> kattach.KernelLinks:
    links = kattach.KernelLinks("fentry.multi", FUNCTIONS, lambda name: name.encode(),
                                lambda f: TARGETS[f.index], task_storage=False)
    links.attach()
    return links


def _linked(kernel, attach_type: int) -> set[int]:
    return {i - 1000 for t, _, ids in kernel["links"].values() if t == attach_type for i in ids}


ENTRY, EXIT = kattach.TRACE_FENTRY_MULTI, kattach.TRACE_FEXIT_MULTI


def test_one_link_per_program_and_btf_object(kernel):
    links = _attach()
    try:
        assert all(r.complete for r in links.results)
        assert {r.kind for r in links.results} == {"fentry.multi,fexit.multi"}
        assert sorted((t, obj, len(ids)) for t, obj, ids in kernel["links"].values()) == \
            [(ENTRY, 0, 32), (ENTRY, MODULE_FD, 8), (EXIT, 0, 32), (EXIT, MODULE_FD, 8)]
        assert "tracing_multi" in links.how
    finally:
        links.close()


def test_functions_the_kernel_refuses_are_found_and_named_the_others_attached(kernel):
    kernel["refuse"] |= {(ENTRY, 1003), (ENTRY, 1017), (EXIT, 1035)}
    links = _attach()
    try:
        failed = {r.function.index: r for r in links.results if not r.complete}
        assert set(failed) == {3, 17, 35}
        assert "refused it on a tracing_multi link (EINVAL" in failed[3].entry
        assert failed[3].exit == "entry failed"
        assert failed[35].entry.startswith("its fexit failed: the kernel refused")
        # both or neither: no function keeps an entry without its exit, or the reverse
        good = {f.index for f in FUNCTIONS} - {3, 17, 35}
        assert _linked(kernel, ENTRY) == good
        assert _linked(kernel, EXIT) == good
        # split in halves, not one link per function
        assert len(kernel["links"]) < 20
    finally:
        links.close()
    assert not kernel["links"], "closing leaves nothing linked"


def test_a_refused_function_is_named_with_the_kernels_own_reason(kernel):
    kernel["refuse"] |= {(ENTRY, 1003), (ENTRY, 1017)}
    kernel["too_many_args"] |= {3}
    links = _attach()
    try:
        failed = {r.function.index: r for r in links.results if not r.complete}
        assert set(failed) == {3, 17}
        assert failed[3].entry == ("the kernel refused it on a tracing_multi link (EINVAL: "
                                   "Invalid argument): The function f3 has 14 arguments. "
                                   "Too many.")
        # a plain load that passes adds nothing: the link's errno is all there is
        assert failed[17].entry.endswith("(EINVAL: Invalid argument)")
        # asked only for the functions refused alone, not for every half of the split
        assert sorted(kernel["asked"]) == [3, 17]
    finally:
        links.close()


@pytest.mark.bpf   # imports the bcc runtime module; loads nothing
def test_the_runtime_detaches_through_the_links_and_closes_each_link_once(kernel):
    """The recorder's stop (`ProbeSession.begin_stop`) detaches the kernel functions'
    links; unloading them afterwards (`KernelLinks.close`) closes no link again (a link
    fd closed twice fails with EBADF, or closes whatever reused the number)."""
    import types
    from ctracer.record import bpf_runtime
    links = _attach()
    session = types.SimpleNamespace(_stop_emitting=lambda: None, _links=[], bpf=None,
                                    kernel_links=links)
    bpf_runtime.ProbeSession.begin_stop(session).join()
    assert not kernel["links"]
    assert sorted((t, len(ids)) for t, _, ids in kernel["closed"]) == \
        [(ENTRY, 8), (ENTRY, 32), (EXIT, 8), (EXIT, 32)]
    links.close()
    assert len(kernel["closed"]) == 4


# ------------------------------------------------------------------ fsession.multi

SESSION = kattach.TRACE_FSESSION_MULTI
IS_RETURN_ID = 4242


def _session_code(name: str) -> bytes:
    """What bcc makes of a session program: a placeholder call of bpf_session_is_return
    (any other program: no such call)."""
    from ctracer.probes import kfunc_calls
    if "fsession" not in name:
        return name.encode().ljust(8, b"\0")[:8]
    insn = struct.Struct("<BBhi")
    return (insn.pack(0xBF, 0x16, 0, 0) +
            insn.pack(0x85, 0, 0, kfunc_calls.PLACEHOLDERS["bpf_session_is_return"]) +
            insn.pack(0x95, 0, 0, 0))


@pytest.fixture
def session_kernel(kernel, monkeypatch):
    """The fake kernel, whose BTF has ``bpf_session_is_return`` (unless ``kfunc`` is
    False), and which loads a session program only with its kfunc call written in."""
    from ctracer.host import fsession
    kernel["kfunc"] = True
    monkeypatch.setattr(fsession, "kernel_func_ids",
                        lambda names: {"bpf_session_is_return": IS_RETURN_ID}
                        if kernel["kfunc"] else {})
    fake_load = kattach.load_program

    def load_program(insns, prog_type, attach_type=0, btf_id=0, btf_obj_fd=0, name=b""):
        if attach_type == SESSION:
            call = struct.unpack_from("<BBhi", insns, 8)
            assert call == (0x85, 2 << 4, 0, IS_RETURN_ID), "loaded with the kfunc call"
        return fake_load(insns, prog_type, attach_type, btf_id, btf_obj_fd, name)

    monkeypatch.setattr(kattach, "load_program", load_program)
    return kernel


def _attach_session() -> kattach.KernelLinks:
    links = kattach.KernelLinks("fsession.multi", FUNCTIONS, _session_code,
                                lambda f: TARGETS[f.index], task_storage=False)
    links.attach()
    return links


def test_one_session_link_per_program_and_btf_object(session_kernel):
    links = _attach_session()
    try:
        assert all(r.complete for r in links.results)
        assert {r.kind for r in links.results} == {"fsession.multi"}
        assert sorted((t, obj, len(ids)) for t, obj, ids in session_kernel["links"].values()) \
            == [(SESSION, 0, 32), (SESSION, MODULE_FD, 8)]
        assert sorted(session_kernel["loads"]) == [(SESSION, 0), (SESSION, MODULE_FD)]
        assert links.how.startswith("fsession.multi")
    finally:
        links.close()
    assert not session_kernel["links"]


def test_a_function_refused_on_a_session_link_is_named_the_others_attached(session_kernel):
    session_kernel["refuse"] |= {(SESSION, 1005), (SESSION, 1034)}
    session_kernel["too_many_args"] |= {5}
    links = _attach_session()
    try:
        failed = {r.function.index: r for r in links.results if not r.complete}
        assert set(failed) == {5, 34}
        assert failed[5].entry == failed[5].exit == (
            "the kernel refused it on a tracing_multi link (EINVAL: Invalid argument): "
            "The function f5 has 14 arguments. Too many.")
        assert _linked(session_kernel, SESSION) == {f.index for f in FUNCTIONS} - {5, 34}
        assert len(session_kernel["links"]) < 20
    finally:
        links.close()


def test_no_kfunc_in_the_kernels_btf_fails_every_function_saying_so(session_kernel):
    session_kernel["kfunc"] = False
    links = _attach_session()
    try:
        assert not any(r.ok for r in links.results)
        assert all("no kfunc bpf_session_is_return" in r.entry for r in links.results)
        assert not session_kernel["links"] and not session_kernel["loads"]
    finally:
        links.close()


# -- a recording mixing kinds: kprobes beside fentry.multi ------------------------


def _routed(index: int, reg: int = 0, kind: str = "") -> KernelFunction:
    from ctracer.probes.kfunctions import KernelRoute
    return KernelFunction(index, f"f{index}", f"f{index}", (KernelRoute(index, None, reg),),
                          None, (), (), kind=kind)


@pytest.fixture
def kprobe_links(kernel, monkeypatch):
    """The kprobe.multi links made: (kprobe or kretprobe, sorted function indexes);
    ``refuse_kprobe``: function indexes the kernel refuses kprobes on."""
    kernel["kprobe_links"], kernel["refuse_kprobe"] = [], set()

    def kprobe_multi_link(prog_fd, kind, results):
        if any(r.function.index in kernel["refuse_kprobe"] for r in results):
            return -1, errno.EINVAL
        kernel["kprobe_links"].append((kind, sorted(r.function.index for r in results)))
        return os.open(os.devnull, os.O_RDONLY), 0

    monkeypatch.setattr(kattach, "_kprobe_multi_link", kprobe_multi_link)
    return kernel


def _attach_mixed(functions, fallback="kprobe", fallback_code=None) -> kattach.KernelLinks:
    links = kattach.KernelLinks("fentry.multi", functions, lambda name: name.encode(),
                                lambda f: TARGETS[f.index], task_storage=False,
                                fallback_kind=fallback, fallback_code=fallback_code)
    links.attach()
    return links


def test_the_fallbacks_programs_are_compiled_only_once_the_kernel_refuses_functions(
        kprobe_links):
    """Nothing refused: no fallback compile (the text's kprobe programs serve the
    functions planned on kprobes).  One refused: its kprobe programs compiled for it
    alone, after the trampoline's links, and loaded; a compile that fails leaves it
    failed with both reasons, and the planned kprobes attached."""
    from ctracer.errors import CtracerError
    kernel = kprobe_links
    asked: list[list[int]] = []

    def fallback_code(functions):
        asked.append(sorted(f.index for f in functions))
        return {f.program(k, False): b"fallback " + f.program(k, False).encode()
                for f in functions for k in ("kprobe", "kretprobe")}

    functions = tuple(_routed(i) for i in range(4)) + (_routed(4, kind="kprobe"),)
    links = _attach_mixed(functions, fallback_code=fallback_code)
    try:
        assert asked == [] and all(r.complete for r in links.results)
        assert not any(code.startswith(b"fallback") for code in kernel["code"])
    finally:
        links.close()
    kernel["refuse"] |= {(ENTRY, 1002)}
    kernel["kprobe_links"].clear()
    links = _attach_mixed(functions, fallback_code=fallback_code)
    try:
        assert asked == [[2]] and all(r.complete for r in links.results)
        by = {r.function.index: r.kind for r in links.results}
        assert by == {0: "fentry.multi,fexit.multi", 1: "fentry.multi,fexit.multi",
                      2: "kprobe,kretprobe", 3: "fentry.multi,fexit.multi",
                      4: "kprobe,kretprobe"}
        assert sorted(kernel["kprobe_links"]) == [("kprobe", [2, 4]), ("kretprobe", [2, 4])]
        assert [name for name, _ in links.fell_back_from] == ["f2"]
        # f2's programs are f4's (one route): the fallback's compile of them is loaded
        assert {c for c in kernel["code"] if c.startswith(b"fallback")} == \
            {b"fallback " + functions[2].program(k, False).encode()
             for k in ("kprobe", "kretprobe")}
    finally:
        links.close()

    def failing(functions):
        raise CtracerError("bcc could not compile the fallback's programs: an error")

    kernel["kprobe_links"].clear()
    links = _attach_mixed(functions, fallback_code=failing)
    try:
        by = {r.function.index: r for r in links.results}
        assert [i for i, r in by.items() if not r.complete] == [2]
        assert by[2].entry.startswith("the kernel refused it on a tracing_multi link (EINVAL")
        assert by[2].entry.endswith("; then on kprobes: bcc could not compile the fallback's "
                                    "programs: an error")
        assert sorted(kernel["kprobe_links"]) == [("kprobe", [4]), ("kretprobe", [4])]
    finally:
        links.close()


def test_functions_planned_on_kprobes_attach_after_the_tracing_multi_links(kprobe_links):
    kernel = kprobe_links
    functions = tuple(_routed(i) for i in range(6)) + (_routed(6, kind="kprobe"),
                                                       _routed(7, kind="kprobe"))
    links = _attach_mixed(functions, fallback=None)
    try:
        by = {r.function.index: r for r in links.results}
        assert all(r.complete for r in by.values())
        assert {i for i, r in by.items() if r.kind == "kprobe,kretprobe"} == {6, 7}
        assert {i for i, r in by.items() if r.kind == "fentry.multi,fexit.multi"} == set(range(6))
        assert _linked(kernel, ENTRY) == set(range(6)) == _linked(kernel, EXIT)
        assert sorted(kernel["kprobe_links"]) == [("kprobe", [6, 7]), ("kretprobe", [6, 7])]
        assert "tracing_multi" in links.how and "kprobe.multi" in links.how
        assert "(2 of 2 functions)" in links.how and not links.fell_back_from
    finally:
        links.close()


def test_a_function_the_kernel_refuses_on_the_trampoline_is_tried_once_on_kprobes(kprobe_links):
    kernel = kprobe_links
    kernel["refuse"] |= {(ENTRY, 1003), (ENTRY, 1005)}
    kernel["too_many_args"] |= {3}
    # f5's object is in the 8th register: a kprobe program cannot read it
    functions = tuple(_routed(i, reg=7 if i == 5 else 0) for i in range(6)) + \
        (_routed(6, kind="kprobe"),)
    links = _attach_mixed(functions)
    try:
        by = {r.function.index: r for r in links.results}
        assert by[3].complete and by[3].kind == "kprobe,kretprobe"
        assert links.fell_back_from == [("f3", "failed: the kernel refused it on a "
                                         "tracing_multi link (EINVAL: Invalid argument): "
                                         "The function f3 has 14 arguments. Too many.")]
        assert not by[5].complete and by[5].kind == "fentry.multi,fexit.multi"
        assert "tracing_multi link" in by[5].entry
        assert sorted(kernel["kprobe_links"]) == [("kprobe", [3, 6]), ("kretprobe", [3, 6])]
        assert _linked(kernel, ENTRY) == {0, 1, 2, 4} == _linked(kernel, EXIT)
    finally:
        links.close()
    # without a fallback kind the refused function stays refused
    kernel["kprobe_links"].clear()
    links = _attach_mixed(functions, fallback=None)
    try:
        assert not {r.function.index: r for r in links.results}[3].complete
        assert kernel["kprobe_links"] == [("kprobe", [6]), ("kretprobe", [6])]
    finally:
        links.close()


def test_a_function_refused_on_both_kinds_names_both_refusals(kprobe_links):
    kernel = kprobe_links
    kernel["refuse"] |= {(ENTRY, 1002)}
    kernel["refuse_kprobe"] |= {2}
    links = _attach_mixed(tuple(_routed(i) for i in range(4)))
    try:
        (failed,) = [r for r in links.results if not r.complete]
        assert failed.function.index == 2 and failed.kind == "kprobe,kretprobe"
        assert failed.entry.startswith("the kernel refused it on a tracing_multi link (EINVAL")
        assert "; then on kprobes: the kernel refused the kprobe.multi link (EINVAL" in failed.entry
    finally:
        links.close()


def test_kprobes_beside_session_links(session_kernel, kprobe_links):
    """fsession.multi (7.2's default) with functions planned on kprobes beside it: the
    session links first, then one kprobe.multi link per program; a function refused on
    the session link is tried on kprobes."""
    kernel = session_kernel
    kernel["refuse"] |= {(SESSION, 1002)}
    functions = tuple(_routed(i) for i in range(4)) + (_routed(4, kind="kprobe"),)
    links = kattach.KernelLinks("fsession.multi", functions, _session_code,
                                lambda f: TARGETS[f.index], task_storage=False,
                                fallback_kind="kprobe")
    links.attach()
    try:
        by = {r.function.index: r for r in links.results}
        assert all(r.complete for r in by.values())
        assert {i for i, r in by.items() if r.kind == "fsession.multi"} == {0, 1, 3}
        assert {i for i, r in by.items() if r.kind == "kprobe,kretprobe"} == {2, 4}
        assert _linked(kernel, SESSION) == {0, 1, 3}
        assert sorted(kernel["kprobe_links"]) == [("kprobe", [2, 4]), ("kretprobe", [2, 4])]
        assert [name for name, _ in links.fell_back_from] == ["f2"]
    finally:
        links.close()


def test_per_function_fentry_beside_kprobes_loads_only_its_own_functions_programs(monkeypatch):
    """Per-function fentry (6.1, 6.12) with a function planned on kprobes beside it whose
    route count no fentry function has: the text holds no fentry program of that count,
    and none is asked for (the 6.12 guest failed with "no program ctracer_fexit_r8")."""
    from ctracer.errors import CtracerError
    from ctracer.probes.kfunctions import KernelRoute
    wide = KernelFunction(9, "f9", "f9", (KernelRoute(9, None, 0), KernelRoute(10, None, 1)),
                          None, (), (), kind="kprobe")
    functions = (_routed(0), _routed(1), wide)
    compiled = {f.program(k, False) for f in functions[:2] for k in ("fentry", "fexit")} | \
        {wide.program(k, False) for k in ("kprobe", "kretprobe")}

    def instructions(name: str) -> bytes:
        if name not in compiled:
            raise CtracerError(f"the compiled probes have no program {name}")
        return name.encode()

    def opened(*args, **kwargs):
        return os.open(os.devnull, os.O_RDONLY), 0

    monkeypatch.setattr(kattach, "load_program", lambda *a, **k: (opened()[0], ""))
    monkeypatch.setattr(kattach, "_link", opened)
    monkeypatch.setattr(kattach, "_kprobe_multi_link", opened)
    monkeypatch.setattr(kattach, "raise_open_files", lambda wanted: wanted)
    links = kattach.KernelLinks("fentry", functions, instructions,
                                lambda f: TARGETS[f.index], task_storage=False)
    links.attach()
    try:
        by = {r.function.index: r for r in links.results}
        assert all(r.complete for r in by.values()), [r.entry for r in by.values()]
        assert by[9].kind == "kprobe,kretprobe" and by[0].kind == by[1].kind == "fentry,fexit"
    finally:
        links.close()
