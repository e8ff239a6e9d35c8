"""How a kernel struct's fields are shown, from the kernel's own enums: display hints.

Some members hold values an enum names although their C type is a plain integer:
``skc_state`` is a ``volatile unsigned char`` holding a TCP state (the kernel's
anonymous enum of ``TCP_ESTABLISHED``...), ``skc_flags`` (``sk_flags``) is an
``unsigned long`` whose bits ``enum sock_flags`` numbers.  A `DisplayHint` says so, as
data: which field, and the enum (by its name, or by one enumerator it declares, for
anonymous enums).  `annotate` looks each enum up in the debug info being traced and
writes what it found into the mini layout, which the trace file carries:

* ``how="enum"``: the field becomes kind ``"enum"`` with the enum's enumerators (every
  page, plot and ``--tail`` line then shows ``TCP_ESTABLISHED``; exports keep the
  number);
* ``how="bits"``: ``Field.source["bits"]`` lists ``[bit, name]`` pairs
  (`ctracer.report.values` shows ``SOCK_DEAD|SOCK_DONE (0x3)``).

A hint names its field by path in one struct, or, with ``struct=""``, by the C type the
member is declared with, in every struct (`TYPE_HINTS`: ``netdev_features_t``, the
device feature word of ``sk_route_caps`` and ``net_device.features``, whose bits the
kernel's anonymous ``NETIF_F_*_BIT`` enum numbers; the ``_BIT`` suffix is dropped, so a
bit reads ``NETIF_F_SG`` as the kernel's macros name its mask).  A bit word shows one
name per bit: the enumerator with the suffix where aliases share the value
(``NETIF_F_GSO_SHIFT`` is ``NETIF_F_TSO_BIT``'s), else the first in the enum's order.

Each annotated field also gets ``source["display_hint"]``: the hint's reason and the
enum it came from.  A hint whose field is not recorded, or whose enum the debug info
does not have, changes nothing: no value is ever pasted here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Protocol

from ctracer.debuginfo.typegraph import EnumType
from ctracer.event import Field, Layout


class EnumSource(Protocol):
    """What `annotate` needs of a type model (`ctracer.debuginfo.btf.reader.BtfModel`)."""

    def find_enum(self, name: Optional[str] = None,
                  enumerator: Optional[str] = None) -> Optional[EnumType]: ...


@dataclass(frozen=True)
class DisplayHint:
    """How to show a field's raw value: as the name of an enum's enumerator, or as the
    names of its bits."""

    struct: str                       # "" with ``ctype``: a member of that type anywhere
    field: str                        # the mini field's dotted path ("" with ``ctype``)
    how: str                          # "enum" or "bits"
    enum: Optional[str] = None        # C's enum name ...
    enumerator: Optional[str] = None  # ... or an enumerator of an anonymous enum
    why: str = ""
    ctype: str = ""                   # the member's C type as declared (a typedef)
    suffix: str = ""                  # what the enumerators add to the names shown

    def __post_init__(self) -> None:
        if self.how not in ("enum", "bits"):
            raise ValueError(f"unknown display hint {self.how!r}")
        if (self.enum is None) == (self.enumerator is None):
            raise ValueError("a display hint names its enum or one of its enumerators")

    @property
    def enum_text(self) -> str:
        """The enum in words: ``enum NAME``, or ``the enum of ENUMERATOR`` for an anonymous one."""
        return f"enum {self.enum}" if self.enum else f"the enum of {self.enumerator}"


HINTS = (
    DisplayHint("sock", "__sk_common.skc_state", "enum", enumerator="TCP_ESTABLISHED",
                why="skc_state holds a TCP state (include/net/tcp_states.h)"),
    DisplayHint("sock", "__sk_common.skc_flags", "bits", enum="sock_flags",
                why="sk_flags: sock_flag() tests the bits enum sock_flags numbers"),
    DisplayHint("sock", "sk_type", "enum", enum="sock_type",
                why="sk_type holds a socket type (SOCK_STREAM...)"),
    DisplayHint("sock", "sk_protocol", "enum", enumerator="IPPROTO_TCP",
                why="sk_protocol holds an IP protocol number"),
    DisplayHint("sock", "sk_tsq_flags", "bits", enum="tsq_enum",
                why="sk_tsq_flags: the TCP small queues bits enum tsq_enum numbers"),
)

#: members known by their C type, in any struct
TYPE_HINTS = (
    DisplayHint("", "", "bits", enumerator="NETIF_F_SG_BIT", ctype="netdev_features_t",
                suffix="_BIT",
                why="netdev_features_t: the device feature bits the kernel's "
                    "NETIF_F_*_BIT enum numbers (include/linux/netdev_features.h)"),
)


#: tracepoint arguments a plain integer type hides an enum of: by argument name, the
#: enumerator declaring it (``tcp_cong_state_set``'s ``ca_state`` is a u8)
ARGUMENT_HINTS = {"ca_state": "TCP_CA_Open"}


def annotate_arguments(arguments: dict, types: EnumSource) -> dict:
    """The trace's ``tracepoint_args`` (row → argument dicts) with ``names`` (``[[value,
    name], ...]``) added to every argument whose enum the debug info has: by its C enum
    (``enum skb_drop_reason reason``) or by `ARGUMENT_HINTS`."""
    found: dict = {}

    def names_of(enum: Optional[str], enumerator: Optional[str]):
        key = (enum, enumerator)
        if key not in found:
            t = types.find_enum(enum, enumerator)
            found[key] = ([[int(v), str(n)] for n, v in t.enumerators]
                          if t is not None and t.enumerators else None)
        return found[key]

    out = {}
    for row, args in arguments.items():
        out[row] = []
        for a in args:
            names = None
            if a.get("kind") == "enum" and a.get("enum"):
                names = names_of(a["enum"], None)
            elif a.get("kind") in ("int", "uint") and a.get("name") in ARGUMENT_HINTS:
                names = names_of(None, ARGUMENT_HINTS[a["name"]])
            out[row].append({**a, "names": names} if names else a)
    return out


def hints_for(struct: str) -> tuple[DisplayHint, ...]:
    """The display hints of ``struct``'s fields."""
    return tuple(h for h in HINTS if h.struct == struct)


