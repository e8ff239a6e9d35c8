"""Objects that are sometimes only their head: time-wait and request sockets as struct sock.

Tracepoints such as ``inet_sock_set_state`` or ``tcp_*`` may hand a ``struct sock *``
that points at a smaller object sharing only the first member of ``struct sock``:
``struct inet_timewait_sock`` and ``struct request_sock`` start with ``struct
sock_common`` too, and the kernel tells them apart by the state (``sk_fullsock()``:
``TCP_TIME_WAIT``, ``TCP_NEW_SYN_RECV``).  Read as a whole ``struct sock``, such an
object gives garbage past its head (a ``sk_receive_queue.qlen`` of 328204288).

A `HeadRule` says so as data: the struct, the shared member, the state field and the
names of the states that mean "only the head exists".  `resolve` turns it into a
`HeadRead` for one mini layout, from the debug info: the member's bytes, where the
state is, the states' values (looked up in the kernel's enum by name, never written
here) and the mini fields that lie inside the member.  The probe reads the head first,
and the rest of the object only when the state is not one of those
(`ctracer.probes.ctext.snapshot_function`); an event read only in part carries
`ctracer.event.FLAG_HEAD_ONLY`, and every reader of the trace shows the fields outside
the head as not read (the trace's meta ``head_read`` is `HeadRead.to_json`).  Nothing
traced marks where such an object ends, so its ``identity`` fields (the connection's
addresses and ports) tell a new one at a reused address apart, in the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ctracer.debuginfo.typegraph import CompositeType, TypeGraph
from ctracer.event import Layout
from ctracer.plan.displays import EnumSource
from ctracer.plan.mini import member_fields


@dataclass(frozen=True)
class HeadRule:
    """When an object of ``struct`` is only its head: the shared first member, the state
    field that tells, the states that mean so."""

    struct: str
    member: str               # the first member, shared with the smaller objects
    state: str                # dotted path of the field saying which object it is
    states: tuple[str, ...]   # enumerator names of the states where only the head exists
    why: str
    #: head fields that name one such object for its whole life (its connection's
    #: addresses and ports): another value at the same address is another object
    identity: tuple[str, ...] = ()


RULES = (
    HeadRule("sock", "__sk_common", "__sk_common.skc_state",
             ("TCP_TIME_WAIT", "TCP_NEW_SYN_RECV"),
             "time-wait and request sockets (struct inet_timewait_sock, struct "
             "request_sock) share only struct sock_common with struct sock: in states "
             "TCP_TIME_WAIT and TCP_NEW_SYN_RECV only __sk_common is read "
             "(the kernel's sk_fullsock())",
             identity=("__sk_common.skc_addrpair", "__sk_common.skc_portpair")),
)

#: why an identity change splits lifetimes, as the report says it
IDENTITY_RULE = ("a time-wait or request socket with other addresses or ports at the same "
                 "address is another socket (nothing traced marks its end)")


@dataclass(frozen=True)
class HeadRead:
    """A `HeadRule` placed in one object layout and one mini layout."""

    member: str
    start: int                         # the member's bytes [start, end) in the object
    end: int
    state_offset: int                  # the state's bytes in the object
    state_size: int
    states: tuple[tuple[int, str], ...]
    fields: tuple[str, ...]            # the mini fields read from inside the member
    why: str
    identity: tuple[str, ...] = ()     # the rule's identity fields the mini records

    def to_json(self) -> dict:
        """The head read as the trace's meta ``head_read`` stores it."""
        return {"member": self.member, "bytes": [self.start, self.end],
                "state_offset": self.state_offset, "state_size": self.state_size,
                "states": [list(s) for s in self.states], "fields": list(self.fields),
                "rule": self.why, "identity": list(self.identity),
                "identity_rule": IDENTITY_RULE if self.identity else ""}


def _member_bytes(graph: TypeGraph, name: str) -> Optional[tuple[int, int]]:
    root = graph[graph.strip(graph.root)]
    if not isinstance(root, CompositeType):
        return None
    for m in root.members:
        if m.name == name and not m.is_bitfield:
            size = graph.size_of(m.type)
            return (m.offset, m.offset + size) if size else None
    return None


def _state_bytes(graph: TypeGraph, path: str) -> Optional[tuple[int, int]]:
    """(byte offset, size) of the whole integer member at a dotted path, as the mini
    struct names it."""
    f = member_fields(graph, graph.root).get(path)
    if f is None or f.source.get("bit_size") or f.size not in (1, 2, 4):
        return None
    return int(f.source["byte_offset"]), f.size


def resolve(rule: HeadRule, graph: TypeGraph, layout: Layout,
            types: EnumSource) -> Optional[HeadRead]:
    """The rule for this struct and mini layout; None when the debug info lacks the
    member, the state field or the states' enum (then objects are read whole)."""
    member = _member_bytes(graph, rule.member)
    state = _state_bytes(graph, rule.state)
    found = types.find_enum(enumerator=rule.states[0]) if rule.states else None
    if member is None or state is None or found is None:
        return None
    values = dict(found.enumerators)
    if not all(s in values for s in rule.states):
        return None
    start, end = member
    if not (start <= state[0] and state[0] + state[1] <= end):
        return None
    inside = tuple(sorted(
        f.name for f in layout.fields
        if start <= int(f.source.get("byte_offset", -1))
        and int(f.source.get("byte_offset", 0)) + int(f.source.get("size", 0)) <= end))
    return HeadRead(rule.member, start, end, state[0], state[1],
                    tuple((int(values[s]), s) for s in rule.states), inside, rule.why,
                    tuple(f for f in rule.identity if f in inside))


def head_read_for(struct: str, graph: TypeGraph, layout: Layout,
                  types: EnumSource) -> Optional[HeadRead]:
    """The head read of ``struct`` for this mini layout (None: no rule, or the debug info
    lacks what the rule needs)."""
    for rule in RULES:
        if rule.struct == struct:
            found = resolve(rule, graph, layout, types)
            if found is not None:
                return found
    return None
