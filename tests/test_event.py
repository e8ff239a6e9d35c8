"""The event layout: the C it emits compiles to the offsets the Python decoder reads."""

from support.encoding import encode
import subprocess

import pytest

from support.cbuild import Build

from ctracer.event import (HEADER, Field, Layout, c_event_definition,
                           event_size, mini_offset)

MINI = Layout.packed_in_order("ctracer__mini_demo", [
    Field("state", "u8", 0, "enum", ((1, "ESTABLISHED"), (7, "CLOSE"))),
    Field("sk_common.skc_refcnt", "s32", 0, "int"),
    Field("flags", "u16", 0, "uint"),
    Field("wmem_queued", "u64", 0, "uint"),
])

C_PROGRAM = """
#include <stddef.h>
#include <stdio.h>
typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32;
typedef unsigned long long u64; typedef signed char s8; typedef short s16;
typedef int s32; typedef long long s64;
%s
int main(void) {
    struct ctracer_event e = {0};
    e.h.ts_ns = 0x1122334455667788ULL; e.h.object = 0xffff888012345678ULL;
    e.h.retval = -5; e.h.cpu = 1; e.h.pid = 42; e.h.tid = 43; e.h.function_id = 7;
    e.h.depth = 3; e.h.phase = 1; e.h.flags = 0;
    __builtin_memcpy(e.h.comm, "sockdemo", 9);
    e.m.state = 7; e.m.sk_common__skc_refcnt = -2; e.m.flags = 0xbeef;
    e.m.wmem_queued = 123456789012ULL;
    fwrite(&e, sizeof e, 1, stdout);
    return 0;
}
"""


def test_layout_rejects_unsafe_names():
    with pytest.raises(ValueError):
        Field("a;b", "u8", 0)
    with pytest.raises(ValueError):
        Field("x", "u128", 0)


def test_layout_rejects_overlap_and_misalignment():
    with pytest.raises(ValueError):
        Layout("bad", (Field("a", "u32", 0), Field("b", "u8", 2)), 4)
    with pytest.raises(ValueError):
        Layout("bad", (Field("a", "u32", 2),), 8)


def test_packing_follows_natural_alignment():
    assert [f.offset for f in MINI.fields] == [0, 4, 8, 16]
    assert MINI.size == 24
    assert HEADER.size % 8 == 0


def test_json_round_trip_keeps_layout():
    again = Layout.from_json(MINI.to_json())
    assert again == MINI
    assert again.field("state").enumerators == ((1, "ESTABLISHED"), (7, "CLOSE"))


def test_c_definition_compiles_and_matches_decoder(tmp_path, build_c):
    src = tmp_path / "event.c"
    src.write_text(C_PROGRAM % c_event_definition(MINI))
    exe = build_c(src, Build(opt=0), debug=False)
    raw = subprocess.run([str(exe)], check=True, capture_output=True).stdout
    assert len(raw) == event_size(MINI)
    header = HEADER.decode(raw)
    snapshot = raw[mini_offset(MINI):mini_offset(MINI) + MINI.size]
    assert header["ts_ns"] == 0x1122334455667788
    assert header["object"] == 0xffff888012345678
    assert header["retval"] == -5
    assert (header["cpu"], header["pid"], header["tid"]) == (1, 42, 43)
    assert (header["function_id"], header["depth"], header["phase"]) == (7, 3, 1)
    assert header["comm"] == "sockdemo"
    values = MINI.decode(snapshot)
    assert values == {"state": 7, "sk_common.skc_refcnt": -2, "flags": 0xBEEF,
                      "wmem_queued": 123456789012}
    assert mini_offset(MINI) == HEADER.size


def test_encode_is_inverse_of_decode():
    values = {"state": 1, "sk_common.skc_refcnt": 5, "flags": 3, "wmem_queued": 9}
    assert MINI.decode(encode(MINI, values)) == values


def test_numpy_dtype_decodes_like_decode():
    import numpy

    layout = Layout.packed_in_order("ctracer__mini_np", [
        Field("a", "u8", 0, "uint"), Field("b.c", "s32", 0, "int"),
        Field("name", "char[6]", 0, "text"), Field("d", "double", 0, "float"),
        Field("e", "u64", 0, "pointer"), Field("f", "s16", 0, "int")])
    values = [{"a": 7, "b.c": -5, "name": "ab", "d": 1.5, "e": 1 << 63, "f": -2},
              {"a": 255, "b.c": 1 << 30, "name": "xyzxyz", "d": -0.25, "e": 3, "f": 9}]
    blob = b"".join(encode(layout, v) for v in values)
    table = numpy.frombuffer(blob, layout.numpy_dtype())
    assert table.dtype.itemsize == layout.size
    for i, v in enumerate(values):
        decoded = layout.decode(blob, i * layout.size)
        for f in layout.fields:
            got = table[f.name][i]
            got = got.split(b"\0", 1)[0].decode() if isinstance(got, bytes) else got.item()
            assert got == decoded[f.name] == v[f.name]
