"""The kernel-function programs, without loading them (tests/record/test_verify.py loads the
kprobe ones here; tests/vm/ attaches them in the guests): a handful of generic programs
whatever the number of functions, each function described by a packed descriptor whose
layout the C pins with static asserts, its ways to the object in parameter order with
their function-table rows, registers, holder steps, return and argument widths, and
lifetime flags from the lifetime rules (creators' returns start a life, only the functions
a rule names end one); nothing from debug info in the C text."""

from __future__ import annotations

import os
import re
import struct
import subprocess

import pytest

from support import groundtruth as gt
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan import attach, discovery, mini
from ctracer.host.facts import KernelFacts, Mechanism
from ctracer.probes import kfunctions
from ctracer.probes.kernel_program import build_kernel_program
from ctracer.probes.uprobe import ARCHES
from ctracer.report.values import ValueFormatter

X86 = ARCHES["x86_64"]
FENTRY = KernelFacts(fentry=Mechanism(True, "works"), kprobes=Mechanism(True, "works"))


@pytest.fixture(scope="module")
def sample():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    types = dwarf.open_elf_types(gt.SOCKDEMO, use_cache=False)
    found = discovery.discover(types.catalog(), "sock")
    plan = attach.plan_probes(found.methods, FENTRY)
    layout = mini.build_mini(types.find_struct("sock")).layout
    methods = [m for p in plan.of_kind("fentry") for m in p.methods]
    return methods, layout, types.catalog()


@pytest.mark.parametrize("kind", ["fentry", "kprobe"])
def test_a_handful_of_programs_whatever_the_function_count(sample, kind):
    methods, layout, catalog = sample
    few = build_kernel_program((), layout, catalog, function_methods=methods[:3],
                               entry_kind=kind, arch=X86)
    every = build_kernel_program((), layout, catalog, function_methods=methods,
                                 entry_kind=kind, arch=X86)
    assert len(every.kfunctions) > 10
    names = every.program_names()
    exit_kind = kfunctions.KINDS[kind]
    assert names and all(re.fullmatch(rf"ctracer_({kind}|{exit_kind})_r[1248]", n) for n in names)
    defined = set(re.findall(r"^int (ctracer_\w+)\(", every.text, re.M))
    assert set(names) <= defined and len(defined) <= 2 * len(kfunctions.ROUTE_COUNTS)
    # the text does not grow with the functions: only the descriptor map's size does
    assert abs(len(every.text) - len(few.text)) < 2000
    # no name from the debug info reaches the C
    for f in every.kfunctions:
        assert not re.search(rf"\b{re.escape(f.name)}\b", every.text), f.name


def _bodies(text: str) -> dict[str, str]:
    """Each program's C, by name."""
    starts = list(re.finditer(r"^int (ctracer_\w+)\(", text, re.M))
    return {m.group(1): text[m.start():(starts[i + 1].start() if i + 1 < len(starts) else None)]
            for i, m in enumerate(starts)}


@pytest.mark.parametrize("kind", ["fentry", "kprobe"])
def test_task_storage_programs_come_with_their_lru_hash_variants(sample, kind):
    """A text keeping the thread state in task storage holds, for every program the
    functions use, its LRU-hash variant too (what the recorder loads where a verifier
    refuses the first: 6.1's kretprobes of more routes, E2BIG), the maps of both beside
    each other; without task storage only the LRU-hash programs."""
    methods, layout, catalog = sample
    exit_kind = kfunctions.KINDS[kind]
    for storage in (True, False):
        program = build_kernel_program((), layout, catalog, function_methods=methods,
                                       entry_kind=kind, arch=X86, task_storage=storage)
        bodies = _bodies(program.text)
        hashed = program.program_names(task_storage=False)
        assert hashed == sorted({f.program(k, False) for f in program.kfunctions
                                 for k in (kind, exit_kind)})
        assert hashed and all(n.endswith(kfunctions.HASHED_SUFFIX) for n in hashed)
        assert set(hashed) <= set(bodies)
        for name in hashed:
            assert "ctracer_depth." in bodies[name] and "task_storage_get" not in bodies[name]
        assert ("BPF_TASK_STORAGE(ctracer_kthreads" in program.text) == storage
        assert 'BPF_TABLE("lru_hash", u32, u32, ctracer_depth' in program.text
        if storage:
            names = program.program_names()
            assert names == sorted(n[:-len(kfunctions.HASHED_SUFFIX)] for n in hashed)
            for name in names:
                assert "task_storage_get" in bodies[name] and "ctracer_depth." not in bodies[name]
        else:
            assert program.program_names() == hashed
            assert set(bodies) == set(hashed)


