"""The one definition of the record a probe writes and the recorder decodes.

A `Layout` is a list of scalar fields at fixed offsets.  From it come both the C struct
the BPF program fills (`Layout.c_definition`, with static asserts pinning every offset)
and the Python decoder (`Layout.decode`), so the two sides cannot disagree.

An event is the fixed `HEADER`, then ``nargs`` 64-bit argument slots (a tracepoint's
arguments, raw; none for entry/exit probes), then the traced struct's mini snapshot,
whose layout `ctracer.plan.mini` builds and the trace file stores (`Layout.to_json`), so
a trace decodes on a machine that never saw the binary.
"""

from __future__ import annotations

import ipaddress
import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

#: scalar C types an event field may have: (python struct code, size)
SCALARS: dict[str, tuple[str, int]] = {
    "u8": ("B", 1), "s8": ("b", 1),
    "u16": ("H", 2), "s16": ("h", 2),
    "u32": ("I", 4), "s32": ("i", 4),
    "u64": ("Q", 8), "s64": ("q", 8),
    "float": ("f", 4), "double": ("d", 8),
}

#: how a value is shown: plain integer, bool, enum name, char, float, address, text, and
#: an IPv6 address (16 bytes of a ``char[16]``)
KINDS = ("int", "uint", "bool", "enum", "char", "float", "pointer", "text", "ipv6")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ARRAY = re.compile(r"char\[(\d+)\]\Z")


def c_identifier(name: str) -> str:
    """A C identifier for a (possibly dotted) field name; raises ValueError otherwise."""
    ident = name.replace(".", "__")
    if not _IDENT.match(ident):
        raise ValueError(f"not usable as a C identifier: {name!r}")
    return ident


@dataclass(frozen=True)
class Field:
    """One field of a layout.

    ``name`` is the display name (dotted for members of nested structs), ``ctype`` one of
    `SCALARS` or ``char[N]``; ``enumerators`` maps values to names for ``kind="enum"``.
    ``source`` records where a mini field comes from in the traced struct (free-form
    dict: byte offset, bit offset/size, original C type) for collectors and display.
    """

    name: str
    ctype: str
    offset: int
    kind: str = "int"
    enumerators: tuple[tuple[int, str], ...] = ()
    source: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown field kind {self.kind!r}")
        size_of_ctype(self.ctype)
        c_identifier(self.name)

    @property
    def size(self) -> int:
        """Bytes of the field."""
        return size_of_ctype(self.ctype)

    @property
    def c_name(self) -> str:
        """The field's name as a C identifier."""
        return c_identifier(self.name)


def array_value(kind: str, raw: bytes) -> str:
    """The value of a ``char[N]`` field: text up to the first NUL, or an IPv6 address
    (``::1``; IPv4-mapped ones as ``::ffff:127.0.0.1``) for kind ``ipv6``."""
    if kind == "ipv6" and len(raw) <= 16:   # numpy's bytes drop trailing NULs
        address = ipaddress.IPv6Address(bytes(raw).ljust(16, b"\0"))
        mapped = address.ipv4_mapped
        return f"::ffff:{mapped}" if mapped is not None else address.compressed
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def size_of_ctype(ctype: str) -> int:
    """Bytes of an event field of C type ``ctype`` (a scalar or ``char[N]``)."""
    if ctype in SCALARS:
        return SCALARS[ctype][1]
    m = _ARRAY.match(ctype)
    if m:
        return int(m.group(1))
    raise ValueError(f"unsupported event field type {ctype!r}")


def align_of_ctype(ctype: str) -> int:
    """Alignment of an event field of C type ``ctype`` (1 for ``char[N]``)."""
    return 1 if _ARRAY.match(ctype) else SCALARS[ctype][1]


