"""The one definition of the record a write breakpoint's program emits (``--watch``).

A data breakpoint traps after the write; its BPF program (`ctracer.probes.watch`) writes
one `WRITE` record: when, where (CPU, process, thread), the address written (the armed
address), the instruction pointer after the write, the 8 bytes at the address then (the
new value; the recorder keeps the field's width of them) and up to `STACK_DEPTH` return
addresses of the call stack.  The C struct and the decoder both come from `WRITE`
(`ctracer.event.Layout`), so the two sides cannot disagree.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ctracer.event import Field, Layout

#: return addresses kept per write (bpf_get_stack fills at most this many)
STACK_DEPTH = 16

#: `WriteRecord.flags`: the value could not be read after the write
WRITE_READ_FAILED = 1

WRITE = Layout.packed_in_order("ctracer_write", [
    Field("ts_ns", "u64", 0, "uint"),
    Field("addr", "u64", 0, "pointer"),
    Field("ip", "u64", 0, "pointer"),
    Field("value", "u64", 0, "uint"),
    Field("cpu", "u32", 0, "uint"),
    Field("pid", "u32", 0, "uint"),
    Field("tid", "u32", 0, "uint"),
    Field("frames", "u16", 0, "uint"),
    Field("flags", "u16", 0, "uint"),
])

RECORD_SIZE = WRITE.size + 8 * STACK_DEPTH
_STACK = struct.Struct(f"<{STACK_DEPTH}Q")


def c_definition() -> str:
    """C of the header and ``struct ctracer_write_record`` (header then the stack)."""
    return (WRITE.c_definition() +
            f"struct ctracer_write_record {{\n\tstruct {WRITE.name} w;\n"
            f"\tu64 stack[{STACK_DEPTH}];\n}};\n"
            f'_Static_assert(sizeof(struct ctracer_write_record) == {RECORD_SIZE}, '
            '"write record size");\n')


@dataclass(frozen=True)
class WriteRecord:
    """One trapped write, as the program saw it (addresses unresolved)."""

    ts_ns: int
    addr: int
    ip: int
    value: int
    cpu: int
    pid: int
    tid: int
    flags: int
    stack: tuple[int, ...]


def decode(raw: bytes, offset: int = 0) -> WriteRecord:
    """The write record at ``offset`` of ``raw``, its call stack cut to the frames recorded."""
    w = WRITE.decode(raw, offset)
    frames = min(int(w["frames"]), STACK_DEPTH)
    stack = _STACK.unpack_from(raw, offset + WRITE.size)[:frames]
    return WriteRecord(w["ts_ns"], w["addr"], w["ip"], w["value"], w["cpu"], w["pid"],
                       w["tid"], w["flags"], tuple(stack))
