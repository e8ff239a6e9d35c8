"""Struct layouts held against pahole, and DWARF against BTF.

Each struct goes through the path ``ctracer struct`` takes: ``model.find_struct`` then
``layout.render(graph, source_format=model.format)``.  The text must equal ``pahole -C``
on the same file and format.  Between DWARF and BTF the model-level facts must be equal
(the struct's size; every member, flattened through anonymous structs and unions, with
its bit offset, bit size and byte size); the rendered texts are compared too, but pahole
prints the two formats differently in places (DWARF records explicit alignment, BTF does
not, so only DWARF shows ``__aligned__`` attributes, forced alignments, "Force padding"
and some inferred ``__packed__``; from BTF pahole prints multi-dimensional arrays
flattened, ``[40]`` for ``[4][2][5]``), so text differences there are counted, not failed.

Some names belong to several different structs (``irq_info``: three in this kernel).
DWARF readers and pahole take the first definition in .debug_info, BTF readers the first
record in BTF, which may be another struct: such a difference is explained when BTF holds
several structs of the name and one of them has DWARF's size (checked with bpftool).
"""

from __future__ import annotations

import difflib
import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from corpus_oracles import PaholeResult
from corpus_report import Findings, plural

from ctracer.plan import pahole as layout
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.typegraph import TypeGraph, iter_members_flat

#: structs whose DWARF layout text differs from pahole's because of a known reader gap,
#: with the reason; reported, not failed, and failed once they match (drop them then)
KNOWN_DWARF_GAPS: dict[str, str] = {}

DIFFS_SHOWN = 3
DIFF_LINES = 30


def sample_structs(names: Iterable[str], count: int, seed: int,
                   always: Sequence[str]) -> list[str]:
    """``always`` (those defined) plus ``count`` others drawn with a fixed seed."""
    defined = set(names)
    chosen = [n for n in dict.fromkeys(always) if n in defined]
    pool = sorted(defined - set(chosen))
    return chosen + random.Random(seed).sample(pool, min(count, len(pool)))


def member_facts(graph: TypeGraph) -> tuple:
    """(size, ((member path, bit offset, bit size, byte size), ...))."""
    return (graph.size_of(graph.root),
            tuple((path, bit_offset, m.bit_size, graph.size_of(m.type))
                  for path, m, bit_offset in iter_members_flat(graph, graph.root)))


@dataclass
class Rendered:
    text: Optional[str]         # None: the model has no such struct
    facts: Optional[tuple]
    seconds: float              # find_struct + render


def render_structs(model, names: Sequence[str]) -> dict[str, Rendered]:
    """Each struct's layout text and facts, as ``ctracer struct NAME`` computes them."""
    known = set(model.struct_names(ShapeKind.STRUCT))
    out = {}
    for name in names:
        if name not in known:
            out[name] = Rendered(None, None, 0.0)
            continue
        start = time.perf_counter()
        graph = model.find_struct(name, ShapeKind.STRUCT)
        text = layout.render(graph, source_format=model.format)
        out[name] = Rendered(text, member_facts(graph), time.perf_counter() - start)
    return out


def timing_line(rendered: dict[str, Rendered]) -> str:
    done = [(r.seconds, n) for n, r in rendered.items() if r.text is not None]
    if not done:
        return "no struct rendered"
    first = done[0]
    times = sorted(done[1:], reverse=True)
    total = sum(t for t, _n in done)
    slowest = ", ".join(f"{n} {t * 1000:.0f} ms" for t, n in times[:3])
    return (f"find_struct + render: {len(done)} structs in {total:.2f} s; the first "
            f"({first[1]}, opening the reader) {first[0] * 1000:.0f} ms, the others mean "
            f"{sum(t for t, _n in times) / max(1, len(times)) * 1000:.1f} ms, slowest "
            f"{slowest}")


def unified(expected: str, got: str, name: str, left: str, right: str) -> str:
    lines = list(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                      f"{left} {name}", f"{right} {name}"))
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"... ({len(lines) - DIFF_LINES} more diff lines)\n"]
    return "".join(lines).rstrip("\n")


def compare_with_pahole(rendered: dict[str, Rendered], pahole: PaholeResult, what: str,
                        known_gaps: Optional[dict] = None) -> Findings:
    """ctracer's text against ``pahole -C`` for every struct."""
    f = Findings("", what)
    gaps = known_gaps or {}
    identical, gapped, differ, absent = 0, [], [], []
    shadowed = [n for n in rendered if n in pahole.typedef_shadowed]
    for name, r in rendered.items():
        expected = pahole.texts.get(name)
        if name in shadowed and r.text is not None:
            continue
        if r.text is None or expected is None:
            absent.append((name, "ctracer" if r.text is None else "pahole"))
        elif r.text == expected:
            identical += 1
            if name in gaps:
                f.fail(f"{name} now equals pahole: drop it from the known gaps")
        elif name in gaps:
            gapped.append(name)
        else:
            differ.append((name, expected, r.text))
    f.say(f"{identical} of {len(rendered) - len(shadowed)} identical to pahole ({pahole.runs} pahole "
          f"run{'s' if pahole.runs != 1 else ''}, {pahole.seconds:.1f} s)")
    if shadowed:
        f.say(f"{plural(len(shadowed), 'struct')} pahole -C cannot show, printing the "
              f"typedef of the same name instead: {', '.join(shadowed)}")
    for name in gapped:
        f.say(f"known gap, differs: {name}: {gaps[name]}")
    for name, side in absent:
        f.fail(f"{name}: {side} has no such struct")
    if differ:
        f.fail(f"{plural(len(differ), 'struct')} differ from pahole: "
               + ", ".join(n for n, _e, _g in differ[:20]) + (" ..." if len(differ) > 20 else ""))
        for name, expected, got in differ[:DIFFS_SHOWN]:
            f.fail(unified(expected, got, name, "pahole", "ctracer"))
    return f


