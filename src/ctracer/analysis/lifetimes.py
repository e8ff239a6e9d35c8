"""Where each address's lifetimes start, and why: filled while the calls are paired
(`ctracer.analysis.passes`), read when events are placed on their objects."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ctracer.analysis.model import ObjectKey


class Lifetimes:
    """Where each address's lifetimes start (as indexes into the time-ordered rows) and why."""

    def __init__(self) -> None:
        self.first_seen: dict[int, int] = {}
        self.first_reason: dict[int, str] = {}
        self.starts: dict[int, list[tuple[int, str]]] = {}
        self._freed_by: dict[int, str] = {}
        #: address -> (why, thread, the call it happened in) of an end not yet passed
        #: (read by the pairing's loop to skip `seen_again` where nothing ended)
        self.ended: dict[int, tuple[str, int, Any]] = {}
        #: addresses whose current lifetime a creation function's return began
        self._made: set[int] = set()

    def seen(self, address: int, at: int, function: str) -> None:
        """The address is seen at row ``at`` in ``function``: its first sighting is
        remembered as the first lifetime's start."""
        if address not in self.first_seen:
            self.first_seen[address] = at
            self.first_reason[address] = f"first seen in {function}"

    def returned(self, address: int, at: int, function: str) -> None:
        """A creation function entered at row ``at`` returned ``address``."""
        reason = f"returned by {function}"
        self._freed_by.pop(address, None)
        self.ended.pop(address, None)
        self._made.add(address)
        starts = self.starts.setdefault(address, [])
        if starts and starts[-1][0] >= at:
            # a lifetime begun inside this call (a nested allocator): this call owns it
            starts[-1] = (at, reason)
        elif self.first_seen.get(address, at) >= at and not starts:
            self.first_reason[address] = reason
        else:
            starts.append((at, reason))

    def rule_starts(self, address: int, at: int, why: str) -> None:
        """A lifetime rule says the hit at row ``at`` is the first of a new lifetime,
        unless a creation function's return began the current one (and nothing ended
        it since): the rule stands in for creations a trace does not see."""
        if address in self._made:
            return
        self._freed_by.pop(address, None)
        self.ended.pop(address, None)
        starts = self.starts.get(address)
        if self.first_seen.get(address, at) >= at and not starts:
            self.first_seen.setdefault(address, at)
            self.first_reason[address] = why
        elif not (starts and starts[-1][0] == at):  # an ending rule already split here
            self.starts.setdefault(address, []).append((at, why))

    def rule_ends(self, address: int, why: str, tid: int = -1,
                  within: Optional[Any] = None, since: int = -1) -> None:
        """A lifetime rule says this hit (or the exit of the call entered at row
        ``since``) is the last of the address's lifetime, on thread ``tid`` inside the
        traced call ``within`` still running there (None: none): its next sighting
        outside that call starts a new one (`seen_again`).  A lifetime begun since
        (another CPU allocated the address while the freeing call was returning) is not
        ended; an end pending inside a call still running keeps its place."""
        starts = self.starts.get(address)
        if starts and starts[-1][0] > since:
            return
        ended = self.ended.get(address)
        if ended is not None and ended[1] == tid and ended[2] is not None and within is not None \
                and within.depth > ended[2].depth:
            return
        self.ended[address] = (why, tid, within)

    def seen_again(self, address: int, at: int, tid: int = -1,
                   stack: Sequence[Any] = (), around: int = 0) -> None:
        """The address is seen at row ``at`` on ``tid``, inside the first ``around``
        calls of the thread's ``stack``; after an end, a new lifetime starts here unless
        this is still inside the call the end happened in (the rest of the freeing call
        on that thread)."""
        ended = self.ended.get(address)
        if ended is None:
            return
        within = ended[2]
        if ended[1] == tid and within is not None and \
                any(stack[i] is within for i in range(around)):
            return
        del self.ended[address]
        self._made.discard(address)
        self.starts.setdefault(address, []).append((at, f"after {ended[0]}"))

    def freed(self, address: int, function: str) -> None:
        """A function named like a free (``function``) took the address."""
        self._freed_by[address] = function

    def maybe_reallocated(self, address: int, at: int, function: str) -> None:
        """A function named like an allocation returned the address at row ``at``: after a
        free, a new lifetime starts there (lifetimes by name)."""
        freed_by = self._freed_by.pop(address, None)
        if freed_by is not None:
            self._made.discard(address)
            self.starts.setdefault(address, []).append(
                (at, f"{function} after {freed_by} (by name)"))

    def reason(self, key: ObjectKey) -> str:
        """Why lifetime ``key`` starts, in words."""
        if key.lifetime == 1:
            return self.first_reason.get(key.address, "first seen")
        return self.starts[key.address][key.lifetime - 2][1]
