"""The BTF binary format: header, type records and strings, for every kind current kernels
emit (INT … ENUM64), and split BTF on top of a base.

This module knows bytes, not C: `BtfData` indexes the type section in one quick pass
(where each record starts and its kind) and decodes single records on request
(`BtfData.record`).  Turning records into ctracer's type model is `ctracer.debuginfo.btf.reader`'s job;
finding the ``.BTF`` section of an ELF file is `ctracer.debuginfo.elf`'s (`read_elf_headers`).

Format facts (kernel Documentation/bpf/btf.rst, include/uapi/linux/btf.h): a header
(magic 0xeB9F, version 1, ``hdr_len``, then type/string offsets relative to the end of the
header; headers of at least 32 bytes add a "layout" section that gives the record size of
every kind the producer knew); type ids start at 1 (0 is void); each record is a 12-byte
``btf_type`` (name offset, info = vlen | kind << 24 | kind_flag << 31, size or type)
followed by kind-specific data.  Split BTF (kernel modules) continues the type ids and the
string offsets of its base.
"""

from __future__ import annotations

import struct
import sys
from array import array
from itertools import compress
from dataclasses import dataclass
from typing import Optional, Sequence

from ctracer.errors import InputFileError

BTF_MAGIC = 0xEB9F

# Kinds (uapi btf.h)
UNKN, INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, \
    FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(20)

KIND_NAMES = ("UNKN", "INT", "PTR", "ARRAY", "STRUCT", "UNION", "ENUM", "FWD", "TYPEDEF",
              "VOLATILE", "CONST", "RESTRICT", "FUNC", "FUNC_PROTO", "VAR", "DATASEC",
              "FLOAT", "DECL_TAG", "TYPE_TAG", "ENUM64")

# 32-bit words that follow the 12-byte btf_type: a fixed part, then one element per vlen.
_FIXED_WORDS = {INT: 1, ARRAY: 3, VAR: 1, DECL_TAG: 1}
_ELEMENT_WORDS = {STRUCT: 3, UNION: 3, ENUM: 2, FUNC_PROTO: 2, DATASEC: 3, ENUM64: 3}

# INT encoding bits
INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4

# FUNC linkage (in vlen)
LINKAGE_NAMES = ("static", "global", "extern")

# Unused bits are zero in all released formats, so the widest current masks (7-bit kind,
# 24-bit vlen) read old and new BTF alike.
_KIND_MASK = 0x7F
_VLEN_MASK = 0xFFFFFF


def kind_name(kind: int) -> str:
    """The name of a BTF kind number (``KIND_N`` for one this reader does not know)."""
    return KIND_NAMES[kind] if kind < len(KIND_NAMES) else f"KIND_{kind}"


@dataclass(frozen=True)
class BtfRecord:
    """One decoded type record.

    ``ref`` is the ``size``/``type`` word (a size for INT, ENUM, STRUCT, UNION, DATASEC,
    FLOAT, ENUM64; a type id otherwise).  ``fixed`` holds the kind's fixed words decoded
    (INT: (encoding, bit offset, bits); ARRAY: (element type, index type, count); VAR:
    (linkage,); DECL_TAG: (component index,)).  ``items`` holds the vlen elements:
    STRUCT/UNION: (name, type, bit offset, bitfield size); ENUM/ENUM64: (name, value);
    FUNC_PROTO: (name, type); DATASEC: (var type, offset, size).
    """

    id: int
    kind: int
    name: Optional[str]
    kind_flag: bool
    vlen: int
    ref: int
    fixed: tuple = ()
    items: tuple = ()

    @property
    def kind_name(self) -> str:
        """The name of the record's BTF kind."""
        return kind_name(self.kind)


def _fits(index: tuple[array, bytes], prefix: array, n_words: int) -> bool:
    """Whether saved (offsets, kinds) can describe these words: same base part, and the
    last record starting inside them."""
    offsets, kinds = index
    return len(offsets) == len(kinds) >= len(prefix) and offsets[:len(prefix)] == prefix \
        and (len(offsets) == 1 or offsets[-1] < n_words)


def _needs_base(description: str) -> InputFileError:
    return InputFileError(f"{description} is split BTF (a module's): it needs the BTF it "
                          "was built on, e.g. /sys/kernel/btf/vmlinux or that vmlinux")