@dataclass(frozen=True)
class Layout:
    """Fields at explicit offsets, in a struct of ``size`` bytes."""

    name: str
    fields: tuple[Field, ...]
    size: int

    def __post_init__(self) -> None:
        c_identifier(self.name)
        object.__setattr__(self, "_ordered", tuple(sorted(self.fields, key=lambda f: f.offset)))
        end = 0
        for f in self.ordered_fields:
            if f.offset < end:
                raise ValueError(f"{self.name}: field {f.name} overlaps the one before")
            if f.offset % align_of_ctype(f.ctype):
                raise ValueError(f"{self.name}: field {f.name} is misaligned")
            end = f.offset + f.size
        if end > self.size:
            raise ValueError(f"{self.name}: fields run past the size {self.size}")

    @classmethod
    def packed_in_order(cls, name: str, fields: Iterable[Field]) -> "Layout":
        """Place fields one after another at their natural alignment (like a C compiler)."""
        placed, offset, align = [], 0, 1
        for f in fields:
            a = align_of_ctype(f.ctype)
            align = max(align, a)
            offset = (offset + a - 1) // a * a
            placed.append(Field(f.name, f.ctype, offset, f.kind, f.enumerators, dict(f.source)))
            offset += f.size
        size = (offset + align - 1) // align * align
        return cls(name, tuple(placed), size)

    @property
    def alignment(self) -> int:
        """The struct's alignment: its most aligned field's (1 when empty)."""
        return max((align_of_ctype(f.ctype) for f in self.fields), default=1)

    def field(self, name: str) -> Field:
        """The field named ``name`` (a KeyError when there is none)."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    # -- C side ---------------------------------------------------------------

    def c_definition(self) -> str:
        """The C struct, padded explicitly and pinned with static asserts."""
        lines = [f"struct {self.name} {{"]
        at, pad = 0, 0
        for f in self.ordered_fields:
            if f.offset > at:
                lines.append(f"\tu8 __pad{pad}[{f.offset - at}];")
                pad += 1
            m = _ARRAY.match(f.ctype)
            decl = f"char {f.c_name}[{m.group(1)}]" if m else f"{f.ctype} {f.c_name}"
            lines.append(f"\t{decl};")
            at = f.offset + f.size
        if self.size > at:
            lines.append(f"\tu8 __pad{pad}[{self.size - at}];")
        lines.append("} __attribute__((packed, aligned(%d)));" % self.alignment)
        lines.append(f'_Static_assert(sizeof(struct {self.name}) == {self.size}, '
                     f'"{self.name} size");')
        for f in self.fields:
            lines.append(f"_Static_assert(__builtin_offsetof(struct {self.name}, {f.c_name})"
                         f' == {f.offset}, "{self.name}.{f.c_name} offset");')
        return "\n".join(lines) + "\n"

    # -- Python side ----------------------------------------------------------

    def _struct(self) -> struct.Struct:
        cached = self.__dict__.get("_struct_cache")
        if cached is None:
            fmt, at = ["<"], 0
            for f in self.ordered_fields:
                if f.offset > at:
                    fmt.append(f"{f.offset - at}x")
                m = _ARRAY.match(f.ctype)
                fmt.append(f"{m.group(1)}s" if m else SCALARS[f.ctype][0])
                at = f.offset + f.size
            if self.size > at:
                fmt.append(f"{self.size - at}x")
            cached = struct.Struct("".join(fmt))
            object.__setattr__(self, "_struct_cache", cached)
        return cached

    @property
    def ordered_fields(self) -> tuple[Field, ...]:
        """The fields in offset order: the order of `unpack`'s values."""
        return self.__dict__["_ordered"]

    def unpack(self, data: bytes, offset: int = 0) -> tuple:
        """Raw values in offset order, char arrays as bytes: the fast path of `decode`
        for code that decodes many records."""
        return self._struct().unpack_from(data, offset)

    def decode(self, data: bytes, offset: int = 0) -> dict[str, Any]:
        """Field values by name, in offset order; char arrays become str (up to NUL)."""
        out = {}
        for f, v in zip(self.ordered_fields, self.unpack(data, offset)):
            if isinstance(v, bytes):
                v = array_value(f.kind, v)
            out[f.name] = v
        return out

    def numpy_fields(self, base: int = 0) -> list[tuple[str, str, int]]:
        """(name, numpy type, offset + ``base``) of every field, for a structured dtype
        that decodes many records at once (char arrays as fixed-size bytes)."""
        out = []
        for f in self.ordered_fields:
            m = _ARRAY.match(f.ctype)
            out.append((f.name, f"S{m.group(1)}" if m else "<" + SCALARS[f.ctype][0],
                        f.offset + base))
        return out

    def numpy_dtype(self):
        """A numpy structured dtype of this layout (``numpy.frombuffer`` decodes a whole
        table of records with it at C speed)."""
        import numpy as np

        names, formats, offsets = zip(*self.numpy_fields()) if self.fields else ((), (), ())
        return np.dtype({"names": list(names), "formats": list(formats),
                         "offsets": list(offsets), "itemsize": self.size})

    # -- storage --------------------------------------------------------------

    def to_json(self) -> str:
        """The layout as the trace file's meta ``mini_layout`` stores it."""
        return json.dumps({
            "name": self.name, "size": self.size,
            "fields": [{"name": f.name, "ctype": f.ctype, "offset": f.offset, "kind": f.kind,
                        "enumerators": [list(e) for e in f.enumerators],
                        "source": f.source} for f in self.fields]})

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        """The layout back from `to_json`'s text."""
        d = json.loads(text)
        return cls(d["name"], tuple(
            Field(f["name"], f["ctype"], f["offset"], f.get("kind", "int"),
                  tuple((int(v), str(n)) for v, n in f.get("enumerators", ())),
                  dict(f.get("source", {})))
            for f in d["fields"]), d["size"])


