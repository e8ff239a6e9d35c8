"""Which words of the struct ``--watch`` arms write breakpoints on, and what that costs.

A data breakpoint watches 1, 2, 4 or 8 bytes aligned to its length, and x86 has four
debug registers (`DEBUG_REGISTERS`) a CPU, so a watch is a short list of such words:
a field of 1/2/4/8 bytes at an offset aligned to its size is one word; any other field
(a 16-byte array, a misaligned or odd-sized member, a bitfield's bytes) is covered by the
aligned words its bytes fall in.  The registers are shared between every watched
object: `WatchPlan.objects_at_once` objects are armed at a time.  A field not in the
struct, or more words than the registers, is refused with one line naming what is left
out (`ctracer.errors.UsageError`).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

from ctracer.debuginfo.typegraph import CompositeType, TypeGraph, iter_members_flat
from ctracer.errors import UsageError

#: x86-64's debug registers DR0-DR3: the most words watched at once on a CPU
DEBUG_REGISTERS = 4


@dataclass(frozen=True)
class WatchWord:
    """One breakpoint's word of a watched field: ``offset`` from the object's start,
    ``length`` (1, 2, 4 or 8) bytes; ``field`` the member's dotted name, ``field_offset``
    and ``field_size`` the member's own bytes (a word may cover more than the field)."""

    field: str
    offset: int
    length: int
    field_offset: int
    field_size: int


@dataclass(frozen=True)
class WatchPlan:
    """The words ``--watch`` arms on each object and how many writes one object may take
    before its breakpoints move on; stored in the trace's meta as ``watch_plan``."""

    words: tuple[WatchWord, ...]
    #: writes recorded for one object before its breakpoints move to another one
    budget: int = 1000

    @property
    def fields(self) -> list[str]:
        """The fields watched, in the order of their first word."""
        return list(dict.fromkeys(w.field for w in self.words))

    @property
    def objects_at_once(self) -> int:
        """How many objects the debug registers hold at once."""
        return max(1, DEBUG_REGISTERS // len(self.words)) if self.words else 0

    def describe(self) -> str:
        """One line for ``plan`` and the recording's start."""
        words = ", ".join(f"{w.field} (+{w.offset}, {w.length} byte{'s' if w.length != 1 else ''})" for w in self.words)
        return (f"watch: {len(self.words)} word{'s' if len(self.words) != 1 else ''} "
                f"[{words}] of {DEBUG_REGISTERS} debug registers: {self.objects_at_once} "
                f"object{'s' if self.objects_at_once != 1 else ''} armed at a time, each "
                f"left at the end of its life or after {self.budget} writes")

    def to_json(self) -> str:
        """The plan as the trace file's meta ``watch_plan`` stores it."""
        return json.dumps({"budget": self.budget, "words": [w.__dict__ for w in self.words]})

    @classmethod
    def from_json(cls, text: str) -> "WatchPlan":
        """The plan from `to_json`'s text (a ValueError when it is not one)."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: object) -> "WatchPlan":
        """The plan from `to_json`'s text once decoded (the trace file's meta
        ``watch_plan``); a ValueError when it is not one."""
        try:
            words = tuple(WatchWord(**w) for w in data["words"])  # type: ignore[index]
            budget = data.get("budget", 1000)  # type: ignore[union-attr]
        except (TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"not a watch plan ({e})") from None
        if not all(isinstance(getattr(w, k), int) for w in words
                   for k in ("offset", "length", "field_offset", "field_size")) \
                or not all(isinstance(w.field, str) for w in words) or not isinstance(budget, int):
            raise ValueError("not a watch plan (a word or the budget of the wrong type)")
        return cls(words, budget)


def _members(graph: TypeGraph) -> dict[str, tuple[int, int, bool]]:
    """Every member, nested structs' members included (dotted path, anonymous steps
    dropped): name -> (byte offset, byte size, is a bitfield)."""
    out: dict[str, tuple[int, int, bool]] = {}

    def walk(tid, prefix: str, base_bits: int) -> None:
        for path, member, bits in iter_members_flat(graph, tid, prefix, base_bits):
            name = ".".join(p for p in path.split(".") if p)
            if member.is_bitfield:
                first, last = bits // 8, (bits + member.bit_size - 1) // 8
                out[name] = (first, last - first + 1, True)
                continue
            out[name] = (bits // 8, graph.size_of(member.type), False)
            inner = graph.strip(member.type)
            if inner is not None and isinstance(graph[inner], CompositeType):
                walk(inner, name + ".", bits)

    walk(graph.root, "", 0)
    return out


def _find(members: dict, name: str) -> str:
    if name in members:
        return name
    tails = [m for m in members if m.rsplit(".", 1)[-1] == name]
    if len(tails) == 1:
        return tails[0]
    if tails:
        raise UsageError(f"--watch {name}: several members have that name "
                         f"({', '.join(sorted(tails)[:4])}): give the dotted path")
    close = difflib.get_close_matches(name, list(members) + [m.rsplit('.', 1)[-1]
                                                             for m in members], n=3)
    hint = f"; did you mean {', '.join(dict.fromkeys(close))}?" if close else ""
    raise UsageError(f"--watch {name}: no such member in the struct{hint}")


def words_for(offset: int, size: int) -> list[tuple[int, int]]:
    """The fewest aligned (offset, length) breakpoint words covering ``size`` bytes at
    ``offset``."""
    if size in (1, 2, 4, 8) and offset % size == 0:
        return [(offset, size)]
    out, at, end = [], offset, offset + size
    while at < end:
        for length in (8, 4, 2, 1):
            if at % length == 0 and at + length <= end:
                break
        else:  # pragma: no cover - length 1 always fits
            length = 1
        out.append((at, length))
        at += length
    return out


def plan_watch(graph: TypeGraph, names: list[str], budget: int = 1000) -> WatchPlan:
    """The words of the named fields; refuses what the debug registers cannot hold."""
    if budget <= 0:
        raise UsageError("--watch-budget needs a positive number of writes")
    members = _members(graph)
    words: list[WatchWord] = []
    for name in dict.fromkeys(names):
        path = _find(members, name)
        offset, size, _bitfield = members[path]
        if size <= 0:
            raise UsageError(f"--watch {name}: the member has no size (a flexible array)")
        covered = words_for(offset, size)
        if len(covered) > DEBUG_REGISTERS:
            raise UsageError(f"--watch {name}: {size} bytes need {len(covered)} breakpoint "
                             f"words, the CPU has {DEBUG_REGISTERS} debug registers: watch "
                             "a member inside it instead")
        words += [WatchWord(path, at, length, offset, size) for at, length in covered]
    if len(words) > DEBUG_REGISTERS:
        kept, left = words[:DEBUG_REGISTERS], words[DEBUG_REGISTERS:]
        raise UsageError(f"--watch needs {len(words)} breakpoint words, the CPU has "
                         f"{DEBUG_REGISTERS} debug registers: "
                         f"{', '.join(dict.fromkeys(w.field for w in left))} would be left "
                         f"out (watch at most {', '.join(dict.fromkeys(w.field for w in kept))})")
    return WatchPlan(tuple(words), budget)