class BtfData:
    """One BTF blob, merged with its base when it is split BTF.

    Type ids run from 1 to ``count - 1``; ``first_id`` is the first id this blob (rather
    than its base) defines.  ``words`` is the whole type section as 32-bit words in native
    order (the base's first), ``offsets[tid]`` the word index of a record, ``kinds[tid]``
    its kind.  ``strings`` is the base's string section followed by this blob's, so split
    string offsets (which continue the base's) index it directly.
    """

    def __init__(self, data: bytes, description: str, base: Optional["BtfData"] = None,
                 known_index: Optional[tuple[array, bytes]] = None):
        """``known_index``: (offsets, kinds) saved from an earlier pass over the same
        bytes (`ctracer.debuginfo.btf.cache`), used instead of a new pass when it fits them."""
        self.description = description
        self.base = base
        if len(data) < 24:
            raise InputFileError(f"{description}: too short to be BTF")
        magic, = struct.unpack_from("<H", data, 0)
        if magic == BTF_MAGIC:
            e = "<"
        elif magic == 0x9FEB:
            e = ">"
        else:
            raise InputFileError(f"{description}: not BTF (magic {magic:#06x})")
        version, flags, hdr_len = struct.unpack_from(e + "BBI", data, 2)
        if version != 1:
            raise InputFileError(f"{description}: BTF version {version} is not supported")
        if hdr_len < 24 or hdr_len > len(data):
            raise InputFileError(f"{description}: bad BTF header length {hdr_len}")
        type_off, type_len, str_off, str_len = struct.unpack_from(e + "IIII", data, 8)
        layout = None
        if hdr_len >= 32:
            layout_off, layout_len = struct.unpack_from(e + "II", data, 24)
            if layout_len:
                start = hdr_len + layout_off
                if start + layout_len > len(data):
                    raise InputFileError(f"{description}: BTF layout runs past the end of "
                                         "the data")
                layout = [struct.unpack_from(e + "BBH", data, start + 4 * k)[:2]
                          for k in range(layout_len // 4)]
        t0, s0 = hdr_len + type_off, hdr_len + str_off
        if t0 + type_len > len(data) or s0 + str_len > len(data) or type_len % 4:
            raise InputFileError(f"{description}: BTF sections run past the end of the data")
        self.big_endian = e == ">"

        words = array("I")
        if words.itemsize != 4:  # pragma: no cover - every platform we run on
            words = array("L")
        words.frombytes(data[t0:t0 + type_len])
        if (e == ">") != (sys.byteorder == "big"):
            words.byteswap()
        own_strings = data[s0:s0 + str_len]

        if base is None:
            if own_strings[:1] not in (b"", b"\0"):  # split BTF continues its base's strings
                raise _needs_base(description)
            self.first_id = 1
            self.words = words
            self.strings = own_strings
            offsets, kinds = array("I", [0]), bytearray(1)
            start_word = 0
        else:
            self.first_id = base.count
            self.words = base.words + words
            self.strings = base.strings + own_strings
            offsets, kinds = array("I", base.offsets), bytearray(base.kinds)
            start_word = len(base.words)
        if known_index is not None and _fits(known_index, offsets, len(self.words)):
            offsets, kinds = known_index[0], bytearray(known_index[1])
        else:
            self._scan(offsets, kinds, start_word, layout)
        self.offsets: array = offsets
        self.kinds = kinds
        self.count = len(offsets)  # ids 0 .. count-1
        if base is None:
            self._refuse_split_without_base(len(own_strings))
        self._names: dict[int, str] = {}

    # ------------------------------------------------------------------ first pass

    def _scan(self, offsets: array, kinds: bytearray, start: int,
              layout: Optional[Sequence[tuple[int, int]]]) -> None:
        """Record where each type starts and its kind (the only full pass over the data)."""
        head = [0] * 128  # words of the header and fixed part
        element = [0] * 128
        known = [False] * 128
        for k in range(1, len(KIND_NAMES)):
            head[k] = 3 + _FIXED_WORDS.get(k, 0)
            element[k] = _ELEMENT_WORDS.get(k, 0)
            known[k] = True
        if layout:
            for k, (info_sz, elem_sz) in enumerate(layout):
                if k < 128 and not known[k]:
                    head[k], element[k], known[k] = 3 + info_sz // 4, elem_sz // 4, True
        w = self.words
        end = len(w)
        i = start
        add_offset, add_kind = offsets.append, kinds.append
        while i < end:
            if i + 3 > end:  # (a record's header: name, info, size/type)
                break
            info = w[i + 1]
            k = info >> 24 & 0x7F
            if not known[k]:
                raise InputFileError(f"{self.description}: BTF kind {k} (type id "
                                     f"{len(offsets)}) is unknown to this ctracer")
            add_offset(i)
            add_kind(k)
            i += head[k] + (info & 0xFFFFFF) * element[k]
        if i != end:
            raise InputFileError(f"{self.description}: truncated BTF type section")

    def _refuse_split_without_base(self, own_str_len: int) -> None:
        w, offs = self.words, self.offsets
        for tid in range(1, min(self.count, 64)):
            if w[offs[tid]] >= own_str_len:
                raise _needs_base(self.description)

    # ------------------------------------------------------------------ access

    def string(self, off: int) -> str:
        s = self._names.get(off)
        if s is None:
            strings = self.strings
            end = strings.find(b"\0", off)
            if off >= len(strings) or end < 0:
                raise InputFileError(f"{self.description}: string offset {off} out of range")
            s = strings[off:end].decode("utf-8", "replace")
            self._names[off] = s
        return s

    def check_id(self, tid: int) -> None:
        if not 0 < tid < self.count:
            raise InputFileError(f"{self.description}: reference to type {tid}, which does not "
                                 f"exist (ids 1..{self.count - 1})")

    def name(self, tid: int) -> Optional[str]:
        """The name of a type, None when anonymous (and for void)."""
        if tid == 0:
            return None
        off = self.words[self.offsets[tid]]
        return self.string(off) if off else None

    def ref(self, tid: int) -> int:
        """The size/type word of a record."""
        return self.words[self.offsets[tid] + 2]

    def info(self, tid: int) -> int:
        """The info word of type ``tid``'s record."""
        return self.words[self.offsets[tid] + 1]

    def ids_of_kind(self, kind: int) -> list[int]:
        """All type ids of one kind, in id order (a C-speed scan of the kind table)."""
        table = bytearray(256)
        table[kind] = 1
        mask = self.kinds.translate(table)
        mask[0] = 0  # id 0 is void whatever the table says
        return list(compress(range(len(mask)), mask))

    def record(self, tid: int) -> BtfRecord:
        """Decode one type record completely (any kind)."""
        self.check_id(tid)
        w = self.words
        at = self.offsets[tid]
        name_off, info, ref = w[at], w[at + 1], w[at + 2]
        kind = (info >> 24) & _KIND_MASK
        vlen = info & _VLEN_MASK
        kflag = bool(info >> 31)
        name = self.string(name_off) if name_off else None
        p = at + 3
        fixed: tuple = ()
        items: tuple = ()
        s = self.string
        if kind == INT:
            enc = w[p]
            fixed = ((enc >> 24) & 0x0F, (enc >> 16) & 0xFF, enc & 0xFF)
        elif kind == ARRAY:
            fixed = (w[p], w[p + 1], w[p + 2])
        elif kind in (STRUCT, UNION):
            members = []
            for j in range(vlen):
                mn, mt, mo = w[p], w[p + 1], w[p + 2]
                if kflag:
                    members.append((s(mn) if mn else None, mt, mo & 0xFFFFFF, mo >> 24))
                else:
                    members.append((s(mn) if mn else None, mt, mo, 0))
                p += 3
            items = tuple(members)
        elif kind == ENUM:
            values = []
            for j in range(vlen):
                v = w[p + 1]
                if kflag and v >= 0x80000000:  # kind_flag: signed values
                    v -= 1 << 32
                values.append((s(w[p]) if w[p] else "", v))
                p += 2
            items = tuple(values)
        elif kind == ENUM64:
            values = []
            for j in range(vlen):
                v = w[p + 1] | (w[p + 2] << 32)
                if kflag and v >= 1 << 63:
                    v -= 1 << 64
                values.append((s(w[p]) if w[p] else "", v))
                p += 3
            items = tuple(values)
        elif kind == FUNC_PROTO:
            items = tuple((s(w[p + 2 * j]) if w[p + 2 * j] else None, w[p + 2 * j + 1])
                          for j in range(vlen))
        elif kind == VAR:
            fixed = (w[p],)
        elif kind == DATASEC:
            items = tuple((w[p + 3 * j], w[p + 3 * j + 1], w[p + 3 * j + 2]) for j in range(vlen))
        elif kind == DECL_TAG:
            c = w[p]
            fixed = (c - (1 << 32) if c >= 0x80000000 else c,)
        return BtfRecord(tid, kind, name, kflag, vlen, ref, fixed, items)
