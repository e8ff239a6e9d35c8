"""Where each address's lifetimes start, and why: filled while the calls are paired
(`ctracer.analysis.passes`), read when events are placed on their objects."""

from __future__ import annotations

import bisect
from typing import Optional

from ctracer.analysis.model import ObjectKey


class Lifetimes:
    """Where each address's lifetimes start (as indexes into the time-ordered rows) and why."""

    def __init__(self) -> None:
        self.first_seen: dict[int, int] = {}
        self.first_reason: dict[int, str] = {}
        self.starts: dict[int, list[tuple[int, str]]] = {}
        self._freed_by: dict[int, str] = {}
        self._ended: dict[int, str] = {}
        self._positions: dict[int, list[int]] = {}

    def seen(self, address: int, at: int, function: str) -> None:
        if address not in self.first_seen:
            self.first_seen[address] = at
            self.first_reason[address] = f"first seen in {function}"

    def returned(self, address: int, at: int, function: str) -> None:
        """A creation function entered at row ``at`` returned ``address``."""
        reason = f"returned by {function}"
        self._freed_by.pop(address, None)
        starts = self.starts.setdefault(address, [])
        if starts and starts[-1][0] >= at:
            # a lifetime begun inside this call (a nested allocator): this call owns it
            starts[-1] = (at, reason)
        elif self.first_seen.get(address, at) >= at and not starts:
            self.first_reason[address] = reason
        else:
            starts.append((at, reason))

    def rule_starts(self, address: int, at: int, why: str) -> None:
        """A lifetime rule says the hit at row ``at`` is the first of a new lifetime."""
        self._freed_by.pop(address, None)
        starts = self.starts.get(address)
        if self.first_seen.get(address, at) >= at and not starts:
            self.first_seen.setdefault(address, at)
            self.first_reason[address] = why
        elif not (starts and starts[-1][0] == at):  # an ending rule already split here
            self.starts.setdefault(address, []).append((at, why))

    def rule_ends(self, address: int, why: str) -> None:
        """A lifetime rule says this hit is the last of the address's lifetime: its next
        sighting starts a new one (`seen_again`)."""
        self._ended[address] = why

    def seen_again(self, address: int, at: int) -> None:
        why = self._ended.pop(address, None)
        if why is not None:
            self.starts.setdefault(address, []).append((at, f"after {why}"))

    def freed(self, address: int, function: str) -> None:
        self._freed_by[address] = function

    def maybe_reallocated(self, address: int, at: int, function: str) -> None:
        freed_by = self._freed_by.pop(address, None)
        if freed_by is not None:
            self.starts.setdefault(address, []).append(
                (at, f"{function} after {freed_by} (by name)"))

    def lifetime_of(self, address: int, at: int) -> int:
        """Which lifetime of ``address`` the row at ``at`` belongs to (call once recording
        is over: start positions are cached)."""
        starts = self.starts.get(address)
        if not starts:
            return 1
        positions = self._positions.get(address)
        if positions is None:
            positions = self._positions[address] = [s for s, _ in starts]
        return 1 + bisect.bisect_right(positions, at)

    def reason(self, key: ObjectKey) -> str:
        if key.lifetime == 1:
            return self.first_reason.get(key.address, "first seen")
        return self.starts[key.address][key.lifetime - 2][1]
