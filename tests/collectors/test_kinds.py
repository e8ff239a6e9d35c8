"""The collectors of complex members (`ctracer.collectors.registry` and one module per
kind): each kind on the kernel's own layout, read from the running kernel's BTF, and on
hand-made graphs of the same shapes; unknown complex types are skipped with a reason;
the registry finds every kind module by itself."""

from __future__ import annotations

from support.encoding import encode
import os
import re
import shutil
import subprocess

import pytest

from ctracer.collectors import registry
from ctracer.debuginfo.typegraph import (BaseType, CompositeType, Encoding, Member, PointerType,
                                     TypeGraph, Typedef)
from ctracer.debuginfo.sources import KERNEL_BTF
from ctracer.plan import mini

U8, U32, S32, S64, VOID_P = 1, 2, 3, 4, 5
BASE = {
    U8: BaseType("unsigned char", 1, Encoding.UNSIGNED_CHAR),
    U32: BaseType("unsigned int", 4, Encoding.UNSIGNED),
    S32: BaseType("int", 4, Encoding.SIGNED),
    S64: BaseType("long long", 8, Encoding.SIGNED),
    VOID_P: PointerType(None, 8),
}


def graph(types: dict, members: tuple) -> TypeGraph:
    """A struct ``obj`` with ``members``, over the base types and ``types``."""
    all_types = {**BASE, **types}
    size = max((m.bit_offset // 8 + _size(all_types, m.type) for m in members), default=0)
    all_types[100] = CompositeType("struct", "obj", size, members)
    return TypeGraph(all_types, 100)


def _size(types, tid) -> int:
    return TypeGraph(types, tid).size_of(tid)


def by_name(built) -> dict:
    return {f.name: f for f in built.layout.fields}


def test_registry_finds_every_kind_module_and_no_type_twice():
    kinds = registry.kinds()
    names = {m.NAME for m in kinds.values()}
    assert names == {"spinlock", "socket_lock", "mutex", "refcount", "atomic",
                     "sk_buff_head", "lists", "ktime", "in6_addr"}
    for type_name, module in kinds.items():
        assert type_name in module.TYPES and callable(module.values)
    assert not set(kinds) & registry.WITHOUT_COLLECTOR


def test_spinlock_held_and_socket_lock_owned():
    # spinlock_t { unsigned int locked; unsigned int owner; }  socket_lock_t { spinlock_t
    # slock; int owned; }  at offset 8 of the object
    types = {10: CompositeType("struct", None, 8, (Member("locked", U32, 0),
                                                   Member("owner", U32, 32))),
             11: Typedef("spinlock_t", 10),
             12: CompositeType("struct", None, 12, (Member("slock", 11, 0),
                                                    Member("owned", S32, 64))),
             13: Typedef("socket_lock_t", 12)}
    g = graph(types, (Member("a", U32, 0), Member("lock", 11, 32), Member("sk_lock", 13, 128)))
    built = mini.build_mini(g, kinds=registry.claim)
    f = by_name(built)
    assert set(f) == {"a", "lock.held", "sk_lock.owned", "sk_lock.slock.held"}
    assert (f["lock.held"].ctype, f["lock.held"].kind) == ("u8", "bool")
    assert f["lock.held"].source.items() >= {"byte_offset": 4, "size": 4, "op": "nonzero",
                                                 "collector": "spinlock"}.items()
    assert f["sk_lock.owned"].source["byte_offset"] == 24 and f["sk_lock.owned"].ctype == "s32"
    assert f["sk_lock.slock.held"].source["byte_offset"] == 16
    raw = bytearray(28)
    assert mini.extract_field(bytes(raw), f["lock.held"]) == 0
    raw[5] = 1
    assert mini.extract_field(bytes(raw), f["lock.held"]) == 1
    assert [c.collector for c in built.collected] == ["spinlock", "socket_lock"]
    raw_mini = mini.build_mini(g)   # without the collectors: the internals, flattened
    assert {"lock.locked", "lock.owner", "sk_lock.slock.owner"} <= set(by_name(raw_mini))


def test_counters_lists_queue_mutex_and_ktime():
    types = {
        20: CompositeType("struct", None, 4, (Member("counter", S32, 0),)),
        21: Typedef("atomic_t", 20),
        22: CompositeType("struct", "refcount_struct", 4, (Member("refs", 21, 0),)),
        23: Typedef("refcount_t", 22),
        24: CompositeType("struct", None, 8, (Member("counter", S64, 0),)),
        25: Typedef("atomic64_t", 24),
        26: Typedef("atomic_long_t", 25),
        27: Typedef("ktime_t", S64),
        30: CompositeType("struct", "list_head", 16, (Member("next", VOID_P, 0),
                                                      Member("prev", VOID_P, 64))),
        31: CompositeType("struct", "hlist_node", 16, (Member("next", VOID_P, 0),
                                                       Member("pprev", VOID_P, 64))),
        32: CompositeType("struct", "sk_buff_head", 24, (
            Member("next", VOID_P, 0), Member("prev", VOID_P, 64), Member("qlen", U32, 128))),
        33: CompositeType("struct", "mutex", 24, (Member("owner", 26, 0),
                                                  Member("wait_list", 30, 64))),
    }
    g = graph(types, (Member("refcnt", 23, 0), Member("drops", 21, 32),
                      Member("cookie", 25, 64), Member("pages", 26, 128),
                      Member("stamp", 27, 192), Member("node", 30, 256),
                      Member("bind", 31, 384), Member("queue", 32, 512),
                      Member("mutex", 33, 704)))
    f = by_name(mini.build_mini(g, kinds=registry.claim))
    assert set(f) == {"refcnt", "drops", "cookie", "pages", "stamp", "node.empty",
                      "bind.unhashed", "queue.qlen", "mutex.locked"}
    assert [f[n].ctype for n in ("refcnt", "drops", "cookie", "pages", "stamp")] == \
        ["s32", "s32", "s64", "s64", "s64"]
    assert f["node.empty"].source.items() >= {"op": "is_own_address", "address_offset": 32}.items()
    assert f["bind.unhashed"].source.items() >= {"op": "zero", "byte_offset": 56}.items()
    assert f["queue.qlen"].source["byte_offset"] == 80 and f["queue.qlen"].kind == "uint"
    assert f["mutex.locked"].source["mask"] == (1 << 64) - 8
    address = 0x1000
    raw = bytearray(112)
    raw[32:40] = (address + 32).to_bytes(8, "little")          # node.next == &node
    raw[88:96] = (5).to_bytes(8, "little")                      # mutex owner: flags only
    assert mini.extract_field(bytes(raw), f["node.empty"], address) == 1
    assert mini.extract_field(bytes(raw), f["bind.unhashed"], address) == 1
    assert mini.extract_field(bytes(raw), f["mutex.locked"], address) == 0
    raw[88:96] = (0x1238).to_bytes(8, "little")
    assert mini.extract_field(bytes(raw), f["mutex.locked"], address) == 1


def test_in6_addr_is_one_address_shown_as_ipv6_text():
    # struct in6_addr { union { u8 u6_addr8[16]; __be16 u6_addr16[8]; __be32 u6_addr32[4]; }
    # in6_u; }: one 16-byte value, not three arrays
    from ctracer.debuginfo.typegraph import ArrayType
    from ctracer.event import Layout
    from ctracer.report.values import ValueFormatter

    types = {50: ArrayType(U8, (16,)), 51: ArrayType(U32, (4,)),
             52: CompositeType("union", None, 16, (Member("u6_addr8", 50, 0),
                                                   Member("u6_addr32", 51, 0))),
             53: CompositeType("struct", "in6_addr", 16, (Member("in6_u", 52, 0),))}
    g = graph(types, (Member("family", U32, 0), Member("daddr", 53, 64)))
    built = mini.build_mini(g, kinds=registry.claim)
    f = by_name(built)
    assert set(f) == {"family", "daddr"}
    assert (f["daddr"].ctype, f["daddr"].kind, f["daddr"].source["byte_offset"]) == \
        ("char[16]", "ipv6", 8)
    raw = bytearray(24)
    raw[8:24] = bytes(15) + b"\x01"
    assert mini.extract_field(bytes(raw), f["daddr"]) == "::1"
    raw[8:24] = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
    assert mini.extract_field(bytes(raw), f["daddr"]) == "::ffff:127.0.0.1"
    raw[8:24] = bytes.fromhex("fe800000000000000000000000000abc")
    assert mini.extract_field(bytes(raw), f["daddr"]) == "fe80::abc"
    # through the event layout: decode and encode agree, the report shows the text
    layout = built.layout
    record = encode(layout, {"family": 10, "daddr": "2001:db8::7"})
    assert layout.decode(record)["daddr"] == "2001:db8::7"
    assert ValueFormatter(Layout.from_json(layout.to_json())).show("daddr", "2001:db8::7") \
        == "2001:db8::7"


def test_unknown_complex_type_is_skipped_with_the_reason():
    types = {40: CompositeType("struct", None, 8, (Member("cnts", U32, 0),
                                                   Member("wait_lock", U32, 32))),
             41: Typedef("rwlock_t", 40),
             42: CompositeType("struct", None, 4, (Member("word", U32, 0),)),
             43: Typedef("spinlock_t", 42)}
    built = mini.build_mini(graph(types, (Member("cb_lock", 41, 0), Member("odd", 43, 64))),
                            kinds=registry.claim)
    reasons = {s.name: s.reason for s in built.skipped}
    assert reasons["cb_lock"].startswith("rwlock_t: no collector")
    assert reasons["odd"] == "spinlock_t: no 'locked' word in its layout"
    assert not built.layout.fields
    text = mini.render_built(built, explain=True)
    assert "/*   cb_lock: rwlock_t: no collector" in text


@pytest.fixture(scope="module")
def kernel():
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    from ctracer.debuginfo.btf import reader as btf
    return btf.open_btf(KERNEL_BTF)


@pytest.mark.kernel
def test_kernel_sock_records_values_not_lock_internals(kernel):
    g = kernel.find_struct("sock")
    raw = mini.build_mini(g)
    built = mini.build_mini(g, kinds=registry.claim)
    names = {f.name for f in built.layout.fields}
    assert {"sk_lock.owned", "sk_lock.slock.held", "__sk_common.skc_refcnt",
            "sk_receive_queue.qlen", "sk_write_queue.qlen", "sk_drops",
            "sk_wmem_alloc"} <= names
    assert not [n for n in names if "raw_lock" in n or n.endswith(".counter")]
    internals = [f.name for f in raw.layout.fields if "raw_lock" in f.name]
    assert len(internals) > 20          # what the collectors replace
    assert built.layout.size < raw.layout.size
    held = next(f for f in built.layout.fields if f.name == "sk_lock.slock.held")
    locked = next(f for f in raw.layout.fields
                  if f.name == "sk_lock.slock.rlock.raw_lock.locked")
    assert held.source["byte_offset"] == locked.source["byte_offset"]
    owned = next(f for f in raw.layout.fields if f.name == "sk_lock.owned")
    assert next(f for f in built.layout.fields
                if f.name == "sk_lock.owned").source["byte_offset"] == \
        owned.source["byte_offset"]
    refs = next(f for f in raw.layout.fields if f.name == "__sk_common.skc_refcnt.refs.counter")
    assert next(f for f in built.layout.fields
                if f.name == "__sk_common.skc_refcnt").source["byte_offset"] == \
        refs.source["byte_offset"]


@pytest.mark.kernel
def test_kernel_sk_buff_users_and_list(kernel):
    built = mini.build_mini(kernel.find_struct("sk_buff"), kinds=registry.claim)
    names = {f.name for f in built.layout.fields}
    assert {"users", "tstamp"} <= names


_TYPEDEFS = ("typedef unsigned char u8; typedef signed char s8; typedef unsigned short u16;\n"
             "typedef short s16; typedef unsigned int u32; typedef int s32;\n"
             "typedef unsigned long long u64; typedef long long s64;\n")


def _pahole_struct(obj, name: str, *flags) -> str:
    return subprocess.run(["pahole", *flags, "-C", name, str(obj)], check=True,
                          capture_output=True, text=True).stdout


@pytest.mark.parametrize("struct, cachelines", [("sock", ()), ("sk_buff", ()),
                                                ("sock", (1,)), ("sk_buff", (1,))])
@pytest.mark.kernel
def test_reorganize_against_pahole_on_the_kernel_minis(kernel, tmp_path, struct, cachelines):
    """The mini struct of the default selection (and of one cacheline), written in source
    order as plain C and compiled: ``pahole --reorganize`` of that very struct is never
    smaller than ours, and ours keeps every field, none overlapping."""
    if shutil.which("pahole") is None or shutil.which("gcc") is None:
        pytest.skip("pahole and gcc are needed (apt-get install pahole gcc)")
    g = kernel.find_struct(struct)
    plain = mini.build_mini(g, kinds=registry.claim, cachelines=cachelines,
                            reorganize_fields=False)
    ours = mini.build_mini(g, kinds=registry.claim, cachelines=cachelines)
    body = "".join(f"\tchar {f.c_name}{f.ctype[4:]};\n" if f.ctype.startswith("char[")
                   else f"\t{f.ctype} {f.c_name};\n" for f in plain.layout.ordered_fields)
    source = tmp_path / "mini.c"
    source.write_text(f"{_TYPEDEFS}struct {plain.layout.name} {{\n{body}}} v;\n")
    obj = tmp_path / "mini.o"
    subprocess.run(["gcc", "-g", "-c", "-o", str(obj), str(source)], check=True)
    size_in_order = int(re.search(r"size: (\d+)", _pahole_struct(obj, plain.layout.name))
                        .group(1))
    assert size_in_order == plain.layout.size == ours.unreorganized_size
    theirs = int(re.search(r"size: (\d+)", _pahole_struct(obj, plain.layout.name, "-R"))
                 .group(1))
    assert ours.layout.size <= theirs
    assert sorted(f.name for f in ours.layout.fields) == sorted(f.name for f in
                                                                plain.layout.fields)
    spans = sorted((f.offset, f.offset + f.size) for f in ours.layout.fields)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert ours.saved_bytes == plain.layout.size - ours.layout.size >= 0
