"""Kernel text addresses as ``symbol+offset``, from the running kernel's /proc/kallsyms.

A tracepoint argument such as ``kfree_skb``'s ``location`` (the caller's return
address) reads as ``0xffffffff81e9dde7``; an engineer reads ``tcp_v4_rcv+0x1a7``.  Only
the recording host can say that (its kernel, its KASLR offset), so the addresses the
trace holds in such arguments are resolved when the recording ends and stored in the
trace's meta (``kernel_symbols``: hex address → text), which the report and exports
read on any machine; ``--tail`` resolves them as they arrive.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Optional

#: pointer arguments of tracepoints that hold a code address, by name
TEXT_ARGUMENTS = frozenset({"location", "ip", "caller", "call_site", "ret_ip", "func"})
KALLSYMS = "/proc/kallsyms"


def text_arguments(tracepoint_args: Optional[dict]) -> set[str]:
    """The names of the pointer arguments of ``tracepoint_args`` (the trace's meta) that
    hold code addresses."""
    names = set()
    for args in (tracepoint_args or {}).values():
        for a in args if isinstance(args, list) else ():
            if isinstance(a, dict) and a.get("kind") == "pointer" \
                    and a.get("name") in TEXT_ARGUMENTS:
                names.add(str(a["name"]))
    return names


class Kallsyms:
    """The kernel's text symbols, sorted by address (read once, on first use)."""

    def __init__(self, path: str = KALLSYMS):
        self.path = path
        self._starts: Optional[list[int]] = None
        self._names: list[tuple[str, str]] = []   # (symbol, " [module]" or "")

    def _load(self) -> None:
        starts, names = [], []
        try:
            with open(self.path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] in ("t", "T"):
                        address = int(parts[0], 16)
                        if address:  # zeros: kptr_restrict hides the addresses
                            module = f" [{parts[3].strip('[]')}]" if len(parts) > 3 else ""
                            starts.append(address)
                            names.append((parts[2], module))
        except OSError:
            pass
        order = sorted(range(len(starts)), key=starts.__getitem__)
        self._starts = [starts[i] for i in order]
        self._names = [names[i] for i in order]

    def name(self, address: int) -> Optional[str]:
        """``symbol+0xoff`` for a code address, None when it is in no known symbol (or
        past the last by more than a page: not text)."""
        if self._starts is None:
            self._load()
        starts = self._starts or []
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or address - starts[i] >= (1 << 16):
            return None
        offset = address - starts[i]
        name, module = self._names[i]
        return name + (f"+0x{offset:x}" if offset else "") + module

    def names(self, addresses: Iterable[int]) -> dict[str, str]:
        """The meta entry ``kernel_symbols`` for ``addresses``."""
        out = {}
        for a in addresses:
            text = self.name(a)
            if text:
                out[f"0x{a:x}"] = text
        return out
