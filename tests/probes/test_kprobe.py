"""The kprobe/kretprobe programs of a probe plan, without loading them (tests/record/
test_verify.py loads them): an entry and an exit program per planned function, all
tail-calling the one emitter, methods in slot order with their function-table ids,
argument and return-value reads, holder paths followed with bpf_probe_read_kernel, no
name from debug info in the C text, and functions whose arguments cannot be located
skipped with the reason."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import groundtruth as gt
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.debuginfo.model import FunctionInfo, Parameter, ShapeKind, TypeShape
from ctracer.plan import attach, discovery, mini
from ctracer.plan.attach import KernelFacts, Mechanism
from ctracer.probes import kprobe
from ctracer.probes.program import ARCHES

X86 = ARCHES["x86_64"]
KPROBES = KernelFacts(fentry=Mechanism(False, "refused"), kprobes=Mechanism(True, "works"))


@pytest.fixture(scope="module")
def planned():
    """The sample's sock methods planned as kernel functions (the C does not care where
    the types came from)."""
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    types = dwarf.open_elf_types(gt.SOCKDEMO, use_cache=False)
    found = discovery.discover(types.catalog(), "sock")
    plan = attach.plan_probes(found.methods, KPROBES)
    layout = mini.build_mini(types.find_struct("sock")).layout
    return plan, kprobe.build_kprobe_program(plan.of_kind("kprobe"), layout, arch=X86)


def test_an_entry_and_an_exit_program_per_function_and_one_emitter(planned):
    plan, program = planned
    functions = {p.function for p in plan.of_kind("kprobe")}
    assert {f.key for f in program.functions} | set(program.skipped) == functions
    names = program.program_names
    assert names[0] == kprobe.EMITTER and len(names) == 1 + 2 * len(program.functions)
    defined = re.findall(r"^int (\w+)\(struct pt_regs \*ctx\)$", program.text, re.M)
    assert defined == [kprobe.EMITTER] + names[1:]
    # every probe hands over to the emitter; only the emitter writes events
    assert program.text.count("ctracer_emitters.call(ctx, 0);") == 2 * len(program.functions)
    assert program.text.count("ringbuf_reserve") == 1
    assert re.findall(r"ringbuf_submit\(e, (\w+)\)", program.text) == ["flags"]
    assert "bpf_probe_read_kernel" in program.text and "bpf_probe_read_user" not in program.text


def test_slots_carry_the_methods_in_parameter_order_with_unique_ids(planned):
    _, program = planned
    ids = [s.id for f in program.functions for s in f.slots]
    assert ids == list(range(1, len(ids) + 1))
    for f in program.functions:
        order = [(s.method.param_index is None, s.method.param_index or 0) for s in f.slots]
        assert order == sorted(order)
    slots = max(len(f.slots) for f in program.functions)
    assert f"#define CTRACER_SLOTS {slots}" in program.text


def _body(text: str, name: str) -> str:
    start = text.index(f"int {name}(struct pt_regs *ctx)")
    return text[start:text.index("\n}\n", start)]


def test_entry_reads_arguments_and_follows_holder_paths_exit_reads_the_return(planned):
    _, program = planned
    holder = next(f for f in program.functions
                  if any(s.method.reach == "holder" for s in f.slots))
    entry = _body(program.text, holder.entry_probe)
    step = next(s for s in holder.slots if s.method.reach == "holder").method.path[0]
    assert f"ctracer_deref(obj, {step.offset});" in entry
    assert "PT_REGS_PARM" in entry
    exit_ = _body(program.text, holder.exit_probe)
    assert "PT_REGS_PARM" not in exit_       # the registers are gone: objects come from the entry
    returns = next(f for f in program.functions
                   if any(s.method.reach == "returns" for s in f.slots))
    i = next(i for i, s in enumerate(returns.slots) if s.method.reach == "returns")
    assert f"p->object[{i}] = PT_REGS_RC(ctx);" in _body(program.text, returns.exit_probe)
    assert f"p->object[{i}] = 0;" in _body(program.text, returns.entry_probe)


def test_no_debug_info_name_reaches_the_c_text_outside_comments(planned):
    _, program = planned
    code = re.sub(r"/\*.*?\*/", "", program.text, flags=re.S)
    for f in program.functions:
        assert not re.search(rf"\b{re.escape(f.name)}\b", code), f.name


def test_a_function_whose_argument_cannot_be_located_is_skipped_with_the_reason():
    by_value = TypeShape(ShapeKind.STRUCT, "big", 0, text="struct big")
    sock = TypeShape(ShapeKind.STRUCT, "sock", 1, text="struct sock *")
    f = FunctionInfo("takes_struct_first", (Parameter("b", by_value), Parameter("sk", sock)),
                     TypeShape(ShapeKind.VOID, None, 0, text="void"), address=0x10)
    m = discovery.Method(f, "direct", "struct sock", 1, "sk", "struct sock *", route="struct sock")
    plan = attach.plan_probes([m], KPROBES)
    layout_probe = plan.of_kind("kprobe")
    from ctracer.event import Field, Layout
    layout = Layout("ctracer__mini_sock",
                    (Field("x", "u64", 0, source={"byte_offset": 0, "size": 8}),), 8)
    program = kprobe.build_kprobe_program(layout_probe, layout, arch=X86)
    assert not program.functions
    assert program.skipped == {"takes_struct_first": "cannot locate parameter 2: an earlier one "
                                                     "is passed by value"}