def bit_names(enumerators, width: int, suffix: str = "") -> list[list]:
    """``[[bit, name], ...]``: one name per bit below ``width`` (the enumerator carrying
    ``suffix``, the suffix dropped, where aliases share a value; else the first)."""
    chosen: dict[int, str] = {}
    for name, value in enumerators:
        v, n = int(value), str(name)
        if not 0 <= v < width:
            continue
        if suffix and n.endswith(suffix) and len(n) > len(suffix):
            if v not in chosen or not chosen[v][1]:
                chosen[v] = (n[:-len(suffix)], True)
        elif v not in chosen:
            chosen[v] = (n, False)
    return [[v, chosen[v][0]] for v in sorted(chosen)]


def _apply(f: Field, hint: DisplayHint, found: EnumType) -> Field:
    source = dict(f.source)
    source["display_hint"] = {"enum": hint.enum_text, "rule": hint.why}
    if hint.how == "bits":
        source["bits"] = bit_names(found.enumerators, f.size * 8, hint.suffix)
        return dataclasses.replace(f, source=source)
    pairs = tuple(sorted((int(v), str(n)) for n, v in found.enumerators))
    return dataclasses.replace(f, kind="enum", enumerators=pairs, source=source)


def _declared(f: Field) -> str:
    """The C type ``f`` was declared with, qualifiers dropped."""
    words = str(f.source.get("ctype", "")).split()
    return " ".join(w for w in words if w not in ("const", "volatile"))


def annotate(layout: Layout, struct: str, types: EnumSource) -> Layout:
    """The layout with the display hints of ``struct`` (and `TYPE_HINTS`) applied where
    the debug info has their enums (see the module docstring)."""
    hints = {h.field: h for h in hints_for(struct)}
    by_type = {h.ctype: h for h in TYPE_HINTS}
    fields = []
    for f in layout.fields:
        hint = hints.get(f.name) or by_type.get(_declared(f))
        found = types.find_enum(hint.enum, hint.enumerator) if hint else None
        usable = found is not None and f.kind in ("int", "uint") and found.enumerators
        fields.append(_apply(f, hint, found) if usable else f)  # type: ignore[arg-type]
    return Layout(layout.name, tuple(fields), layout.size)
