"""The kernel's raw tracepoint program without loading it: which tracepoints and rows,
argument names from ``__bpf_trace_*``, lifetime rules in the C, the object admission
(--where parsed into a tree and checked against the mini layout, --comm and --object as
numbers only), and `ctracer trace --print-bpf` of the running kernel as one line on bad
input.  Needs the kernel's BTF (/sys/kernel/btf/vmlinux), no root."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys

import pytest

from ctracer.debuginfo.btf import reader as btf
from ctracer.errors import UsageError
from ctracer.event import FLAG_HEAD_ONLY, Field, Layout
from ctracer.plan import discovery, mini, where
from ctracer.plan.lifetime_rules import rules_for
from ctracer.probes import tracepoint as tp
from ctracer.probes.kernel_program import build_kernel_program

KERNEL_BTF = "/sys/kernel/btf/vmlinux"

LAYOUT = Layout.packed_in_order("ctracer__mini_t", [
    Field("__sk_common.skc_num", "u16", 0, "uint"),
    Field("__sk_common.skc_dport", "u16", 0, "uint"),
    Field("__sk_common.skc_state", "u8", 0, "uint"),
    Field("sk_err", "s32", 0, "int"),
    Field("other.skc_num", "u16", 0, "uint"),
    Field("name", "char[8]", 0, "text"),
])


@pytest.fixture(scope="module")
def kernel():
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    model = btf.open_btf(KERNEL_BTF)
    catalog = model.catalog()
    found = discovery.discover(catalog, "sock")
    layout = mini.build_mini(model.find_struct("sock")).layout
    return catalog, found.methods, layout


def test_where_parses_into_a_tree_of_layout_fields():
    node = where.parse("skc_dport == 0x1f90 && (sk_err < -3 || !skc_state)", LAYOUT)
    assert isinstance(node, where.And)
    assert node.left == where.Compare(LAYOUT.field("__sk_common.skc_dport"), "==", 0x1F90)
    assert where.to_text(node) == ("(__sk_common.skc_dport == 8080 && "
                                  "(sk_err < -3 || !(__sk_common.skc_state != 0)))")
    values = {"__sk_common.skc_dport": 8080, "sk_err": 0, "__sk_common.skc_state": 0}
    assert where.evaluate(node, values)
    assert not where.evaluate(node, {**values, "__sk_common.skc_state": 1})
    same = where.parse("__sk_common.skc_dport == 8080 and (sk_err < -3 or not "
                       "__sk_common.skc_state)", LAYOUT)
    assert where.to_text(same) == where.to_text(node)


@pytest.mark.parametrize("text, words", [
    ("skc_num == 1", ["ambiguous"]),
    ("skc_nmu == 1", ["no 'skc_nmu'", "did you mean"]),
    ("name == 1", ["not an integer field"]),
    ("skc_state == ); system(\"x\")", ["cannot read"]),
    ("skc_state == )", ["needs a value"]),
    ("skc_state =", ["needs a value"]),
    ("skc_dport == 127.0.0.1", ["needs a number, not '127.0.0.1'"]),
    ("skc_state == 1 extra", ["unexpected"]),
    ("(skc_state == 1", ["expected ')'"]),
    ("", ["needs a condition"]),
])
def test_where_refuses_what_it_cannot_check(text, words):
    with pytest.raises(UsageError) as e:
        where.parse(text, LAYOUT)
    for w in words:
        assert w in str(e.value)


def test_a_single_equals_sign_is_read_as_two():
    assert where.parse("skc_dport = 8080 and sk_err=-1", LAYOUT) == \
        where.parse("skc_dport == 8080 && sk_err == -1", LAYOUT)


def test_where_c_is_built_from_the_tree_only():
    node = where.parse("skc_dport == 8080 && sk_err != -1", LAYOUT)
    assert tp.where_c(node, "m") == (
        "(((u64)m->__sk_common__skc_dport == 0x1f90ULL) && ((s64)m->sk_err != -1LL))")


@pytest.mark.kernel
def test_kernel_plan_probes_the_tracepoints_with_named_arguments(kernel):
    catalog, methods, layout = kernel
    program = build_kernel_program(methods, layout, catalog, rules=rules_for("sock"))
    names = {t.name for t in program.tracepoints}
    assert {"inet_sock_set_state", "tcp_destroy_sock", "kfree_skb"} <= names
    assert len(program.rows) == sum(1 for m in methods if m.is_tracepoint)
    assert all(r.route_kind == "tracepoint" for r in program.rows)
    state = next(t for t in program.tracepoints if t.name == "inet_sock_set_state")
    assert [(a.name, a.ctype, a.kind) for a in state.args] == [
        ("sk", "u64", "pointer"), ("oldstate", "s64", "int"), ("newstate", "s64", "int")]
    assert state.routes[0].starts is not None and state.routes[0].ends is None
    # events of a class take the names of the class's __bpf_trace_ function when every
    # function with their types names them alike: net_dev_queue (class net_dev_template)
    # has skb; sock_send_length's types are also inet_sock_set_state's: no guess
    args = {t.name: [a.name for a in t.args] for t in program.tracepoints}
    assert args["net_dev_queue"] == ["skb"] and args["tcp_rcv_space_adjust"] == ["sk"]
    assert args["sock_send_length"] == ["arg1", "arg2", "arg3"]
    assert args["tcp_send_reset"][:2] == ["sk", "skb"]  # BTF: skb__nullable
    # a transition out of TCP_CLOSE starts a lifetime: in the tracepoint's descriptor
    assert "starts a lifetime when args[1] (oldstate) == 7" in tp.describe(state)
    # and an accepted socket's, at its clone into TCP_SYN_RECV: the second starts rule
    assert "starts a lifetime when args[2] (newstate) == 3" in tp.describe(state)
    row = tp.descriptor_bytes(state)
    assert len(row) == tp.tp_size() and row[:2] == bytes([len(state.routes), 3])
    route = tp._TPROUTE.unpack_from(row, 8)
    assert (route[0], route[1], route[3], route[5], route[-3]) == (state.routes[0].id, 0, 2, 1, 7)
    assert (route[7], route[8], route[-1]) == (2, 2, 3)
    # kfree_skb reaches sock through skb->sk: a read at the member's offset, no rule
    free = next(t for t in program.tracepoints if t.name == "kfree_skb")
    holder = next(s for s in free.routes if s.method.path)
    assert holder.starts is None and holder.ends is None
    assert " deref +" in tp.describe(free) and "lifetime" not in tp.describe(free)
    # a handful of programs, whatever the number of tracepoints, each loaded per
    # tracepoint with its index written in
    programs = re.findall(r"^int (ctracer_tp_r\d+)\(", program.text, re.M)
    assert len(programs) <= len(tp.ROUTE_COUNTS) < len(program.tracepoints)
    assert {t.probe for t in program.tracepoints} == set(programs)
    code = struct.pack("<Q", 0xb7 | tp.SELF_INDEX << 32) + struct.pack("<Q", 0x95)
    assert tp.with_index(code, 5)[4:8] == (5).to_bytes(4, "little")
    with pytest.raises(ValueError):
        tp.with_index(struct.pack("<Q", 0x95), 5)
    assert program.nargs == max(len(t.args) for t in program.tracepoints)
    assert "bpf_probe_read_kernel" in program.text and "bpf_probe_read_user" not in program.text
    # no admission asked: every object, no followed set consulted
    assert "ctracer_admit(" not in program.text
    # events are built in a per-CPU scratch and leave whole through ctracer_output, which
    # wakes the reader once per batch: no ring buffer reservation is held across the
    # snapshot's branches (6.1's verifier prunes no state holding one: E2BIG)
    hit = program.text.split("void ctracer_hit(")[1].split("\n}\n")[0]
    assert "ctracer_output(e);" in hit and "ringbuf_reserve" not in hit
    assert re.findall(r"ringbuf_output\(e, sizeof\(\*e\), (\w+)\(\)\)", program.text) == \
        ["ctracer_wake_flags"]


@pytest.mark.kernel
def test_admission_is_numbers_in_the_c(kernel):
    catalog, methods, layout = kernel
    admission = tp.Admission(processes=True, comm="tcp-loop", objects=(0xFFFF888012345678,),
                             where=where.parse("skc_num == 8080", layout), max_objects=5)
    text = build_kernel_program(methods, layout, catalog, admission=admission).text
    admit = text.split("int ctracer_admit(")[1].split("\n}\n")[0]
    assert "tcp-loop" not in text
    assert "c[0] != 116 || c[1] != 99 || c[2] != 112 || c[3] != 45" in admit
    assert "object != 0xffff888012345678ULL" in admit
    assert "((u64)m->__sk_common__skc_num == 0x1f90ULL)" in admit
    assert "__sync_fetch_and_add(admitted, 1) >= 5" in admit
    assert "BPF_HASH(ctracer_objects, u64, u8, 5);" in text
    assert "TRACEPOINT_PROBE(sched, sched_process_fork)" in text
    with pytest.raises(ValueError):
        build_kernel_program(methods, layout, catalog,
                                    admission=tp.Admission(comm='x"; y'))


def _ctracer(*args):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("options, words", [
    (["--where", "skc_nmu == 1"], ["--where", "skc_nmu"]),
    (["--comm", "has space"], ["--comm"]),
    (["--max-followed", "0"], ["--max-followed"]),
    (["--max-objects", "0"], ["--max-followed"]),  # the old spelling, an alias
    (["--functions", "no_such_tracepoint"], ["--functions", "no_such_tracepoint"]),
    (["--exclude", "*"], ["nothing to probe"]),
])
@pytest.mark.kernel
def test_print_bpf_of_the_kernel_refuses_bad_options_in_one_line(kernel, options, words):
    r = _ctracer("trace", "struct", "sock", "--print-bpf", *options)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0]


@pytest.mark.kernel
def test_print_bpf_of_the_kernel(kernel):
    r = _ctracer("trace", "sk_buff", "--print-bpf", "--functions", "kfree_skb", "consume_skb",
                 "--where", "len > 100")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("(struct bpf_raw_tracepoint_args *ctx)") == 2
    assert "((u64)m->len > 0x64ULL)" in r.stdout


@pytest.mark.kernel
def test_snapshot_reads_the_head_first_and_where_never_admits_on_fields_not_read(kernel):
    """With a head rule (`ctracer.plan.heads`, resolved from the kernel's BTF) the
    snapshot reads __sk_common first and the rest only for a full socket; a --where on
    a field outside the head refuses an object read only in its head (its zeros were
    never read), one on head fields does not."""
    from ctracer.plan import heads
    catalog, methods, layout = kernel
    model = btf.open_btf(KERNEL_BTF)
    head = heads.head_read_for("sock", model.find_struct("sock"), layout, model)
    assert head is not None and head.member == "__sk_common" and head.start == 0
    assert [n for _, n in head.states] == ["TCP_TIME_WAIT", "TCP_NEW_SYN_RECV"]
    program = build_kernel_program(
        methods, layout, catalog, head=head,
        admission=tp.Admission(where=where.parse("sk_rcvbuf == 0", layout)))
    snapshot = program.text.split("int ctracer_snapshot_in(")[-1].split("\n}\n")[0]
    first = f"bpf_probe_read_kernel(buf->b, {head.end}, (void *)(addr + 0))"
    states = " || ".join(f"state == {v}" for v, _ in head.states)
    assert snapshot.index(first) < snapshot.index(f"if ({states})") < \
        snapshot.index(f"(void *)(addr + {head.end})")
    admit = program.text.split("int ctracer_admit(")[1].split("\n}\n")[0]
    assert f"if (flags & {FLAG_HEAD_ONLY})\n\t\treturn 0;" in admit
    on_head = build_kernel_program(
        methods, layout, catalog, head=head,
        admission=tp.Admission(where=where.parse("skc_num == 80", layout)))
    assert f"if (flags & {FLAG_HEAD_ONLY})\n\t\treturn 0;" not in on_head.text


@pytest.mark.kernel
def test_arguments_btf_leaves_unnamed_are_named_from_tracefs(kernel):
    """sock_recv_length's prototype is inet_sock_set_state's class-mate's: BTF cannot
    say its names (arg1..arg3 above); its tracefs format can: sk, ret, flags, the
    computed family and protocol between them skipped."""
    from ctracer.host.tracefs import find_tracefs, tracepoint_format_fields
    if find_tracefs() is None:
        pytest.skip("tracefs is not mounted here")
    catalog, methods, layout = kernel
    fields = tracepoint_format_fields("sock_recv_length")
    assert [n for _, n in fields] == ["sk", "family", "protocol", "ret", "flags"]
    program = build_kernel_program(methods, layout, catalog, rules=rules_for("sock"),
                                   format_fields=tracepoint_format_fields)
    args = {t.name: [a.name for a in t.args] for t in program.tracepoints}
    assert args["sock_recv_length"] == ["sk", "ret", "flags"]
    assert args["inet_sock_set_state"] == ["sk", "oldstate", "newstate"]  # BTF's, kept
    assert tracepoint_format_fields("no_such_tracepoint") == []
    assert tracepoint_format_fields("../etc") == []


def test_names_from_a_format_need_every_parameter_matched():
    from ctracer.debuginfo.catalog import Parameter, ShapeKind, TypeShape as Shape
    sk = Parameter(None, Shape(ShapeKind.STRUCT, "sock", pointers=1))
    ret = Parameter(None, Shape(ShapeKind.BASE, "int"))
    fields = [("void *", "sk"), ("__u16", "family"), ("int", "ret")]
    assert tp.names_from_format([sk, ret], fields) == ["sk", "ret"]
    assert tp.names_from_format([sk, ret, ret], fields) == []  # a third never found
    assert tp.names_from_format([ret, sk], fields) == []       # order kept
