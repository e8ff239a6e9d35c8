"""Method discovery: every function and tracepoint through which a struct can be followed.

Works only on a `ctracer.debuginfo.catalog.Catalog` and its indexed lookups, so a cached catalog can
answer from disk.  For a target struct X, a *method* is one way a function reaches an
object of type X; a function reaching X in several ways (two parameters, a parameter and
its return value...) gives one `Method` per way, its *route*.  The route's kind
(`Method.route_kind`), in display order:

``direct``          a parameter of type ``struct X *`` (any position; const, volatile and
                    typedefs do not matter)
``double_pointer``  a parameter ``struct X **`` (the object is ``*param``)
``alias``           a parameter pointing to a struct that embeds X at offset 0, at any
                    depth (tcp_sock → inet_connection_sock → inet_sock → sock): the same
                    address is an X
``holder``          a parameter pointing to a struct with a member ``struct X *`` (or a
                    pointer to an alias of X): the object is ``param->member``; members of
                    anonymous structs/unions count; a struct starting with a holder is one
                    too (``socket_alloc->socket.sk``), and ``holder_depth`` levels of holders
                    embedded further in (``net->ipv4.fibnl``)
``returns``         the function returns ``struct X *`` (or an alias pointer): creation
                    points; the object is known at exit only
``tracepoint``      a tracepoint argument is a pointer to X, to an alias or to a holder

Each method carries the structured `path` from the argument to the object (a tuple of
`Step`), so probe generators never parse display text.  Parameters taking X by value are
not methods (the callee has a copy) but are counted in the notes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional, Sequence, Union

from ctracer.debuginfo.gcpause import collector_paused
from ctracer.debuginfo.catalog import (Catalog, FunctionInfo, Inline, Parameter, ShapeKind,
                                     StructInfo, TracepointInfo, TypeShape)

#: the ways a method reaches its object (`Method.route_kind`), in display order
ROUTE_KINDS = ("direct", "double_pointer", "alias", "holder", "returns", "tracepoint")
_ROUTE_KIND_ORDER = {k: i for i, k in enumerate(ROUTE_KINDS)}
#: how a probeable function can also be inlined into its callers (a note counts them)
_ALSO_INLINED = (Inline.INLINED, Inline.DECLARED_INLINED)


@dataclass(frozen=True)
class Step:
    """One step from an argument value (an address) to the object's address.

    ``op="deref"``: read the pointer stored at ``address + offset``;
    ``op="offset"``: add ``offset`` to the address (an embedded member).
    ``member`` names the step for display.
    """

    op: str
    offset: int
    member: str = ""

    def to_json(self) -> dict:
        return {"op": self.op, "offset": self.offset, "member": self.member}


@dataclass(frozen=True)
class Link:
    """A struct that embeds the next one (or the target) at offset 0 as ``member``."""

    kind: str
    name: str
    member: str

    @property
    def type_text(self) -> str:
        """``kind name`` of the struct crossed."""
        return f"{self.kind} {self.name}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "member": self.member}


class Method(NamedTuple):
    """One way a function (or tracepoint) reaches an object of the target struct.

    ``route_kind`` is one of `ROUTE_KINDS`; ``param_index`` counts from 0 (None for
    ``returns``); ``path``, ``alias_chain`` and ``holder`` are parts of the route:
    ``alias_chain`` lists, from the parameter's (or member's) type inward, the alias
    structs crossed to reach the target; ``holder`` is the member path for holders
    (``socket->sk``); ``route_form`` is the route without its parameter and
    ``route_text`` the whole route in words.  Immutable; a named tuple
    because a kernel struct has ten thousand methods and a frozen dataclass costs four
    times as much to make.
    """

    function: Union[FunctionInfo, TracepointInfo]
    route_kind: str
    target: str
    param_index: Optional[int]
    param_name: Optional[str]
    param_type: str
    path: tuple[Step, ...] = ()
    alias_chain: tuple[Link, ...] = ()
    holder: str = ""
    probeable: bool = True
    not_probeable: str = ""
    #: the route without its parameter (what counts group by): ``socket->sk``
    route_form: str = ""

    @property
    def is_tracepoint(self) -> bool:
        """Whether the method is a tracepoint."""
        return isinstance(self.function, TracepointInfo)

    @property
    def name(self) -> str:
        """The function's (or tracepoint's) name."""
        return self.function.name

    @property
    def key(self) -> str:
        """Unique name: statics carry their compile unit, tracepoints a ``tp:`` prefix."""
        return self.function.key

    @property
    def route_text(self) -> str:
        """The route in words, e.g. ``socket->sk (param 1 sock)``."""
        index = self.param_index
        if index is None:
            return f"{self.route_form} (return value)"
        if self.param_name:
            return f"{self.route_form} (param {index + 1} {self.param_name})"
        return f"{self.route_form} (param {index + 1})"

    def to_json(self) -> dict:
        """The method as ``ctracer functions --json`` prints it."""
        f = self.function
        out = {
            "function": f.name, "key": self.key, "reach": self.route_kind,
            "tracepoint": self.is_tracepoint, "target": self.target,
            "param_index": self.param_index, "param_name": self.param_name,
            "param_type": self.param_type, "route": self.route_form, "via": self.route_text,
            "path": [s.to_json() for s in self.path],
            "alias_chain": [link.to_json() for link in self.alias_chain],
            "holder": self.holder or None,
            "probeable": self.probeable, "not_probeable": self.not_probeable or None,
        }
        if isinstance(f, FunctionInfo):
            out.update(unit=f.unit or None, external=f.external, address=f.address,
                       inline=f.inline.value, decl_file=f.decl_file, decl_line=f.decl_line)
        return out


@dataclass(frozen=True)
class Discovery:
    """Everything `discover` found for one target struct."""

    kind: ShapeKind
    name: str
    struct: Optional[StructInfo]
    methods: tuple[Method, ...]
    aliases: tuple[tuple[Link, ...], ...]
    holders: tuple[str, ...]
    by_value: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def target(self) -> str:
        """``struct NAME`` (or ``union NAME``)."""
        return f"{self.kind.value} {self.name}"

    def counts_by_route_kind(self) -> dict[str, int]:
        """Methods per route kind."""
        c = Counter(m.route_kind for m in self.methods)
        return {k: c[k] for k in ROUTE_KINDS if c[k]}

    def counts_by_route(self) -> list[tuple[str, str, int]]:
        """(route kind, route form, number of methods), in display order."""
        c = Counter((m.route_kind, m.route_form) for m in self.methods)
        return [(k, r, n) for (k, r), n in sorted(
            c.items(), key=lambda i: (_ROUTE_KIND_ORDER[i[0][0]], -i[1], i[0][1]))]

    def functions(self) -> list[str]:
        """Distinct function keys (not tracepoints), sorted."""
        return sorted(self._function_keys())

    def function_count(self) -> int:
        """How many functions (not tracepoints) the methods belong to."""
        return len(self._function_keys())

    def _function_keys(self) -> set[str]:
        return {m.function.key for m in self.methods
                if not isinstance(m.function, TracepointInfo)}


# ---------------------------------------------------------------- the search


class _Target(NamedTuple):
    """A type whose pointer is a pointer to the target: the target or one of its aliases.
    (This and `_Holder` are named tuples: a frozen dataclass costs 3M instructions of
    start-up to define, a named tuple a fifth of that.)"""

    kind: ShapeKind
    name: str
    alias_chain: tuple[Link, ...]


class _Holder(NamedTuple):
    """A struct from whose address ``path`` leads to a target (display: ``text``)."""

    kind: ShapeKind
    name: str
    text: str
    path: tuple[Step, ...]
    alias_chain: tuple[Link, ...]


class _Way(NamedTuple):
    """One way found from a function's parameter (or return value) to a target object,
    before the route kinds wanted are filtered and routes spelled (a named tuple: a kernel
    struct has tens of thousands, and a frozen dataclass costs 4x as much to make)."""

    function: Union[FunctionInfo, TracepointInfo]
    route_kind: str
    param_index: Optional[int]
    param: Optional[Parameter]
    path: tuple[Step, ...] = ()
    alias_chain: tuple[Link, ...] = ()
    holder: str = ""


def route_form(route_kind: str, target: str, alias_chain: Sequence[Link], holder: str) -> str:
    """``struct sock ← struct inet_sock``, ``socket->sk``, ``*(struct sock **)``..."""
    alias = " ← ".join([target] + [link.type_text for link in reversed(alias_chain)])
    if holder:
        return f"{holder} ({alias})" if alias_chain else holder
    if route_kind == "double_pointer":
        return f"*({alias} **)"
    if route_kind == "returns":
        return f"returns {alias} *"
    return alias


def _display_member(flat_name: str) -> str:
    """A flattened member name without its empty anonymous steps (``.sk`` → ``sk``)."""
    return ".".join(p for p in flat_name.split(".") if p)


def find_aliases(catalog: Catalog, kind: ShapeKind, name: str) -> list[_Target]:
    """The target and every struct embedding it (recursively) at offset 0."""
    found = [_Target(kind, name, ())]
    seen = {(kind, name)}
    queue = [found[0]]
    while queue:
        inner = queue.pop(0)
        for s in sorted(catalog.structs_with_member_of(inner.kind, inner.name),
                        key=lambda s: (s.kind.value, s.name)):
            if not s.name or (s.kind, s.name) in seen:
                continue
            for m in s.members:
                if (m.bit_offset == 0 and m.shape.pointers == 0
                        and m.shape.kind == inner.kind and m.shape.name == inner.name):
                    link = Link(s.kind.value, s.name, _display_member(m.name))
                    alias = _Target(s.kind, s.name, (link,) + inner.alias_chain)
                    seen.add((s.kind, s.name))
                    found.append(alias)
                    queue.append(alias)
                    break
    return found


def find_holders(catalog: Catalog, targets: Sequence[_Target], depth: int = 0) -> list[_Holder]:
    """Structs with a member pointing to a target, and structs embedding those by value.

    A struct embedding a holder at offset 0 is the holder's alias (``socket_alloc``
    starts with a ``socket``) and is always followed, recursively; embedding at another
    offset (``net`` holds a ``netns_ipv4`` holding sockets) is followed ``depth`` levels.
    The target and its aliases are not holders of themselves (a ``next`` pointer leads
    to another object).
    """
    own = {(t.kind, t.name) for t in targets}
    holders: dict[tuple[ShapeKind, str, str], _Holder] = {}
    queue: list[tuple[_Holder, int]] = []

    def add(h: _Holder, level: int) -> None:
        if (h.kind, h.name, h.text) not in holders:
            holders[(h.kind, h.name, h.text)] = h
            queue.append((h, level))

    for t in targets:
        for s in catalog.structs_with_member_of(t.kind, t.name):
            if not s.name or (s.kind, s.name) in own:
                continue
            for m in s.members:
                if m.shape.pointers == 1 and m.shape.kind == t.kind and m.shape.name == t.name:
                    member = _display_member(m.name)
                    add(_Holder(s.kind, s.name, f"{s.name}->{member}",
                                (Step("deref", m.bit_offset // 8, member),), t.alias_chain), 0)
    while queue:
        h, level = queue.pop(0)
        for s in catalog.structs_with_member_of(h.kind, h.name):
            if not s.name or (s.kind, s.name) in own:
                continue
            for m in s.members:
                if (m.shape.pointers or m.shape.kind != h.kind or m.shape.name != h.name
                        or m.bit_offset % 8):
                    continue
                nested = level + (1 if m.bit_offset else 0)
                if nested > depth:
                    continue
                member = _display_member(m.name)
                first = h.path[0]
                path = (Step("deref", first.offset + m.bit_offset // 8,
                             f"{member}.{first.member}"),) + h.path[1:]
                inner = h.text.split("->", 1)[1]
                add(_Holder(s.kind, s.name, f"{s.name}->{member}.{inner}", path, h.alias_chain),
                    nested)
    return sorted(holders.values(), key=lambda h: (h.name, h.text))


def _is(shape: TypeShape, kind: ShapeKind, name: str, pointers: int) -> bool:
    return shape.kind == kind and shape.name == name and shape.pointers == pointers


def _probeable(f: Union[FunctionInfo, TracepointInfo], addresses_known: bool) -> tuple[bool, str]:
    if isinstance(f, TracepointInfo):
        return True, ""
    if f.inlined_only:
        return False, "inline only: no out-of-line copy"
    if f.address is None and addresses_known:
        return False, "no address: declaration only"
    return True, ""


def discover(catalog: Catalog, name: str, kind: ShapeKind = ShapeKind.STRUCT, *,
             route_kinds: Optional[Iterable[str]] = None, holder_depth: int = 0,
             addresses_known: Optional[bool] = None) -> Discovery:
    """All methods of ``kind name`` in the catalog (see the module docstring).

    ``route_kinds`` limits the search to some of `ROUTE_KINDS`; ``addresses_known`` says whether
    a function without an address is a declaration (DWARF) or just unaddressed (BTF); by
    default it is true when any function examined has an address.
    """
    wanted = set(route_kinds) if route_kinds is not None else set(ROUTE_KINDS)
    unknown = wanted - set(ROUTE_KINDS)
    if unknown:
        raise ValueError(f"unknown route kinds {sorted(unknown)}")
    # tens of thousands of objects, all kept: collections would find nothing to free
    with collector_paused():
        return _discover(catalog, name, kind, wanted, holder_depth, addresses_known)


def _discover(catalog: Catalog, name: str, kind: ShapeKind, wanted: set[str],
              holder_depth: int, addresses_known: Optional[bool]) -> Discovery:
    targets = find_aliases(catalog, kind, name)
    by_value: set[str] = set()
    found = _direct_ways(catalog, targets, wanted, by_value)
    holders: list[_Holder] = []
    if wanted & {"holder", "tracepoint"}:
        holders = find_holders(catalog, targets, holder_depth)
        found += _holder_ways(catalog, holders, wanted)
    if addresses_known is None:
        addresses_known = any(isinstance(w.function, FunctionInfo)
                              and w.function.address is not None for w in found)
    methods = _methods(found, wanted, f"{kind.value} {name}", addresses_known)
    notes = _notes(methods, by_value, catalog, targets, holders)
    return Discovery(kind, name, catalog.struct(name, kind), tuple(methods),
                     tuple(t.alias_chain for t in targets[1:]),
                     tuple(h.text for h in holders), tuple(sorted(by_value)), tuple(notes))


def _direct_ways(catalog: Catalog, targets: Sequence[_Target], wanted: set[str],
                 by_value: set[str]) -> list[_Way]:
    """Parameters and return values typed as a pointer to a target (or to a pointer to
    one), and tracepoint arguments pointing to one; functions taking a target by value
    are added to ``by_value``."""
    found: list[_Way] = []
    deref = (Step("deref", 0, "*"),)
    for t in targets:
        kind, name, chain = t.kind, t.name, t.alias_chain
        pointer_kind = "alias" if chain else "direct"
        for f in catalog.functions_referencing(kind, name):
            for i, p in enumerate(f.params):
                shape = p.shape
                if shape.name != name or shape.kind != kind:  # (_is, spelled out: hot)
                    continue
                if shape.pointers == 1:
                    found.append(_Way(f, pointer_kind, i, p, (), chain))
                elif shape.pointers == 2:
                    found.append(_Way(f, "double_pointer", i, p, deref, chain))
                elif shape.pointers == 0 and not chain:
                    by_value.add(f.key)
            if _is(f.returns, kind, name, 1):
                found.append(_Way(f, "returns", None, None, (), chain))
        if "tracepoint" in wanted:
            for tp in catalog.tracepoints_referencing(t.kind, t.name):
                for i, p in enumerate(tp.params):
                    if _is(p.shape, t.kind, t.name, 1):
                        found.append(_Way(tp, "tracepoint", i, p, (), t.alias_chain))
    return found


def _holder_ways(catalog: Catalog, holders: Sequence[_Holder], wanted: set[str]) -> list[_Way]:
    """Parameters (of functions and tracepoints) pointing to a holder struct."""
    by_struct: dict[tuple[ShapeKind, str], list[_Holder]] = {}
    for h in holders:
        by_struct.setdefault((h.kind, h.name), []).append(h)
    found: list[_Way] = []
    for (hkind, hname), paths in by_struct.items():
        users: list = []
        if "holder" in wanted:
            users += [(f, "holder") for f in catalog.functions_referencing(hkind, hname)]
        if "tracepoint" in wanted:
            users += [(tp, "tracepoint") for tp in catalog.tracepoints_referencing(hkind, hname)]
        for f, route_kind in users:
            for i, p in enumerate(f.params):
                shape = p.shape
                if shape.pointers == 1 and shape.name == hname and shape.kind == hkind:
                    for h in paths:
                        found.append(_Way(f, route_kind, i, p, h.path, h.alias_chain, h.text))
    return found


def _methods(found: Sequence[_Way], wanted: set[str], target_text: str,
             addresses_known: bool) -> list[Method]:
    """The wanted ways as methods, one per (function, parameter, route form), display-ordered."""
    keyed = {}
    # route forms by (route kind, alias chain, holder); the chain by identity: the ways share
    # their targets' chains, and hashing a tuple of dataclasses costs a call per link
    forms: dict = {}
    probe_states: dict = {}  # id(function) → (probeable, why not)
    for w in found:
        route_kind = w.route_kind
        if route_kind not in wanted:
            continue
        f = w.function
        key = f.key
        chain = w.alias_chain
        form = forms.get((route_kind, id(chain), w.holder))
        if form is None:
            form = forms[(route_kind, id(chain), w.holder)] = route_form(
                route_kind, target_text, chain, w.holder)
        index = w.param_index
        order = (_ROUTE_KIND_ORDER[route_kind], f.name, key, -1 if index is None else index, form)
        if order in keyed:
            continue
        state = probe_states.get(id(f))
        if state is None:
            state = probe_states[id(f)] = _probeable(f, addresses_known)
        p = w.param
        keyed[order] = Method(f, route_kind, target_text, index, p.name if p else None,
                              (p.shape.text if p else f.returns.text) or "", w.path,
                              chain, w.holder, state[0], state[1], form)
    return [keyed[o] for o in sorted(keyed)]


def _notes(methods: Sequence[Method], by_value: set[str], catalog: Catalog,
           targets: Sequence[_Target], holders: Sequence[_Holder]) -> list[str]:
    notes = []
    # (attributes read directly rather than through Method's properties: ten thousand
    # methods for a kernel struct)
    functions = {m.function.key: m for m in methods
                 if not isinstance(m.function, TracepointInfo)}
    not_probeable = Counter([m.not_probeable for m in functions.values() if not m.probeable])
    for why, n in sorted(not_probeable.items()):
        notes.append(f"{n} function{'s' if n != 1 else ''} not probeable: {why}")
    partly = sum(1 for m in functions.values()
                 if m.probeable and isinstance(m.function, FunctionInfo)
                 and m.function.address is not None and m.function.inline in _ALSO_INLINED)
    if partly:
        notes.append(f"{partly} probeable function{'s are' if partly != 1 else ' is'} also "
                     "inlined into callers: probes see only the out-of-line calls")
    names = Counter([m.function.name for m in functions.values()])
    same = sorted(n for n, c in names.items() if c > 1)
    if same:
        notes.append(f"{len(same)} static function name{'s' if len(same) != 1 else ''} "
                     f"defined in several compile units, kept apart: {', '.join(same[:5])}"
                     + (" ..." if len(same) > 5 else ""))
    if by_value:
        notes.append(f"{len(by_value)} function{'s take' if len(by_value) != 1 else ' takes'} "
                     "the struct by value (a copy: not methods)")
    if len(targets) > 1:
        n = len(targets) - 1
        notes.append(f"{n} alias struct{'s embed' if n != 1 else ' embeds'} the target at offset 0")
    if holders:
        n = len(holders)
        notes.append(f"{n} holder member path{'s point' if n != 1 else ' points'} to the target")
    notes.extend(f"type source: {n}" for n in catalog.notes)
    return notes
