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
call's exit is never a new object (it is its entry's).

"The call still running around an end" is a call of the thread's calls, which
`LiveObjects` pairs as the report pairs them (one rule, `ctracer.calls`): an entry opens
a call (or is the next row of the call it just opened), an exit closes the innermost
open call of its function (the calls above it lost their exits), an exit the probe saw
no entry for closes none.  The depth the probes record is not used: a probe that could
not keep its thread's state (task storage busy on the CPU) records a wrong one.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ctracer.calls import Thread, closes, continues
from ctracer.decode import object_name
from ctracer.event import FLAG_NO_ENTRY, canonical_ids
from ctracer.plan.lifetime_rules import row_roles


class _Call:
    """A call of a thread (`ctracer.calls`): its function, the event its first entry
    was, how many calls are open below it, the function rows entered and exited, and the object
    each entry showed with its lifetime number then."""

    __slots__ = ("function_id", "seq", "depth", "entries", "exits")

    def __init__(self, function_id: int, seq: int, depth: int):
        self.function_id, self.seq, self.depth = function_id, seq, depth
        #: function row -> the address its entry showed and that address's lifetime number then
        self.entries: dict[int, tuple[int, int]] = {}
        self.exits: set[int] = set()


class LiveObjects:
    """Lifetime numbers of addresses as events arrive (see the module docstring)."""

    def __init__(self, rows: Sequence[Any] = (), ending_rows: Sequence[int] = (),
                 has_rules: bool = False):
        """``rows``: the program's function-table rows (`ctracer.event.FunctionRow`);
        ``ending_rows``: the rows whose function's exit ends the object's life;
        ``has_rules``: the trace has lifetime rules."""
        roles = row_roles(rows)
        self.canon = canonical_ids(rows)
        self.held, self.creators = roles.held, roles.creators
        #: no creation function nor rule: ends and starts found by names, as the report does
        self.use_names = roles.use_names(has_rules or bool(ending_rows))
        self.free_like, self.alloc_like = roles.free_like, roles.alloc_like
        self.ending_rows = set(ending_rows)
        self.number: dict[int, int] = {}
        #: address -> (thread, the call running around the end there, or None)
        self._ended: dict[int, tuple[int, Optional[_Call]]] = {}
        self._made: set[int] = set()
        self._freed: set[int] = set()
        self._stored: dict[int, Any] = {}
        self._identity: dict[int, tuple] = {}
        self._split: Optional[int] = None  # the address a new lifetime began at this event
        self._seq = 0                      # events so far
        #: address -> the event its current lifetime began at (its first sighting)
        self._began: dict[int, int] = {}
        self._threads: dict[int, Thread] = {}
        #: the current event's thread, its open calls, how many of them run around the
        #: event (an entry's own call does not), and the call it entered or exited
        self._tid = 0
        self._stack: list[_Call] = []
        self._around = 0
        self._call: Optional[_Call] = None

    def name(self, address: int) -> str:
        """The object's name as the pages give it (``ADDRESS``, ``ADDRESS-2``...)."""
        return object_name(address, self.number.get(address, 1))

    def event_name(self, address: int, *, row: int, phase: str) -> str:
        """The name of the object an event shows, once its rules are applied: an exit's
        is its entry's when both show the address (a call is one lifetime's, even when
        another CPU's creation function handed the address out again meanwhile), unless
        the function creates objects (its exit's object is the one it made)."""
        call = self._call
        if call is not None and phase == "entry":
            call.entries[row] = (address, self.number.get(address, 1))
        elif call is not None and phase == "exit":
            entered = call.entries.get(row)
            if entered is not None and address and entered[0] == address \
                    and row not in self.creators:
                return object_name(address, entered[1])
        return self.name(address)

    # ------------------------------------------------------------------ events

    def _new(self, address: int) -> bool:
        """A new lifetime of ``address`` begins at this event (once per event)."""
        if self._split == address:
            return False
        self._split = address
        self.number[address] = self.number.get(address, 1) + 1
        self._began[address] = self._seq
        return True

    def event(self, *, row: int, phase: str, tid: int, flags: int = 0) -> None:
        """An event arrives (whatever its object; ``phase``: entry, exit or tracepoint, with
        the header's ``flags``): its call is paired first, then `seen` when it has an
        object, then the rules (`start`, `end`, `returned`, `exit_ends`, `announced`,
        `identity`)."""
        self._seq += 1
        self._split = None
        th = self._threads.get(tid)
        if th is None:
            th = self._threads[tid] = Thread()
        stack, function, call = th.stack, self.canon.get(row, row), None
        if phase == "entry":
            call = continues(th, function, row)
            if call is None:
                call = _Call(function, self._seq, len(stack))
                stack.append(call)
            call.entries[row] = (0, 0)   # its object, once its rules are applied
            th.last_entry, th.last_exit = call, None
            self._around = len(stack) - 1
        elif phase == "exit":
            call = closes(th, function, row, bool(flags & FLAG_NO_ENTRY))
            if call is not None:
                call.exits.add(row)
            self._around = len(stack)
        else:
            self._around = len(stack)
        self._tid, self._stack, self._call = tid, stack, call

    def seen(self, address: int, *, row: int, phase: str) -> bool:
        """The current event (``phase``: entry, exit or tracepoint) shows ``address``; True
        when it is the first of a new lifetime of an address seen before."""
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
        if ended is not None and not (phase == "tracepoint" and row in self.held):
            tid, within = ended
            inside = tid == self._tid and within is not None \
                and any(c is within for c in self._stack[:self._around])
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

    def end(self, address: int, since: Optional[int] = None) -> bool:
        """A rule ends the address's lifetime at the current event, inside the thread's
        innermost open call (the rest of it is still the object's); ``since``: the
        event the ending call began at (default: this one).  A lifetime begun since
        (another CPU allocated the address while the freeing call was returning) is not
        ended (False), and an end pending inside a call still running on the thread
        keeps its place."""
        since = self._seq if since is None else since
        if self.number.get(address, 1) > 1 and self._began.get(address, -1) > since:
            return False
        within = self._stack[-1] if self._stack else None
        ended = self._ended.get(address)
        if ended is not None and ended[0] == self._tid and ended[1] is not None \
                and within is not None and within.depth > ended[1].depth:
            return True
        self._ended[address] = (self._tid, within)
        return True

    def exit_ends(self, address: int) -> bool:
        """The current event, the exit of a function whose exit ends the object's life:
        whether it ended it (see `end`; an exit whose call was not seen ends nothing)."""
        if self._call is None:
            return False
        return self.end(address, self._call.seq)

    def returned(self, address: int) -> bool:
        """A creation function returned ``address`` (at the current exit): a new
        lifetime, unless the current one began inside this call (a nested allocator's:
        this call owns it).  An exit whose call was not seen makes nothing."""
        if self._call is None:
            return False
        self._ended.pop(address, None)
        self._freed.discard(address)
        self._made.add(address)
        since = self._call.seq
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
