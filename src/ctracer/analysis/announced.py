"""Pass 6 of the report: a change a tracepoint announces is shown on its own row.

`ctracer.plan.stores` says which tracepoints fire just before a store and which
argument holds the value stored (``inet_sock_set_state``: ``skc_state`` ←
``newstate``); the trace's meta carries the rules placed.  Diffing snapshots alone
shows such a change at the object's next hit, whatever function that is.  This pass,
per object and in time order, adds the change ``old → argument`` to the announcing row
(cause `CAUSE_ANNOUNCED`, no function credited: the tracepoint's caller makes the
store) and takes back the delayed copy the next snapshot showed; if the value moved on
before that snapshot, the snapshot's change then starts from the announced value.
Series and each object's change list follow.  Never across lifetimes: an object is
one lifetime.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ctracer.event import FLAG_READ_FAILED, PHASE_TRACEPOINT
from ctracer.plan import stores
from ctracer.report.data import CAUSE_ANNOUNCED, Change, ObjectTimeline, Points


def announce_changes(objects: Sequence[ObjectTimeline], names: dict[int, str],
                     meta_rules: Optional[Sequence[dict]], start_ns: int) -> None:
    """Apply the trace's ``announced_stores`` (its meta) to ``objects``; ``names``: the
    function table's display names by id (tracepoints as ``tp:NAME``)."""
    by_tp = stores.rules_by_tracepoint(meta_rules)
    rule_of = {fid: by_tp[n[3:]] for fid, n in names.items()
               if n.startswith("tp:") and n[3:] in by_tp}
    if not rule_of:
        return
    for obj in objects:
        if any(r.phase == PHASE_TRACEPOINT and r.function_id in rule_of for r in obj.rows):
            _announce(obj, rule_of, start_ns)


def _announce(obj: ObjectTimeline, rule_of: dict, start_ns: int) -> None:
    touched = set()
    current: dict[str, object] = {f: (p[0][1] if len(p) else None)
                                  for f, p in obj.series.items()}
    pending: dict[str, object] = {}
    for row in obj.rows:
        for c in list(row.changes or ()):
            if c.field in pending:
                want = pending.pop(c.field)
                if c.new == want:   # the announced store, seen late: shown already
                    row.changes.remove(c)
                    touched.add(c.field)
                    continue
                c.old = want        # the value moved on after the announced store
                touched.add(c.field)
            current[c.field] = c.new
        if row.changes == []:
            row.changes = None
        rule = rule_of.get(row.function_id) if row.phase == PHASE_TRACEPOINT else None
        if rule is None or row.flags & FLAG_READ_FAILED or rule.field not in current:
            continue
        done = stores.apply(rule, current, row.arguments())
        if done is None:
            continue
        old, new = done
        change = Change(rule.field, old, new, row.seq, row.ts_ns - start_ns, obj.key,
                        None, -1, CAUSE_ANNOUNCED, f"tp:{rule.tracepoint}")
        row.changes = (row.changes or []) + [change]
        pending[rule.field] = new
        touched.add(rule.field)
    if not touched:
        return
    obj.changes = [c for row in obj.rows for c in (row.changes or ())]
    for name in touched:
        first = obj.series[name]
        points = Points(first[i] for i in range(min(1, len(first))))
        for c in obj.changes:
            if c.field == name:
                points.append((c.ts_ns, c.new))
        obj.series[name] = points
