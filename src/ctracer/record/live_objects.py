"""Which object each event of a recording in progress is, for ``--tail``: the address
and its lifetime, named as the report names it (`ctracer.decode.object_name`:
``0x…`` for an address's first lifetime, ``0x…-2`` for the second, as its pages' folder).

The report finds lifetimes once the recording is over (`ctracer.analysis.passes`' first
pass); `LiveObjects` counts them as events arrive, by the same rules: a lifetime rule
starting one at a hit (an address already seen), a rule ending one at a hit or at a
function's exit (the address's next sighting outside the call still running around the
end is a new object; a hit through a holder, ``skb->sk``, is not such a sighting; an
end after another CPU's creation function handed the address out again since the
freeing call began ends nothing), a creation function returning an address already
seen, an announcing hit whose ``before``
argument is not what the address's last one stored, a head-only object (a time-wait
socket) with another identity, and, for programs without creation functions or rules,
a free-looking function's exit followed by an allocating-looking function's entry.  A
call's exit is never a new object (it is its entry's).  Without the call tree the report
builds, "the call still running around an end" is the thread's open call at the end's
depth until an exit at that depth (of any object) closes it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ctracer.plan.lifetimes import ALLOC_LIKE, FREE_LIKE, LOOKUP_LIKE
from ctracer.decode import object_name


class LiveObjects:
    """Lifetime numbers of addresses as events arrive (see the module docstring)."""

    def __init__(self, rows: Sequence[Any] = (), ending_rows: Sequence[int] = (),
                 has_rules: bool = False):
        """``rows``: the program's function-table rows (`ctracer.tracefile.FunctionRow`);
        ``ending_rows``: the rows whose function's exit ends the object's life;
        ``has_rules``: the trace has lifetime rules."""
        reach = {r.id: r.reach for r in rows}
        names = {r.id: r.name for r in rows}
        self.held = {r.id for r in rows
                     if r.reach == "tracepoint" and "->" in (getattr(r, "via", "") or "")}
        self.creators = {i for i, how in reach.items()
                         if how == "returns" and not LOOKUP_LIKE.search(names[i])}
        #: no creation function nor rule: ends and starts found by names, as the report does
        self.use_names = not any(how == "returns" for how in reach.values()) \
            and not has_rules and not ending_rows
        self.free_like = {i for i, n in names.items() if FREE_LIKE.search(n)}
        self.alloc_like = {i for i, n in names.items() if ALLOC_LIKE.search(n)}
        self.ending_rows = set(ending_rows)
        self.number: dict[int, int] = {}
        #: address -> (thread, depth of the call running around the end, or None)
        self._ended: dict[int, tuple[int, Optional[int]]] = {}
        #: (thread, depth) -> the addresses whose end happened inside that open call
        self._around: dict[tuple[int, int], set[int]] = {}
        self._made: set[int] = set()
        self._freed: set[int] = set()
        self._stored: dict[int, Any] = {}
        self._identity: dict[int, tuple] = {}
        self._split: Optional[int] = None  # the address a new lifetime began at this event
        self._seq = 0                      # events so far
        #: address -> the event its current lifetime began at (its first sighting)
        self._began: dict[int, int] = {}
        #: (thread, function row, depth) -> the event a call of a creation function or of
        #: a function whose exit ends a lifetime began at
        self._entered: dict[tuple[int, int, int], int] = {}

    def name(self, address: int) -> str:
        return object_name(address, self.number.get(address, 1))

    # ------------------------------------------------------------------ events

    def _new(self, address: int) -> bool:
        """A new lifetime of ``address`` begins at this event (once per event)."""
        if self._split == address:
            return False
        self._split = address
        self.number[address] = self.number.get(address, 1) + 1
        self._began[address] = self._seq
        return True

    def event(self, *, row: int, phase: str, tid: int, depth: int) -> None:
        """An event arrives (whatever its object): call first, then `seen` when it has
        an object, then the rules (`start`, `end`, `returned`, `announced`, `identity`)."""
        self._seq += 1
        self._split = None
        if phase == "entry" and (row in self.creators or row in self.ending_rows):
            self._entered[(tid, row, depth)] = self._seq
        elif phase == "exit":
            # the call at this depth returned, whatever its object: the ends that
            # happened inside it are now behind the thread
            for address in self._around.pop((tid, depth), ()):
                if self._ended.get(address) == (tid, depth):
                    self._ended[address] = (tid, None)

    def seen(self, address: int, *, row: int, phase: str, tid: int, depth: int) -> bool:
        """The event (``phase``: entry, exit or hit) shows ``address``; True when it is
        the first of a new lifetime of an address seen before."""
        if address not in self.number:
            self.number[address] = 1
            self._began[address] = self._seq
            self._split = address  # a first sighting is no new lifetime, nor is a rule's
            return False
        if phase == "exit":
            if self.use_names and row in self.free_like:
                self._freed.add(address)
            return False
        new = False
        ended = self._ended.get(address)
        if ended is not None and not (phase == "hit" and row in self.held):
            inside = ended[0] == tid and ended[1] is not None and depth > ended[1]
            if not inside:
                del self._ended[address]
                self._made.discard(address)
                new = self._new(address)
        if phase == "entry" and self.use_names and row in self.alloc_like \
                and address in self._freed:
            self._freed.discard(address)
            self._made.discard(address)
            new = self._new(address) or new
        return new

    def start(self, address: int) -> bool:
        """A lifetime rule starts a lifetime at this hit (unless a creation function's
        return began the current one)."""
        if address in self._made:
            return False
        self._ended.pop(address, None)
        self._freed.discard(address)
        return self._new(address)

    def end(self, address: int, tid: int, depth: Optional[int],
            since: Optional[int] = None) -> bool:
        """A rule ends the address's lifetime here; ``depth``: that of the traced call
        still running around the end on ``tid`` (None: none); ``since``: the event the
        ending call began at (default: this one).  A lifetime begun since (another CPU
        allocated the address while the freeing call was returning) is not ended (False),
        and an end pending inside a call still running on the thread keeps its place."""
        since = self._seq if since is None else since
        if self.number.get(address, 1) > 1 and self._began.get(address, -1) > since:
            return False
        ended = self._ended.get(address)
        if ended is not None and ended[0] == tid and ended[1] is not None \
                and depth is not None and depth > ended[1]:
            return True
        self._ended[address] = (tid, depth)
        if depth is not None:
            self._around.setdefault((tid, depth), set()).add(address)
        return True

    def exit_ends(self, address: int, *, row: int, tid: int, depth: int) -> bool:
        """The exit (at ``depth``) of a function whose exit ends the object's life:
        whether it ended it (see `end`)."""
        since = self._entered.pop((tid, row, depth), None)
        return self.end(address, tid, depth - 1 if depth > 0 else None, since)

    def returned(self, address: int, *, row: int, tid: int, depth: int) -> bool:
        """A creation function returned ``address`` (at this exit): a new lifetime,
        unless the current one began inside this call (a nested allocator's: this call
        owns it)."""
        self._ended.pop(address, None)
        self._freed.discard(address)
        self._made.add(address)
        since = self._entered.pop((tid, row, depth), self._seq)
        if address not in self.number:
            self.number[address] = 1
            self._began[address] = since
            return False
        if self._began.get(address, 0) >= since:
            return False
        new = self._new(address)
        self._began[address] = since
        return new

    def announced(self, address: int, before: Any, stored: Any) -> bool:
        """An announcing hit: ``before`` (``oldstate``) not what the address's last
        announcing hit stored is another object; ``stored`` is remembered."""
        last = self._stored.get(address)
        new = last is not None and before is not None and before != last \
            and self.start(address)
        if stored is not None:
            self._stored[address] = stored
        return new

    def identity(self, address: int, identity: tuple) -> bool:
        """A head-only event with ``identity`` (a time-wait socket's addresses and
        ports): another one than the address's last is another object."""
        last = self._identity.get(address)
        self._identity[address] = identity
        return last is not None and last != identity and self.start(address)
