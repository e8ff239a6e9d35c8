"""Method discovery on hand-built catalogs: each reach kind, alias chains, holder paths,
probeability and ordering, without any debug info reader involved."""

import pytest

from ctracer.plan.discovery import ROUTE_KINDS, Step, discover
from ctracer.debuginfo.catalog import (FunctionInfo, Inline, MemberInfo, MemoryCatalog, Parameter,
                           ShapeKind, StructInfo, TracepointInfo, TypeShape)

STRUCT = ShapeKind.STRUCT
INT = TypeShape(ShapeKind.BASE, "int", 0, text="int")
VOID = TypeShape(ShapeKind.VOID, None, 0, text="void")


def ptr(name, pointers=1, kind=STRUCT, text=None, const=False):
    return TypeShape(kind, name, pointers, const,
                     text or f"{kind.value} {name} {'*' * pointers}".strip())


def fn(name, *params, returns=VOID, address=0x1000, **kw):
    return FunctionInfo(name, tuple(Parameter(n, s) for n, s in params), returns,
                        address=address, **kw)


def member(name, shape, byte_offset):
    return MemberInfo(name, shape, byte_offset * 8)


STRUCTS = [
    StructInfo(STRUCT, "sock_common", 16, (member("skc_state", INT, 0),)),
    StructInfo(STRUCT, "sock", 64, (member("__sk_common", ptr("sock_common", 0), 0),
                                    member("sk_next", ptr("sock"), 16))),
    StructInfo(STRUCT, "inet_sock", 72, (member("sk", ptr("sock", 0), 0),
                                         member("inet_sport", INT, 64))),
    StructInfo(STRUCT, "inet_connection_sock", 80, (member("icsk_inet", ptr("inet_sock", 0), 0),)),
    StructInfo(STRUCT, "tcp_sock", 88, (member("inet_conn", ptr("inet_connection_sock", 0), 0),)),
    StructInfo(STRUCT, "sock_wrapper", 72, (member("tag", INT, 0), member("sk", ptr("sock", 0), 8))),
    StructInfo(STRUCT, "socket", 24, (member("state", INT, 0), member("sk", ptr("sock"), 16))),
    StructInfo(STRUCT, "socket_alloc", 32, (member("socket", ptr("socket", 0), 0),)),
    StructInfo(STRUCT, "sk_buff", 24, (member("next", ptr("sk_buff"), 0),
                                       member(".sk", ptr("sock"), 8))),
    StructInfo(STRUCT, "conn_slot", 16, (member("tp", ptr("tcp_sock"), 8),)),
    StructInfo(STRUCT, "netns", 64, (member("count", INT, 0), member("slot", ptr("socket", 0), 8))),
]

FUNCTIONS = [
    fn("sock_state", ("sk", ptr("sock", text="const struct sock *", const=True))),
    fn("sock_set_state", ("sk", ptr("sock", text="sock_ptr")), ("state", INT)),
    fn("sk_cmp", ("a", ptr("sock")), ("unused", INT), ("b", ptr("sock")), returns=INT),
    fn("sk_pop", ("skp", ptr("sock", 2))),
    fn("sk_copy_value", ("s", ptr("sock", 0))),
    fn("sk_alloc", ("family", INT), returns=ptr("sock")),
    fn("inet_alloc", ("family", INT), returns=ptr("inet_sock")),
    fn("inet_bind", ("inet", ptr("inet_sock")), ("port", INT)),
    fn("tcp_connect", ("tp", ptr("tcp_sock"))),
    fn("sock_init_data", ("sock", ptr("socket")), ("sk", ptr("sock"))),
    fn("sock_alloc_inode", ("ei", ptr("socket_alloc"))),
    fn("skb_owner_len", ("skb", ptr("sk_buff", const=True))),
    fn("slot_rto", ("slot", ptr("conn_slot"))),
    fn("wrapper_tag", ("w", ptr("sock_wrapper"))),
    fn("netns_count", ("ns", ptr("netns"))),
    fn("sk_helper", ("sk", ptr("sock")), unit="a.c", external=False, address=0x2000),
    fn("sk_helper", ("sk", ptr("sock")), unit="b.c", external=False, address=0x3000),
    fn("sk_is_ready", ("sk", ptr("sock")), unit="a.c", external=False, address=None,
       inline=Inline.DECLARED_INLINED, inlined_only=True),
    fn("sk_hot", ("sk", ptr("sock")), inline=Inline.DECLARED_INLINED, address=0x4000),
]

