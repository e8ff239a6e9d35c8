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

Each annotated field also gets ``source["display_hint"]``: the hint's reason and the
enum it came from.  A hint whose field is not recorded, or whose enum the debug info
does not have, changes nothing: no value is ever pasted here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Protocol

from ctracer.debuginfo.graph import EnumType
from ctracer.event import Field, Layout


class EnumSource(Protocol):
    """What `annotate` needs of a type model (`ctracer.debuginfo.btf.reader.BtfModel`)."""

    def find_enum(self, name: Optional[str] = None,
                  enumerator: Optional[str] = None) -> Optional[EnumType]: ...


@dataclass(frozen=True)
class DisplayHint:
    struct: str
    field: str                        # the mini field's dotted path
    how: str                          # "enum" or "bits"
    enum: Optional[str] = None        # C's enum name ...
    enumerator: Optional[str] = None  # ... or an enumerator of an anonymous enum
    why: str = ""

    def __post_init__(self) -> None:
        if self.how not in ("enum", "bits"):
            raise ValueError(f"unknown display hint {self.how!r}")
        if (self.enum is None) == (self.enumerator is None):
            raise ValueError("a display hint names its enum or one of its enumerators")

    @property
    def enum_text(self) -> str:
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
    return tuple(h for h in HINTS if h.struct == struct)


def _apply(f: Field, hint: DisplayHint, found: EnumType) -> Field:
    source = dict(f.source)
    source["display_hint"] = {"enum": hint.enum_text, "rule": hint.why}
    pairs = tuple(sorted((int(v), str(n)) for n, v in found.enumerators))
    if hint.how == "bits":
        width = f.size * 8
        source["bits"] = [[v, n] for v, n in pairs if 0 <= v < width]
        return dataclasses.replace(f, source=source)
    return dataclasses.replace(f, kind="enum", enumerators=pairs, source=source)


def annotate(layout: Layout, struct: str, types: EnumSource) -> Layout:
    """The layout with the display hints of ``struct`` applied where the debug info has
    their enums (see the module docstring)."""
    hints = {h.field: h for h in hints_for(struct)}
    fields = []
    for f in layout.fields:
        hint = hints.get(f.name)
        found = types.find_enum(hint.enum, hint.enumerator) if hint else None
        usable = found is not None and f.kind in ("int", "uint") and found.enumerators
        fields.append(_apply(f, hint, found) if usable else f)  # type: ignore[arg-type]
    return Layout(layout.name, tuple(fields), layout.size)
