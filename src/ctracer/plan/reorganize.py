"""Reorder struct members to close holes, the way pahole's ``--reorganize`` does.

Works on plain `Item`s (name, size, alignment) so it can be used and tested apart from
any type model; `ctracer.plan.mini` feeds it the fields of a mini struct.

Members are laid out like a C compiler would: in order, each at the next offset that is a
multiple of its alignment, the whole rounded up to the largest alignment.  The search
follows pahole's ``class__reorganize`` (dwarves_reorganize.c), restarting after every move:

1. for each member followed by a hole, move into the hole the first later member that
   itself has a hole after it and fits (size and alignment) -- never the member right
   after the hole, which may be there because of an explicit alignment;
2. if the struct has tail padding, move the last member into a hole it fits in;
3. when nothing of the above applies, fill the remaining holes with members taken from
   the end of the struct (again never the member right after the hole).

pahole's bitfield demotion is compiled out upstream and is not done here.  Unlike pahole,
a move is kept only when it does not make the layout worse (larger, or as large with
more hole bytes or more holes) and leads to an order not seen before, so the result is
never larger than the input and the loop always ends.  A move that changes nothing in
size can open the way for the next one (pahole relies on that too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence


@dataclass(frozen=True)
class Item:
    """One member to place: ``alignment`` must be a power of two."""

    name: str
    size: int
    alignment: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"{self.name}: negative size")
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise ValueError(f"{self.name}: alignment {self.alignment} is not a power of two")


@dataclass(frozen=True)
class Placement:
    """Items at their offsets, and the size of the struct holding them."""

    items: tuple[Item, ...]
    offsets: tuple[int, ...]
    size: int

    @property
    def holes(self) -> tuple[int, ...]:
        """Bytes of hole after each item (the last item's is 0: that is `padding`)."""
        out = []
        for i, item in enumerate(self.items):
            if i + 1 < len(self.items):
                out.append(self.offsets[i + 1] - self.offsets[i] - item.size)
            else:
                out.append(0)
        return tuple(out)

    @property
    def padding(self) -> int:
        """Bytes after the last item up to the size."""
        if not self.items:
            return self.size
        return self.size - self.offsets[-1] - self.items[-1].size

    @property
    def hole_bytes(self) -> int:
        """Bytes of holes between items."""
        return sum(self.holes)

    @property
    def cost(self) -> tuple[int, int, int]:
        """What a packing minimizes, in order: size, hole bytes, holes."""
        holes = self.holes
        return (self.size, sum(holes), sum(1 for h in holes if h))


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def place(items: Iterable[Item]) -> Placement:
    """Lay items out in the given order at their natural alignment, like a C compiler."""
    items = tuple(items)
    offsets, at, align = [], 0, 1
    for item in items:
        at = _align_up(at, item.alignment)
        offsets.append(at)
        at += item.size
        align = max(align, item.alignment)
    return Placement(items, tuple(offsets), _align_up(at, align))


def _fits_after(layout: Placement, index: int, item: Item) -> bool:
    """Would `item`, put right after member `index`, end before the next member starts?"""
    end = layout.offsets[index] + layout.items[index].size
    next_start = layout.offsets[index + 1]
    return _align_up(end, item.alignment) + item.size <= next_start


def _moved(items: Sequence[Item], source: int, after: int) -> list[Item]:
    order = list(items)
    item = order.pop(source)
    order.insert(after + 1 if source > after else after, item)
    return order


def _candidates(layout: Placement) -> Iterable[tuple[int, int]]:
    """(member to move, member to put it after), in the order pahole tries them."""
    items, holes = layout.items, layout.holes
    last = len(items) - 1
    for i in range(last):
        if not holes[i]:
            continue
        for j in range(i + 2, last + 1):
            if holes[j] and items[j].size and _fits_after(layout, i, items[j]):
                yield j, i
                break
        if layout.padding and i != last and items[last].size and i + 1 != last \
                and _fits_after(layout, i, items[last]):
            yield last, i
    for i in range(last):
        if not holes[i]:
            continue
        for j in range(last, i + 1, -1):
            if items[j].size and _fits_after(layout, i, items[j]):
                yield j, i
                break


def reorganize(items: Iterable[Item], steps: Optional[list[Placement]] = None) -> Placement:
    """The items reordered to shrink holes and padding; never larger than the input order.

    When ``steps`` is a list, every accepted layout (the first is the input) is appended
    to it, like pahole's ``--show_reorg_steps``.
    """
    layout = place(items)
    best = layout
    seen = {tuple(i.name for i in layout.items)}
    if steps is not None:
        steps.append(layout)
    while True:
        for source, after in _candidates(layout):
            order = _moved(layout.items, source, after)
            names = tuple(i.name for i in order)
            if names in seen:
                continue
            trial = place(order)
            if trial.cost <= layout.cost:
                seen.add(names)
                layout = trial
                best = min(best, layout, key=lambda p: p.cost)
                if steps is not None:
                    steps.append(layout)
                break
        else:
            return best
