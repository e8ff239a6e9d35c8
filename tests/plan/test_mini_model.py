"""The mini struct builder on hand-made type graphs: the options and corner cases the C
fixture does not reach (unions off, 128-bit and long double members, C-name clashes,
a bitfield in the last byte, selection errors), and C spellings of types."""

import pytest

from ctracer.errors import UsageError
from ctracer.debuginfo.cdecl import type_text
from ctracer.plan.mini import build_mini, extract_field, select_fields
from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, FunctionType,
                                     Member, PointerType, QualifiedType, TypeGraph, Typedef)

TYPES = {
    1: BaseType("int", 4, Encoding.SIGNED),
    2: BaseType("unsigned char", 1, Encoding.UNSIGNED_CHAR),
    3: BaseType("long double", 16, Encoding.FLOAT),
    4: BaseType("__int128", 16, Encoding.SIGNED),
    5: CompositeType("union", None, 4, (Member("as_int", 1, 0), Member("as_byte", 2, 0))),
    6: CompositeType("struct", "a", 4, (Member("b", 1, 0),)),
    7: PointerType(None, 8),
    8: FunctionType(1, (7, 1)),
    9: PointerType(8, 8),
    10: ArrayType(7, (4,)),
    11: QualifiedType("const", 1),
    12: Typedef("myint", 11),
    13: CompositeType("struct", "edge", 72, (
        Member(None, 5, 0),
        Member("a", 6, 32),
        Member("a__b", 1, 64),
        Member("wide", 3, 128),
        Member("huge", 4, 256),
        Member("cb", 9, 384),
        Member("ptrs", 10, 0 * 8),
        Member("c", 12, 448),
        Member("flag", 2, 71 * 8 + 5, 3),
        Member("mid", 1, 60 * 8 + 4, 17),
    )),
}
GRAPH = TypeGraph(TYPES, 13)


def test_edges_are_skipped_with_reasons():
    mini = build_mini(GRAPH)
    names = [f.name for f in mini.layout.fields]
    assert names.count("a.b") + names.count("a__b") == 1     # one C name, kept once
    reasons = {s.name: s.reason for s in mini.skipped}
    assert "already used" in reasons["a__b"]
    assert "wide" in reasons and "huge" in reasons and reasons["ptrs"] == "array"
    assert "pointer" in reasons["cb"]
    assert mini.layout.field("c").source["ctype"] == "myint"
    assert mini.layout.field("as_int").source["union"] is True


def test_unions_can_be_left_out():
    mini = build_mini(GRAPH, unions=False)
    assert "as_int" not in {f.name for f in mini.layout.fields}
    assert any("union" in s.reason for s in mini.skipped)


def test_bitfields_read_exactly_their_bytes():
    mini = build_mini(GRAPH)
    flag, mid = mini.layout.field("flag"), mini.layout.field("mid")
    assert (flag.source["byte_offset"], flag.source["size"], flag.source["shift"]) == (71, 1, 5)
    assert (mid.source["byte_offset"], mid.source["size"], mid.source["shift"]) == (60, 4, 4)
    assert (flag.ctype, mid.ctype) == ("u8", "s32")
    value = -12345  # 17-bit two's complement at bit 484
    raw = bytearray(72)
    bits = int.from_bytes(raw, "little") | ((value & (2**17 - 1)) << 484) | (0b110 << 573)
    raw = bits.to_bytes(72, "little")
    assert extract_field(raw, mid) == value and extract_field(raw, flag) == 0b110


def test_bitfield_windows_stay_inside_the_object():
    # 17 bits at bit 556 (bytes 69..71) of a 72-byte object: a 4-byte load at 69 would
    # leave it, one at 68 does not
    graph = TypeGraph({1: BaseType("unsigned int", 4, Encoding.UNSIGNED),
                       2: CompositeType("struct", "tail", 72, (Member("t", 1, 556, 17),))}, 2)
    src = build_mini(graph).layout.field("t").source
    assert (src["byte_offset"], src["size"], src["shift"]) == (68, 4, 556 - 68 * 8)
    tiny = TypeGraph({1: BaseType("unsigned int", 4, Encoding.UNSIGNED),
                      2: CompositeType("struct", "tiny", 3, (Member("t", 1, 4, 17),),
                                       )}, 2)
    src = build_mini(tiny).layout.field("t").source
    assert (src["byte_offset"], src["size"], src["shift"]) == (0, 3, 4)
    raw = ((0x1abcd << 4) | 0xf).to_bytes(3, "little")
    assert extract_field(raw, build_mini(tiny).layout.field("t")) == 0x1abcd


def test_selection_errors_suggest_names():
    fields = build_mini(GRAPH).layout.fields
    with pytest.raises(UsageError, match="did you mean"):
        select_fields(fields, include=["as_inr"])
    with pytest.raises(UsageError):
        select_fields(fields, exclude=["nothing*"])
    assert select_fields(fields, cachelines=[5]) == []


def test_type_texts_are_c_spellings():
    assert type_text(GRAPH, 9) == "int (*)(void *, int)"
    assert type_text(GRAPH, 10) == "void *[4]"
    assert type_text(GRAPH, 12) == "myint"
    assert type_text(GRAPH, 11) == "const int"
    assert type_text(GRAPH, 5) == "union {...}"


def test_empty_selection_gives_an_empty_layout():
    mini = build_mini(GRAPH, include=["c"], exclude=["c"])
    assert mini.layout.fields == () and mini.layout.size == 0