def test_descriptors_pack_as_the_c_struct_says(sample):
    methods, layout, catalog = sample
    program = build_kernel_program((), layout, catalog, function_methods=methods,
                                   entry_kind="fentry", arch=X86)
    size = kfunctions.kfn_size()
    assert f'_Static_assert(sizeof(struct ctracer_kfn) == {size}, "kfn size");' in program.text
    rows = {r.id: r for r in program.rows}
    for f in program.kfunctions:
        packed = kfunctions.descriptor_bytes(f)
        assert len(packed) == size
        nroutes, nargs, ret_bits, ret_signed = struct.unpack_from("<BBBB", packed)
        assert nroutes == len(f.routes) and nargs == len(f.args)
        assert (ret_bits, bool(ret_signed)) == (f.returns or (0, False))
        at = kfunctions._kfn_routes_offset()
        for s in f.routes:
            row, reg, nsteps, flags = struct.unpack_from("<IBBB", packed, at)
            assert rows[row].name == f.name and row == s.row
            assert reg == (255 if s.method.param_index is None else s.reg)
            assert nsteps == len(s.method.path)
            at += kfunctions._route_size()
        order = [(s.method.param_index is None, s.method.param_index or 0) for s in f.routes]
        assert order == sorted(order)


def test_holders_and_returns_and_lifetime_names(sample):
    from ctracer.plan.lifetime_rules import LifetimeRule
    methods, layout, catalog = sample
    # the sample's sk_free stands in for a freeing function a rule names; its other
    # functions named like frees (sock_kfree_s-like) end nothing
    rule = LifetimeRule("sock", "sk_free", 0, "ends", probe="function")
    program = build_kernel_program((), layout, catalog, function_methods=methods,
                                   entry_kind="fentry", arch=X86, rules=(rule,))
    routes = [s for f in program.kfunctions for s in f.routes]
    assert any(s.method.path for s in routes)               # socket->sk and the like
    returns = [s for s in routes if s.method.param_index is None]
    assert returns and all(s.reg == -1 for s in returns)
    lookup = re.compile(r"(^|_)(lookup|find|get|peek|search|next|prev|first|last)(_|$)")
    for s in routes:
        assert s.starts == (s.method.route_kind == "returns" and not lookup.search(s.method.name))
        assert s.ends == (not s.method.path and s.method.param_index is not None
                          and s.method.name == "sk_free")
    assert any(s.starts for s in routes) and any(s.ends for s in routes)
    kinds = program.return_kinds()
    assert kinds and set(kinds.values()) <= {"pointer", "int", "uint", "bool", "enum"}
    assert all(kinds[s.row] == "pointer" for s in returns)


def test_returned_pointers_read_as_null_err_ptr_or_address():
    from ctracer.event import Layout
    fmt = ValueFormatter(Layout("m", (), 0))
    assert fmt.show_pointer(0) == "NULL"
    assert fmt.show_pointer(-12) == "ERR_PTR(-ENOMEM)"
    assert fmt.show_pointer((1 << 64) - 11) == "ERR_PTR(-EAGAIN)"
    assert fmt.show_pointer(0xffff888012345678) == "0xffff888012345678"
    assert fmt.show_retval(-11) == "-EAGAIN (-11)"


@pytest.mark.parametrize("routes", kfunctions.ROUTE_COUNTS)
def test_fexit_reads_no_register_again_without_its_entry(routes):
    """An exit takes its entry's objects and arguments; without one it writes only what
    the return value gives, like a kretprobe: re-reading and normalising the arguments
    on that path took 6.1's verifier past its million instructions (E2BIG) on every
    fexit program of more ways than one (665k processed for 4 ways on a two-argument
    function, 39k without it)."""
    text = kfunctions.programs_c(["fentry"], [routes], kfunctions.NARGS, True)
    for name in (kfunctions.program_name("fexit", routes),
                 kfunctions.program_name("fexit", routes, task_storage=False)):
        body = text.split(f"int {name}(void *ctx)\n{{")[1].split("\n}\n")[0]
        assert "bpf_get_func_ret(ctx, &raw)" in body
        for read in ("ctracer_kargs(", "ctracer_fentry_reg(", "bpf_get_func_arg("):
            assert read not in body, (name, read)