@dataclass(frozen=True)
class FunctionRow:
    """A row of the trace's functions table: one route of a probed function to the
    object (an event's ``function_id`` is its ``id``).  The table stores ``route_kind``
    and ``route_text`` in its columns ``reach`` and ``via``."""

    id: int
    name: str
    unit: str = ""
    route_kind: str = "direct"  # direct | alias | holder | double_pointer | returns | tracepoint
    route_text: str = ""        # e.g. "struct inet_sock", "socket->sk", "param 2"
    address: Optional[int] = None
    attached: str = ""     # "entry,exit", or why not


def canonical_ids(rows: Iterable[FunctionRow]) -> dict[int, int]:
    """Functions-table rows of the same function (same name, unit and address; a
    tracepoint is never the function of its name, ``consume_skb``) → the smallest of
    their ids, which then stands for the function."""
    first: dict[tuple, int] = {}
    out = {}
    for f in sorted(rows, key=lambda r: r.id):
        key = (f.route_kind == "tracepoint", f.name, f.unit, f.address)
        out[f.id] = first.setdefault(key, f.id)
    return out


PHASE_ENTRY = 0
PHASE_EXIT = 1
PHASE_TRACEPOINT = 2   # one event per tracepoint hit: no entry/exit pair, no depth

#: how the trace file and exports spell each phase
PHASE_NAMES = {PHASE_ENTRY: "entry", PHASE_EXIT: "exit", PHASE_TRACEPOINT: "tracepoint"}

#: flags in the header
FLAG_READ_FAILED = 1   # the object could not be read; the snapshot is garbage
FLAG_NO_ENTRY = 2      # an exit whose entry was not seen (object unknown)
#: only the object's head was read (a time-wait or request socket traced as struct sock:
#: `ctracer.plan.heads`); the fields outside it were not read (zero in the snapshot)
FLAG_HEAD_ONLY = 4
#: set by the reader of a compact trace: the event's snapshot could not be rebuilt (an
#: earlier event of its object was lost: `ctracer.deltas`); no snapshot
FLAG_SNAPSHOT_LOST = 8

#: every event starts with this
HEADER = Layout.packed_in_order("ctracer_header", [
    Field("ts_ns", "u64", 0, "uint"),
    Field("object", "u64", 0, "pointer"),
    Field("retval", "s64", 0, "int"),
    Field("cpu", "u32", 0, "uint"),
    Field("pid", "u32", 0, "uint"),
    Field("tid", "u32", 0, "uint"),
    Field("function_id", "u32", 0, "uint"),
    Field("depth", "u16", 0, "uint"),
    Field("phase", "u8", 0, "uint"),
    Field("flags", "u8", 0, "uint"),
    Field("comm", "char[16]", 0, "text"),
])


def args_offset() -> int:
    """Where the argument slots start (right after the header, 8-byte aligned)."""
    return (HEADER.size + 7) // 8 * 8


def mini_offset(mini: Layout, nargs: int = 0) -> int:
    """Where the mini snapshot starts in an event with ``nargs`` argument words,
    aligned for the mini struct (and to 8 after arguments)."""
    a = max(mini.alignment, 8 if nargs else 1)
    start = args_offset() + 8 * nargs if nargs else HEADER.size
    return (start + a - 1) // a * a


def event_size(mini: Layout, nargs: int = 0) -> int:
    """Bytes of one event: header, ``nargs`` u64 argument slots, then the mini snapshot
    at the mini's alignment; the whole rounded up to 8 (the header's alignment, so the
    C struct's sizeof)."""
    return (mini_offset(mini, nargs) + mini.size + 7) // 8 * 8


def c_event_definition(mini: Layout, nargs: int = 0) -> str:
    """C for the header, the mini struct and ``struct ctracer_event`` holding them
    (with ``u64 args[nargs]`` between the two when ``nargs``)."""
    args = f"\tu64 args[{nargs}];\n" if nargs else ""
    asserts = (f'_Static_assert(__builtin_offsetof(struct ctracer_event, args) == '
               f'{args_offset()}, "args offset");\n' if nargs else "")
    return (HEADER.c_definition() + "\n" + mini.c_definition() + "\n"
            f"struct ctracer_event {{\n\tstruct {HEADER.name} h;\n{args}"
            f"\tstruct {mini.name} m;\n}};\n"
            f'_Static_assert(__builtin_offsetof(struct ctracer_event, m) == '
            f'{mini_offset(mini, nargs)}, "mini offset");\n' + asserts +
            f'_Static_assert(sizeof(struct ctracer_event) == {event_size(mini, nargs)}, '
            f'"event size");\n')


