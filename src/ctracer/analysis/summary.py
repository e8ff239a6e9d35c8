"""What the trace says about itself (its meta table), ready to show: `TraceSummary`."""

from __future__ import annotations

import datetime
import json

from ctracer.analysis.functions import attached_fully
from ctracer.analysis.model import TraceSummary
from ctracer.tracefile import Trace


def trace_summary(trace: Trace, events: int) -> TraceSummary:
    """The trace's meta table as the summary shows it: struct, host, kernel, command,
    probes, limits, with ``events`` events."""
    def text(key: str) -> str:
        shown = trace.meta.text(key)
        return "" if shown.strip() == "null" and trace.meta[key] == shown else shown

    def words(key: str) -> list[str]:
        v = trace.meta.get(key)
        if v is None:
            return []
        try:
            decoded = json.loads(v)
        except ValueError:
            return [v]
        if isinstance(decoded, list):
            return [str(x) for x in decoded]
        return [] if decoded is None else [str(decoded)]

    def when(*keys: str) -> str:
        key = next((k for k in keys if trace.meta.get(k) is not None), None)
        if key is None:
            return ""
        v = trace.meta[key]
        try:
            number = float(json.loads(v))
        except (ValueError, TypeError):
            try:  # ISO 8601, as the recorder writes it
                stamp = datetime.datetime.fromisoformat(text(key))
            except ValueError:
                return text(key)
            if stamp.tzinfo is not None:
                stamp = stamp.astimezone(datetime.timezone.utc)
                return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
            return stamp.strftime("%Y-%m-%d %H:%M:%S")
        if number > 1e12:  # ns since the epoch
            number /= 1e9
        stamp = datetime.datetime.fromtimestamp(number, tz=datetime.timezone.utc)
        return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")

    def count(key: str) -> Optional[int]:
        v = trace.meta.json(key) if key in trace.meta else None
        if isinstance(v, dict):
            return sum(int(x) for x in v.values())
        try:
            return int(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    def mapping(key: str) -> dict:
        v = trace.meta.json(key) if key in trace.meta else None
        return v if isinstance(v, dict) else {}

    functions = sorted(trace.functions.values(), key=lambda f: (f.name, f.id))
    failed = [f for f in functions if f.attached and not attached_fully(f.attached)]
    return TraceSummary(
        struct_name=trace.struct_name, struct_kind=trace.struct_kind,
        target=text("target") or text("binary"), host=text("host"),
        kernel_release=text("kernel_release"), argv=words("argv"), command=words("command"),
        pid=text("pid") if text("pid") not in ("", "null") else "",
        stopped_by=text("stopped_by"),
        started_at=when("started_at", "start_time"), ended_at=when("ended_at", "end_time"),
        events=events, events_claimed=count("events"),
        lost_events=count("lost_events") or 0, full_layout=text("full_layout"),
        trace_path=trace.path, functions=functions, failed_probes=failed,
        probe_kinds=str(mapping("probe_plan").get("kinds") or ""),
        probe_misses={str(k): int(v) for k, v in mapping("probe_misses").items()
                      if isinstance(v, (int, float)) and v})