TRACEPOINTS = [
    TracepointInfo("inet_sock_set_state", (Parameter("sk", ptr("sock", const=True)),
                                           Parameter("oldstate", INT))),
    TracepointInfo("kfree_skb", (Parameter("skb", ptr("sk_buff")), Parameter("location", INT))),
    TracepointInfo("sched_switch", (Parameter("preempt", INT),)),
]


@pytest.fixture(scope="module")
def found():
    return discover(MemoryCatalog(FUNCTIONS, STRUCTS, TRACEPOINTS, notes=["reader note"]), "sock")


def rows(found, kind):
    return sorted((m.key, m.param_index, m.route_form) for m in found.methods if m.route_kind == kind)


def test_direct_parameters_at_any_position_with_qualifiers_and_typedefs(found):
    assert rows(found, "direct") == [
        ("sk_cmp", 0, "struct sock"), ("sk_cmp", 2, "struct sock"),
        ("sk_helper@a.c", 0, "struct sock"), ("sk_helper@b.c", 0, "struct sock"),
        ("sk_hot", 0, "struct sock"), ("sk_is_ready@a.c", 0, "struct sock"),
        ("sock_init_data", 1, "struct sock"),
        ("sock_set_state", 0, "struct sock"), ("sock_state", 0, "struct sock")]


def test_double_pointer_is_its_own_kind_with_a_deref(found):
    [m] = [m for m in found.methods if m.route_kind == "double_pointer"]
    assert (m.name, m.param_index, m.path) == ("sk_pop", 0, (Step("deref", 0, "*"),))


def test_aliases_are_recursive_and_record_the_chain(found):
    alias = {m.name: m for m in found.methods if m.route_kind == "alias"}
    assert sorted(alias) == ["inet_bind", "tcp_connect"]
    assert [(link.name, link.member) for link in alias["tcp_connect"].alias_chain] == [
        ("tcp_sock", "inet_conn"), ("inet_connection_sock", "icsk_inet"), ("inet_sock", "sk")]
    assert alias["tcp_connect"].path == ()
    assert alias["tcp_connect"].route_form == ("struct sock ← struct inet_sock ← "
                                          "struct inet_connection_sock ← struct tcp_sock")
    # a struct holding sock at a non-zero offset is not an alias
    assert not any(m.name == "wrapper_tag" for m in found.methods)


def test_holders_carry_member_path_and_offsets(found):
    holders = {(m.name, m.holder): m for m in found.methods if m.route_kind == "holder"}
    assert sorted(holders) == [("skb_owner_len", "sk_buff->sk"),
                               ("slot_rto", "conn_slot->tp"),
                               ("sock_alloc_inode", "socket_alloc->socket.sk"),
                               ("sock_init_data", "socket->sk")]
    assert holders[("sock_init_data", "socket->sk")].path == (Step("deref", 16, "sk"),)
    assert holders[("skb_owner_len", "sk_buff->sk")].path == (Step("deref", 8, "sk"),)
    assert holders[("sock_alloc_inode", "socket_alloc->socket.sk")].path == (
        Step("deref", 16, "socket.sk"),)
    slot = holders[("slot_rto", "conn_slot->tp")]
    assert slot.alias_chain[0].name == "tcp_sock" and slot.path == (Step("deref", 8, "tp"),)
    # the target's own pointer to another sock does not make sock a holder
    assert "sock->sk_next" not in found.holders


