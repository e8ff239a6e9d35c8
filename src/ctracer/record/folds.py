"""Moving ``--calls changes``' folded calls from the kernel into the trace file.

The programs add to one of two fold maps (`ctracer.probes.folding`).  At each commit
of the recorder (`EventSink.flush`, every quarter of a second), `FoldDrain` empties the
map the programs left one commit ago (nothing adds to it any more), writes its rows to
the trace file's ``folded_calls`` (`ctracer.tracefile.folds`) and commits, then turns the
programs to that map: the other one is read at the next commit.  At the end (the
probes stopped) both are read.  A SIGKILL keeps every row committed before it, as it
keeps the events.
"""

from __future__ import annotations

from typing import Optional

from ctracer.tracefile import folds


class FoldDrain:
    """Empties the kernel's fold maps into the trace file's ``folded_calls``, one map per
    commit."""

    @classmethod
    def of(cls, program, session) -> Optional["FoldDrain"]:
        """A drain for ``program`` when it folds calls (``--calls changes``), else None."""
        return cls(session) if getattr(program, "calls", "all") == "changes" else None

    def __init__(self, session) -> None:
        self.session = session
        self.tables = False
        self.rows = 0      # rows written
        self.calls = 0     # calls those rows count
        self.refused = 0   # folds that found their map full (written as events)

    def flush(self, db, final: bool = False) -> None:
        """Write the idle map's rows (both maps' when ``final``) and commit."""
        if not self.tables:
            folds.create(db)
            self.tables = True
        active = self.session.fold_generation()
        idle = active ^ 1
        taken = self.session.take_folds(idle)
        if final:
            taken += self.session.take_folds(active)
            self.refused = self.session.folds_refused()
        else:
            self.session.fold_generation(idle)
        self.rows += folds.add(db, taken)
        self.calls += sum(int(r[4]) for r in taken)
        db.commit()
