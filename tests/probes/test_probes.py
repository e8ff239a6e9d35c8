"""The generated BPF program, without loading it: one entry and one exit probe per
function, one function-table row per method, names from ids only, argument and return
value locations, and the collectors' C compiled with gcc against the reference
extraction of `ctracer.plan.mini.extract_field` on random object bytes.  `--print-bpf`
runs as an unprivileged user."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from support import groundtruth as gt
from support.cbuild import Build, compile_c
from ctracer.plan import discovery
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan import mini
from ctracer.probes import uprobe
from ctracer.collectors import registry
from ctracer.collectors.snapshot import collectors_for, read_span
from ctracer.plan.discovery import Method
from ctracer.event import c_event_definition, event_size
from ctracer.probes import ctext
from ctracer.debuginfo.catalog import FunctionInfo, Parameter, ShapeKind, TypeShape

X86 = uprobe.ARCHES["x86_64"]


@pytest.fixture(scope="module")
def sample():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    types = dwarf.open_elf_types(gt.SOCKDEMO, use_cache=False)
    found = discovery.discover(types.catalog(), "sock")
    built = mini.build_mini(types.find_struct("sock"), kinds=registry.claim)
    return found.methods, built


def test_one_entry_and_one_exit_probe_per_function(sample):
    methods, built = sample
    program = uprobe.build_program(methods, built.layout, arch=X86)
    keys = {m.key for m in methods if m.probeable}
    assert {f.key for f in program.functions} == keys
    entries = re.findall(r"^int (ctracer_entry_\d+)\(struct pt_regs \*ctx\)$", program.text, re.M)
    exits = re.findall(r"^int (ctracer_exit_\d+)\(struct pt_regs \*ctx\)$", program.text, re.M)
    assert sorted(entries) == sorted(f.entry_probe for f in program.functions)
    assert sorted(exits) == sorted(f.exit_probe for f in program.functions)
    # static functions sharing a name are probed apart, at their own addresses
    checks = [f for f in program.functions if f.name == "sk_check"]
    assert {f.unit for f in checks} == {"sock.c", "tcp.c"}
    assert len({f.address for f in checks}) == 2


def test_rows_are_methods_in_route_order(sample):
    methods, built = sample
    program = uprobe.build_program(methods, built.layout, arch=X86)
    assert len(program.rows) == len(methods)
    assert [r.id for r in program.rows] == list(range(1, len(methods) + 1))
    by_name = {f.name: f for f in program.functions}
    accept = by_name["tcp_accept"]
    assert [s.method.route_kind for s in accept.routes] == ["direct", "returns"]
    assert accept.routes[1].arg is None and accept.return_ctype == "u64"
    clone = by_name["sk_clone_state"]
    assert [s.method.param_index for s in clone.routes] == [0, 1]
    assert [s.arg for s in clone.routes] == ["PT_REGS_PARM1(ctx)", "PT_REGS_PARM2(ctx)"]
    init = by_name["sock_init_data"]
    assert [s.method.route_kind for s in init.routes] == ["holder", "direct"]
    # the holder's path reads sock->sk (offset 16) at entry and again at exit if NULL
    body = program.text.split(f"int {init.exit_probe}(")[1].split("\n}\n")[0]
    assert "obj = ctracer_deref(obj, 16);" in body
    assert by_name["tcp_sendmsg"].return_ctype == "s64"
    assert by_name["inet_sk_port"].return_ctype == "u16"
    assert by_name["tcp_set_state"].return_ctype is None


def test_filter_and_fork_following_only_when_asked(sample):
    methods, built = sample
    everyone = uprobe.build_program(methods, built.layout, arch=X86)
    one = uprobe.build_program(methods, built.layout, arch=X86, filtered=True)
    assert "#define CTRACER_FILTER 0" in everyone.text and "sched_process_fork" not in everyone.text
    assert "#define CTRACER_FILTER 1" in one.text and "sched_process_fork" in one.text
    assert "BPF_RINGBUF_OUTPUT(ctracer_events, 4096);" in one.text
    kernel = uprobe.build_program(methods, built.layout, arch=X86,
                                  reader=uprobe.ObjectReader("kernel"))
    assert "bpf_probe_read_kernel(buf->b" in kernel.text
    assert "bpf_probe_read_user" not in kernel.text


def _function(name, *param_shapes, returns=TypeShape(ShapeKind.VOID, None)):
    return FunctionInfo(name, tuple(Parameter(f"p{i}", s) for i, s in enumerate(param_shapes)),
                        returns, unit="x.c", address=0x1000)


SOCK_P = TypeShape(ShapeKind.STRUCT, "sock", 1, text="struct sock *")
INT = TypeShape(ShapeKind.BASE, "int", text="int")
DOUBLE = TypeShape(ShapeKind.BASE, "double", text="double")
BY_VALUE = TypeShape(ShapeKind.STRUCT, "pair", 0, text="struct pair")


def test_argument_locations():
    assert uprobe.argument_expr(_function("f", INT, SOCK_P), 1, X86)[0] == "PT_REGS_PARM2(ctx)"
    # floating point arguments travel in vector registers
    assert uprobe.argument_expr(_function("f", DOUBLE, SOCK_P), 1, X86)[0] == "PT_REGS_PARM1(ctx)"
    # the 8th integer argument is the second one on the stack, above the return address
    f = _function("f", *([INT] * 7), SOCK_P)
    assert uprobe.argument_expr(f, 7, X86)[0] == "ctracer_stack_arg(ctx, 16)"
    where, why = uprobe.argument_expr(_function("f", BY_VALUE, SOCK_P), 1, X86)
    assert where is None and "by value" in why


@pytest.mark.parametrize("name,ctype", [
    ("int", "s32"), ("long int", "s64"), ("short unsigned int", "u16"), ("char", "s8"),
    ("unsigned char", "u8"), ("_Bool", "u8"), ("long long unsigned int", "u64"),
    ("double", None), ("float", None), ("__int128", None)])
def test_return_value_types(name, ctype):
    assert uprobe.return_ctype(TypeShape(ShapeKind.BASE, name)) == ctype


def test_function_names_never_reach_the_c_text(sample):
    _, built = sample
    evil = _function("x */ system(\"rm\"); /*", SOCK_P)
    m = Method(evil, "direct", "struct sock", 0, "p0", "struct sock *")
    program = uprobe.build_program([m], built.layout, arch=X86)
    assert "system" not in program.text
    assert "/* ?: entry */" in program.text
    assert program.rows[0].name == evil.name  # kept as data for the trace file


def test_unprobeable_methods_become_rows_that_say_why(sample):
    _, built = sample
    inline = FunctionInfo("inlined", (Parameter("sk", SOCK_P),), TypeShape(ShapeKind.VOID, None),
                          unit="x.c", address=None, inlined_only=True)
    m = Method(inline, "direct", "struct sock", 0, "sk", "struct sock *", probeable=False,
               not_probeable="inline only (no out-of-line copy)")
    by_value = Method(_function("later", BY_VALUE, SOCK_P), "direct", "struct sock", 1, "p1",
                      "struct sock *")
    program = uprobe.build_program([m, by_value], built.layout, arch=X86)
    assert program.functions == ()
    assert [r.attached.split(":")[0] for r in program.rows] == ["skipped", "skipped"]
    assert "inline only" in program.rows[0].attached


HARNESS = r"""
#include <stdio.h>
#include <string.h>
typedef unsigned char u8; typedef signed char s8;
typedef unsigned short u16; typedef short s16;
typedef unsigned int u32; typedef int s32;
typedef unsigned long long u64; typedef long long s64;
%(definitions)s
static unsigned char object[%(object_size)d] __attribute__((aligned(8)));
static void snapshot(struct %(mini)s *m, const unsigned char *buf, u64 addr)
{
%(statements)s
}
int main(void)
{
	struct ctracer_event e;
	if (fread(object, 1, sizeof(object), stdin) != sizeof(object))
		return 1;
	memset(&e, 0xa5, sizeof(e));
	memset(&e.m, 0, sizeof(e.m));
	snapshot(&e.m, object + %(start)d, %(address)#xULL);
	fwrite(&e.m, 1, sizeof(e.m), stdout);
	return 0;
}
"""


def test_collectors_extract_what_the_reference_does(sample, tmp_path):
    """The C the collectors emit, run on random object bytes, gives the values
    `mini.extract_field` computes from the same bytes (bit masks, shifts, sign
    extension of signed bitfields, unions, char arrays, and the values of complex
    members: a lock held, a list head pointing to itself)."""
    _, built = sample
    layout = built.layout
    collectors = collectors_for(layout)
    start, end = read_span(collectors)
    statements = "\n".join("\t" + s for c in collectors
                           for s in c.c_statements("(*m)", "buf", start, "addr"))
    address = 0x7f0000001000
    source = HARNESS % dict(definitions=c_event_definition(layout), object_size=built.struct_size,
                            mini=layout.name, statements=statements, start=start,
                            address=address)
    (tmp_path / "harness.c").write_text(source)
    exe = tmp_path / "harness"
    compile_c(tmp_path / "harness.c", exe, Build(opt=1), debug=False, flags=["-Wall", "-Werror"])
    rng = random.Random(1234)
    ops = [f for f in layout.fields if f.source.get("op")]
    assert {f.source["op"] for f in ops} >= {"nonzero", "is_own_address"}
    seen = {f.name: set() for f in ops}
    for i in range(40):
        raw = bytearray(rng.getrandbits(8) for _ in range(built.struct_size))
        for f in ops:  # half the time, the state a value tells apart
            at, size = f.source["byte_offset"], f.source["size"]
            if i % 2 and f.source["op"] == "is_own_address":
                raw[at:at + size] = (address + f.source["address_offset"]).to_bytes(size, "little")
            elif i % 2:
                raw[at:at + size] = bytes(size)
        out = subprocess.run([str(exe)], input=bytes(raw), capture_output=True, check=True).stdout
        got = layout.decode(out)
        for f in layout.fields:
            want = mini.extract_field(bytes(raw), f, address)
            assert got[f.name] == want, (f.name, f.source, got[f.name], want)
            if f.name in seen:
                seen[f.name].add(want)
    assert all(values == {0, 1} for values in seen.values()), seen


def test_print_bpf_needs_no_root(sample, tmp_path):
    """--print-bpf prints exactly the program ctracer would load, as any user."""
    methods, built = sample
    argv = [sys.executable, "-m", "ctracer", "trace", "struct", "sock", "--binary", gt.SOCKDEMO,
            "--no-cache", "--print-bpf"]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + argv
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    os.chmod(tmp_path, 0o777)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == uprobe.build_program(methods, built.layout, compact=True).text


def test_exclude_fields_leaves_them_out_of_the_program(sample, tmp_path):
    """`ctracer trace --exclude-fields GLOB` reaches the program: the sk_* members are
    not copied, the __sk_common ones still are."""
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock", "--binary",
                        gt.SOCKDEMO, "--print-bpf", "--exclude-fields", "sk_*"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    event = r.stdout.split("struct ctracer__mini_sock {")[1].split("};")[0]
    assert "__sk_common__skc_state" in event and "sk_" not in event.replace("__sk_common", "")


def _submits(text: str) -> list[str]:
    """The flags of every ring buffer submit and discard in a program's C."""
    return re.findall(r"ringbuf_(?:submit|discard)\(e, (\w+)(?:\(\))?\)", text)


def test_events_are_submitted_without_waking_the_reader_but_once_per_batch(sample):
    """A wake-up per event (the default, adaptive flags 0) cost more than the rest of a
    probe; every event goes through ``ctracer_submit``, which wakes the reader once per
    `wake_every` events of a CPU."""
    methods, built = sample
    text = uprobe.build_program(methods, built.layout, arch=X86, ring_bytes=1 << 20).text
    assert _submits(text) == ["ctracer_wake_flags"]  # the one submit, in ctracer_submit
    body = text.split("u64 ctracer_wake_flags(")[1].split("\n}\n")[0]
    assert "return CTRACER_RB_NO_WAKEUP" in body and "return CTRACER_RB_FORCE_WAKEUP" in body
    assert "ringbuf_submit(e, ctracer_wake_flags())" in text
    every = ctext.wake_every(1 << 20, event_size(built.layout), os.cpu_count() or 1)
    assert f"#define CTRACER_WAKE_EVERY {every}\n" in text
    assert "ctracer_submit(e);" in text.split("void ctracer_emit(")[1]
    # the maps come before any function (bcc crashed on a map declared after one)
    assert text.index("BPF_PERCPU_ARRAY(ctracer_unwoken, u32, 1);") < text.index("\n{\n")
    # compact events leave through ringbuf_output, with the same wake-up flags
    compact = uprobe.build_program(methods, built.layout, arch=X86, ring_bytes=1 << 20,
                                   compact=True).text
    assert "ringbuf_output(" in compact and "ctracer_wake_flags())" in \
        compact.split("void ctracer_send_from(")[1]
    assert compact.index("BPF_PERCPU_ARRAY(ctracer_work,") < compact.index("\n{\n")


@pytest.mark.parametrize("ring, event, cpus, every", [
    (16 << 20, 248, 2, ctext.MAX_WAKE_EVERY),    # a big ring: the cap
    (1 << 20, 248, 2, (1 << 20) // 256 // 8),    # a quarter of the ring over 2 CPUs
    (1 << 20, 248, 64, (1 << 20) // 256 // 256),
    (4096, 4000, 8, 1),                          # one event fills the ring: wake each
])
def test_a_cpu_wakes_the_reader_before_a_quarter_of_the_ring_is_full(ring, event, cpus, every):
    assert ctext.wake_every(ring, event, cpus) == every