def test_holder_depth_follows_non_zero_embedding():
    catalog = MemoryCatalog(FUNCTIONS, STRUCTS, TRACEPOINTS)
    assert not any(m.name == "netns_count" for m in discover(catalog, "sock").methods)
    deep = discover(catalog, "sock", holder_depth=1)
    [m] = [m for m in deep.methods if m.name == "netns_count"]
    assert m.holder == "netns->slot.sk" and m.path == (Step("deref", 24, "slot.sk"),)


def test_returns_are_creation_points(found):
    assert rows(found, "returns") == [
        ("inet_alloc", None, "returns struct sock ← struct inet_sock *"),
        ("sk_alloc", None, "returns struct sock *")]


def test_tracepoints_directly_and_through_holders(found):
    assert rows(found, "tracepoint") == [("tp:inet_sock_set_state", 0, "struct sock"),
                                         ("tp:kfree_skb", 0, "sk_buff->sk")]


def test_probeable_and_notes(found):
    by_key = {m.key: m for m in found.methods}
    assert not by_key["sk_is_ready@a.c"].probeable
    assert "inline" in by_key["sk_is_ready@a.c"].not_probeable
    assert by_key["sk_hot"].probeable
    notes = "\n".join(found.notes)
    assert "1 function not probeable: inline only" in notes
    assert "1 probeable function is also inlined" in notes
    assert "sk_helper" in notes and "1 function takes the struct by value" in notes
    assert "reader note" in notes
    assert found.by_value == ("sk_copy_value",)


def test_without_addresses_functions_stay_probeable():
    catalog = MemoryCatalog([fn("f", ("sk", ptr("sock")), address=None)], STRUCTS)
    [m] = discover(catalog, "sock").methods
    assert m.probeable
    [m] = discover(catalog, "sock", addresses_known=True).methods
    assert not m.probeable and "no address" in m.not_probeable


def test_order_is_deterministic_and_by_kind(found):
    again = discover(MemoryCatalog(list(reversed(FUNCTIONS)), list(reversed(STRUCTS)),
                                   list(reversed(TRACEPOINTS))), "sock")
    assert [m.to_json() for m in again.methods] == [m.to_json() for m in found.methods]
    order = [ROUTE_KINDS.index(m.route_kind) for m in found.methods]
    assert order == sorted(order)


def test_kinds_filter_and_counts(found):
    only = discover(MemoryCatalog(FUNCTIONS, STRUCTS, TRACEPOINTS), "sock",
                    route_kinds=["holder", "tracepoint"])
    assert {m.route_kind for m in only.methods} == {"holder", "tracepoint"}
    counts = found.counts_by_route_kind()
    assert sum(counts.values()) == len(found.methods)
    assert counts["direct"] == 9
    assert sum(n for _, _, n in found.counts_by_route()) == len(found.methods)
    with pytest.raises(ValueError):
        discover(MemoryCatalog([], []), "sock", route_kinds=["nope"])


def test_union_target_and_aliases_of_other_structs():
    u = StructInfo(ShapeKind.UNION, "addr", 16, (member("v4", INT, 0),))
    catalog = MemoryCatalog([fn("f", ("a", ptr("addr", kind=ShapeKind.UNION))),
                             fn("g", ("a", ptr("addr")))], [u])
    found = discover(catalog, "addr", ShapeKind.UNION)
    assert [(m.name, m.route_kind, m.target) for m in found.methods] == [("f", "direct", "union addr")]


def test_json_rows_are_plain_data(found):
    import json
    text = json.dumps([m.to_json() for m in found.methods])
    rows = json.loads(text)
    holder = next(r for r in rows if r["holder"] == "socket->sk")
    assert holder["path"] == [{"op": "deref", "offset": 16, "member": "sk"}]
    assert holder["param_index"] == 0 and holder["param_name"] == "sock"
