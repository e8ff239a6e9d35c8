"""The trace file: a versioned SQLite database that carries everything needed to render.

Tables:

* ``meta(key, value)``: schema version, the trace's id (``trace_id``, random), the
  traced struct, its mini layout (JSON of `ctracer.event.Layout`), the full struct
  layout as text, host, kernel release, argv, start/end times, event and lost counts;
* ``functions``: the probed functions, one row per route to the object (its route kind
  and route text in the columns ``reach`` and ``via``), and whether its probes attached;
* ``events``: one row per probe hit, the header decoded into columns and the mini
  snapshot kept as raw bytes (decoded with the layout in ``meta``); ``phase`` is 0 for
  an entry, 1 for an exit, 2 for a tracepoint (`ctracer.event.PHASE_NAMES`: an event's phase), and
  ``args`` holds a tracepoint hit's arguments as a JSON object by parameter name
  (``{"oldstate": 7, "newstate": 2}``; NULL for entry/exit events).  The meta entry
  ``tracepoint_args`` says, per function id, each argument's name, C type (``s64``
  or ``u64``: how the raw slot reads), kind and C type text;
* ``spool``: batches of raw events exactly as the ring buffer delivered them.  From
  schema 4 a recording's events stay there, raw, and every reader decodes them with a
  numpy dtype built from the event layout (`RawDecoder`): decoding them into ``events``
  rows cost the recorder more than the ring buffer delivers in a flood, and reading
  rows back cost readers more than the rest of their work.  Schemas 2 and 3 moved them
  into ``events`` (the first reader of such a file finishes the move).  ``events`` rows
  are still written by `TraceWriter.add_event` (synthetic traces); an event's ``seq``
  is its rowid there, and for raw events the next numbers, in the order recorded.

Nothing recorded is lost: while recording, the writer commits the raw events it got
every few hundred milliseconds (`TraceWriter.add_raw`, one small transaction in SQLite's
write-ahead log).  After a SIGKILL or a crash the file holds every batch committed
before it; the first reader to open it (`Trace`), finding no live recorder (the
recorder holds an exclusive ``flock`` on the file), marks the trace incomplete and says
where it ends (`Trace.incomplete`).  A finished file is a
single self-contained database (the log is folded back in), created 0600 without
following symlinks; an existing file at the path is kept as ``FILE.old``
(`ctracer.files`).

The reader (`Trace`) is all the report stage needs, so a trace recorded on one machine
renders on another; a damaged or truncated file, one from a newer ctracer, and a file
that is not a trace at all each get their own one-line message.
"""

from ctracer.tracefile.format import (READABLE_VERSIONS, SCHEMA_VERSION, STATE_FINISHED,
                                      STATE_INTERRUPTED, STATE_RECORDING, Event, RawDecoder,
                                      to_sql_u64)
from ctracer.tracefile.meta import (TraceMeta, add_meta, meta_json, meta_text, read_meta,
                                     trace_id_of)
from ctracer.tracefile.reader import Trace, decoding_progress
from ctracer.tracefile.writer import TraceWriter

__all__ = ["READABLE_VERSIONS", "SCHEMA_VERSION", "STATE_FINISHED", "STATE_INTERRUPTED",
           "STATE_RECORDING", "Event", "RawDecoder", "Trace", "TraceMeta", "TraceWriter",
           "add_meta", "decoding_progress", "meta_json", "meta_text", "read_meta", "to_sql_u64",
           "trace_id_of"]