def event_dtype(mini: Layout, nargs: int = 0):
    """A numpy structured dtype of one whole event: the header's fields by name, the
    argument slots as ``args`` (``nargs`` u64, when any) and the mini snapshot as opaque
    bytes named ``snapshot`` (decode those with ``mini.numpy_dtype()``)."""
    import numpy as np

    names, formats, offsets = (list(x) for x in zip(*HEADER.numpy_fields()))
    if nargs:
        names.append("args")
        formats.append(("<u8", (nargs,)))
        offsets.append(args_offset())
    if mini.size:
        names.append("snapshot")
        formats.append(f"V{mini.size}")
        offsets.append(mini_offset(mini, nargs))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": event_size(mini, nargs)})


# -- compact events ------------------------------------------------------------------
#
# A compact event is a whole event (`c_event_definition`) cut in two: its first
# `DELTA_FIXED` bytes as they are (time, object, return value, cpu, pid, tid, function,
# depth, phase, flags, the command name's first bytes), then a delta of the rest (the
# command name, the argument slots, the snapshot) as 8-byte words: a bitmap of the words
# this event carries, then those words.  The kernel keeps each followed object's last
# event as each CPU sent it (`ctracer.probes.ctext.send_function`), so an event carries
# only the words that changed since the object's last event on its CPU; the first event
# of an object on a CPU, the one after a lost event and any the kernel could not chain
# carry every word.  The reader (`ctracer.deltas`) rebuilds the whole events.

#: meta ``event_encoding``: every event whole (`--full-snapshots`), or compact
ENCODING_FULL = "full"
ENCODING_COMPACT = "compact"

#: a delta's kind
DELTA_CHANGED = 0     # the words changed since the event of version ``base``
DELTA_FIRST = 1       # every word; starts the object's chain on its CPU at version 0
DELTA_ALONE = 2       # every word, outside the chain (a nested program's event)

#: a ring buffer record's header (the kernel's ``struct bpf_ringbuf_hdr``): a compact
#: trace keeps the ring's records as they were, header included
RING_HEADER_BYTES = 8
RING_BUSY_BIT = 1 << 31
RING_DISCARD_BIT = 1 << 30

#: bytes at the start of every event sent as they are (8-byte aligned, inside the header)
DELTA_FIXED = 48
assert HEADER.field("flags").offset < DELTA_FIXED <= HEADER.size


def delta_words(mini: Layout, nargs: int = 0) -> int:
    """8-byte words a compact event's delta is cut into (the event after its first
    `DELTA_FIXED` bytes)."""
    return (event_size(mini, nargs) - DELTA_FIXED) // 8


def bitmap_words(mini: Layout, nargs: int = 0) -> int:
    """u64 words of a delta's bitmap (one bit per delta word)."""
    return (delta_words(mini, nargs) + 63) // 64


#: the delta's head, after the fixed bytes and before the bitmap
DELTA = Layout.packed_in_order("ctracer_delta_head", [
    Field("base", "u32", 0, "uint"),
    Field("words", "u16", 0, "uint"),
    Field("kind", "u8", 0, "uint"),
    Field("pad", "u8", 0, "uint"),
])


def delta_words_offset(mini: Layout, nargs: int = 0) -> int:
    """Where a compact event's words start (after the fixed bytes, head and bitmap)."""
    return DELTA_FIXED + DELTA.size + 8 * bitmap_words(mini, nargs)


def compact_size(mini: Layout, nargs: int, words: int) -> int:
    """Bytes of a compact event carrying ``words`` words."""
    return delta_words_offset(mini, nargs) + 8 * words


def c_compact_definition(mini: Layout, nargs: int = 0) -> str:
    """C for ``struct ctracer_compact`` (the most a compact event holds); after
    `c_event_definition`."""
    words, bits = delta_words(mini, nargs), bitmap_words(mini, nargs)
    return (DELTA.c_definition() + "\n"
            f"#define CTRACER_DELTA_FIXED {DELTA_FIXED}\n"
            f"#define CTRACER_WORDS {words}\n#define CTRACER_BITMAP_WORDS {bits}\n"
            f"#define CTRACER_DELTA_CHANGED {DELTA_CHANGED}\n"
            f"#define CTRACER_DELTA_FIRST {DELTA_FIRST}\n"
            f"#define CTRACER_DELTA_ALONE {DELTA_ALONE}\n"
            f"struct ctracer_compact {{\n\tu64 fixed[{DELTA_FIXED // 8}];\n"
            f"\tstruct {DELTA.name} d;\n\tu64 changed[{bits}];\n\tu64 w[{words}];\n}};\n"
            f'_Static_assert(__builtin_offsetof(struct ctracer_compact, w) == '
            f'{delta_words_offset(mini, nargs)}, "words offset");\n'
            f'_Static_assert(sizeof(struct ctracer_event) == CTRACER_DELTA_FIXED + '
            f'8 * CTRACER_WORDS, "event in words");\n')
