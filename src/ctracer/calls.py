"""How a thread's entry and exit events pair into calls: one rule for the report's
analysis (`ctracer.analysis.passes`, once a recording is over) and for ``--tail``
(`ctracer.record.live_objects`, as events arrive), so both see the same calls.

A function reaching the object in several ways has one function row per
way, and each row emits its own entry and exit, one after the other: they are one call.
An entry opens a call, unless it is the next row of the call the thread's last event
opened; an exit closes the next row of the call the thread's last event closed, else
the innermost open call of its function (the calls above it lost their exits, and are
closed with it); an exit the probe saw no entry for (``FLAG_NO_ENTRY``) closes none.
A call is anything with ``function_id``, ``entries`` and ``exits`` (containers of rows).
"""

from __future__ import annotations

from typing import Any, Optional


class Thread:
    """A thread's open calls, innermost last, and the calls its last event opened or
    closed."""

    __slots__ = ("stack", "last_entry", "last_exit")

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.last_entry: Optional[Any] = None
        self.last_exit: Optional[Any] = None


def continues(th: Thread, function_id: int, row: int) -> Optional[Any]:
    """The open call an entry of ``row`` is the next row of, else None (the entry
    opens a call)."""
    call, stack = th.last_entry, th.stack
    if call is not None and stack and stack[-1] is call and call.function_id == function_id \
            and row not in call.entries:
        return call
    return None


def closes(th: Thread, function_id: int, row: int, no_entry: bool) -> Optional[Any]:
    """The call an exit of ``row`` closes (popped from the stack with the calls above
    it), or None; the thread's last entry and exit are updated."""
    call = None
    if not no_entry:
        stack, last = th.stack, th.last_exit
        if last is not None and last.function_id == function_id and row in last.entries \
                and row not in last.exits:
            call = last
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].function_id == function_id:
                    call = stack[i]
                    del stack[i:]
                    break
    th.last_entry, th.last_exit = None, call
    return call