def test_normalise_gives_each_width_and_sign_its_c_value(tmp_path):
    """``ctracer_normalise`` (branch-free, for 6.1's verifier) compiled from the programs'
    own text by the host's C compiler: each width truncates, signed ones sign-extend,
    width 0 reads as 0."""
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    text = kfunctions.programs_c(["kprobe"], [1], kfunctions.NARGS, False)
    start = text.index("static __always_inline u64 ctracer_normalise(")
    function = text[start:text.index("\n}\n", start) + 3]
    values = [0, 1, 0x7f, 0x80, 0xff, 0x1234_8765, 0xffff_ffff_ffff_fffe, 0x8000_0000_0000_0000]
    cases = [(v, bits, signed) for v in values for bits in (0, 8, 16, 32, 64) for signed in (0, 1)]
    src = tmp_path / "n.c"
    src.write_text("#include <stdio.h>\n#include <stdint.h>\ntypedef uint64_t u64; "
                   "typedef int64_t s64; typedef uint8_t u8;\n#define __always_inline inline\n"
                   + function + "int main(void) {\n" + "".join(
                       f'\tprintf("%llu\\n", (unsigned long long)ctracer_normalise({v}ULL, '
                       f'{b}, {s}));\n' for v, b, s in cases) + "\treturn 0;\n}\n")
    subprocess.run([cc, "-O2", "-o", str(tmp_path / "n"), str(src)], check=True)
    got = [int(x) for x in subprocess.run([str(tmp_path / "n")], capture_output=True,
                                          text=True, check=True).stdout.split()]

    def expected(v: int, bits: int, signed: int) -> int:
        if bits == 0:
            return 0
        low = v & ((1 << bits) - 1)
        if signed and low >> (bits - 1):
            low -= 1 << bits
        return low & (2 ** 64 - 1)

    assert got == [expected(*c) for c in cases]


def test_kprobe_registers_count_the_hidden_pointer_of_a_large_struct_returned_by_value():
    """x86-64 returns a struct over 16 bytes through a pointer the caller passes first:
    a kprobe finds every argument one register on (and records none); 16 bytes or less
    come back in registers and move nothing; an unknown size is skipped, saying so.
    Past six registers a kprobe function is skipped (the stack is not read); a function
    planned on kprobes beside fentry.multi gets kprobe's limits, not fentry's."""
    from ctracer.debuginfo.catalog import FunctionInfo, Parameter, ShapeKind, TypeShape
    from ctracer.plan.discovery import Method
    sock = TypeShape(ShapeKind.STRUCT, "sock", 1, text="struct sock *")
    u32 = TypeShape(ShapeKind.BASE, "u32", 0, text="u32")
    sizes = {"big": 24, "small": 8}

    def method(name, returns, params=(sock,), index=0):
        shape = TypeShape(ShapeKind.STRUCT, returns, 0, text=f"struct {returns}")
        f = FunctionInfo(name, tuple(Parameter(f"a{i}", p) for i, p in enumerate(params)), shape)
        return Method(f, "direct", "struct sock", index, f"a{index}", "struct sock *",
                      route_form="struct sock")

    methods = [method("ret_big", "big"), method("ret_small", "small"),
               method("ret_unknown", "mystery"),
               method("seventh", "small", (u32,) * 6 + (sock,), index=6)]
    size = lambda shape: sizes.get(shape.name)   # noqa: E731
    rows, functions = kfunctions.plan_kernel_functions(methods, X86, max_regs=6, kind="kprobe",
                                                       struct_size=size)
    by = {f.name: f for f in functions}
    assert by["ret_big"].routes[0].reg == 1 and by["ret_big"].args == ()
    assert by["ret_small"].routes[0].reg == 0 and len(by["ret_small"].args) == 1
    skipped = {r.name: r.attached for r in rows if r.attached}
    assert skipped["ret_unknown"].startswith("skipped: cannot locate the arguments: it returns "
                                             "struct mystery by value")
    assert "not in the first 6 registers (later ones are on the stack" in skipped["seventh"]
    # beside fentry.multi: the same function on kprobes is held to kprobe's registers
    rows, functions = kfunctions.plan_kernel_functions(
        methods[3:], X86, max_regs=12, kind="fentry.multi", struct_size=size,
        kinds={"seventh": "kprobe"})
    assert not functions and "on the stack" in rows[0].attached
    rows, functions = kfunctions.plan_kernel_functions(methods[3:], X86, max_regs=12,
                                                       kind="fentry.multi", struct_size=size)
    assert functions[0].routes[0].reg == 6 and not functions[0].kprobe_ready
    assert functions[0].kind == "fentry.multi"