_ALIGNED = re.compile(r" __attribute__\(\(__(?:aligned__\(\d+\)|packed__)\)\)")
_FORCED = re.compile(r"\n\t*/\* forced alignments: [^\n]*\*/")
_FORCE_PADDING = re.compile(r"\n\t*/\* Force padding: \*/(\n\t*[^\n]* :\d+;)*\n?")
_ARRAY_DIMS = re.compile(r"(\w+)((?:\[\d+\]){2,})")
_SPACES = re.compile(r"[ \t]+")


def _flattened(m: re.Match) -> str:
    count = 1
    for dim in re.findall(r"\d+", m.group(2)):
        count *= int(dim)
    return f"{m.group(1)}[{count}]"


def format_neutral(text: str) -> str:
    """A layout text without what pahole prints only from DWARF (alignment and packing
    attributes, forced alignments and padding), multi-dimensional arrays flattened as
    pahole prints them from BTF, and runs of blanks collapsed (attributes shift
    pahole's columns)."""
    for pattern in (_ALIGNED, _FORCED, _FORCE_PADDING):
        text = pattern.sub("", text)
    return _SPACES.sub(" ", _ARRAY_DIMS.sub(_flattened, text))


def compare_formats(dwarf: dict[str, Rendered], btf: dict[str, Rendered],
                    btf_sizes: Optional[Callable[[str], list[int]]] = None,
                    known_gaps: Optional[dict] = None) -> Findings:
    """DWARF against BTF on the same structs: facts equal (or the name is shared by
    several structs, see the module docstring); texts counted.  ``btf_sizes(name)``
    gives the sizes of the BTF structs of a name."""
    f = Findings("", "DWARF against BTF, model facts and text")
    gaps = known_gaps or {}
    compared, same_facts, same_text, neutral_same = 0, 0, 0, 0
    shared, other, missing = [], [], []

    def shared_name(name: str, size: int) -> bool:
        sizes = btf_sizes(name) if btf_sizes else []
        if len(sizes) > 1 and size in sizes:
            shared.append(f"{name} ({', '.join(map(str, sorted(sizes)))})")
            return True
        return False

    for name, d in dwarf.items():
        b = btf.get(name)
        if d.text is None:
            continue
        if b is None or b.text is None:
            missing.append(name)
            continue
        compared += 1
        if d.facts != b.facts:
            if not shared_name(name, d.facts[0]):
                f.fail(_facts_difference(name, d.facts, b.facts))
            continue
        same_facts += 1
        if d.text == b.text:
            same_text += 1
        elif format_neutral(d.text) == format_neutral(b.text):
            neutral_same += 1
        elif name in gaps:
            other.append(f"{name} (known gap)")
        elif not shared_name(name, d.facts[0]):
            other.append(name)
    f.say(f"model facts (size; members' paths, bit offsets, bit sizes, sizes) equal for "
          f"{same_facts} of {compared}")
    f.say(f"rendered text: {same_text} identical, {neutral_same} identical apart from what "
          "pahole prints differently from DWARF and BTF, "
          + (f"{len(other)} otherwise different ({_listed(other)})" if other
             else "none otherwise different"))
    if shared:
        f.say(f"{plural(len(shared), 'name')} shared by several structs in BTF (their sizes), "
              f"each format's first being another struct: {_listed(shared)}")
    for name in missing:
        f.fail(f"{name}: in DWARF, not in BTF")
    return f


def _listed(items: list[str], most: int = 8) -> str:
    return ", ".join(items[:most]) + (" ..." if len(items) > most else "")


def _facts_difference(name: str, d: tuple, b: tuple) -> str:
    if d[0] != b[0]:
        return f"{name}: size {d[0]} in DWARF, {b[0]} in BTF"
    dm, bm = dict((m[0], m[1:]) for m in d[1]), dict((m[0], m[1:]) for m in b[1])
    for path in list(dm) + [p for p in bm if p not in dm]:
        if dm.get(path) != bm.get(path):
            return (f"{name}: member {path or '(anonymous)'}: DWARF (bit offset, bit size, "
                    f"size) {dm.get(path)}, BTF {bm.get(path)}")
    return f"{name}: members in another order ({len(d[1])} in DWARF, {len(b[1])} in BTF)"
