"""Network device names by interface index, from the recording host.

``sk_buff.skb_iif`` (the device a packet came in on), ``sock.sk_rx_dst_ifindex`` and
``skc_bound_dev_if`` hold an ifindex; an engineer reads ``lo`` or ``eth0``.  Only the
recording host can say which device an index was (another machine has other devices,
or none of that index), so the recorder reads the host's devices when recording starts
and again when it ends (a device made during the recording, a veth pair, is named; one
made and removed within it is not) and stores them in the trace's meta
(``net_devices``: ifindex as text → name; the end's name where a device was renamed),
which the report and ``--tail`` read (`ctracer.report.values.ValueFormatter`).  The
indexes are those of the recorder's network namespace: a packet of another namespace
may carry an index named differently there, or not at all.
"""

from __future__ import annotations

import socket
from typing import Optional


def read() -> dict[str, str]:
    """This host's devices (in this network namespace): ifindex as text → name; empty
    when the host cannot say."""
    try:
        return {str(index): name for index, name in socket.if_nameindex()}
    except OSError:
        return {}


def merged(at_start: Optional[dict[str, str]], at_end: dict[str, str]) -> dict[str, str]:
    """The meta entry ``net_devices`` from the two readings."""
    out = dict(at_start or {})
    out.update(at_end)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))

