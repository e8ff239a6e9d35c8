#!/usr/bin/env python3
"""Run in a guest (scripts/vm-run): `ctracer trace --watch` and bpftrace's `watchpoint:`
on the same socket's fields in the same run, and their writing sites side by side.

    python tests/vm/guest/watch_kernel.py OUT_DIR [SECONDS [VMLINUX]]

A loopback TCP connection (this script's own threads) is opened and left idle; the
client socket's kernel address comes from /proc/net/tcp (kptr_restrict=1 shows it to
root).  ctracer follows only that object (--object, tracepoints only) with write
breakpoints on sk_forward_alloc and skc_state (lines through VMLINUX, a vmlinux with
DWARF, when given); bpftrace arms its own watchpoints on the same two addresses.

Both are armed at once, but the emulated CPU (QEMU TCG) gives a trap to only one
breakpoint when two watch one address (the first it finds matching: in these runs,
the one armed first).  So the run has two windows of the same exchange, SECONDS each:
in the first the connection sends a small message every 20 ms with bpftrace armed
before ctracer (bpftrace takes the traps); then bpftrace exits, and in the second the
same exchange goes on with ctracer alone, then the connection closes.  OUT_DIR gets
the trace (watch.ctrace), bpftrace's output (bpftrace.txt), ctracer's (ctracer.log)
and result.json: bpftrace's writing sites (function+offset: writes) of the first
window, ctracer's of each window (``before``: while bpftrace was armed, ``messages``:
the second window's exchange, ``close``: from the close on), their lines, and the
monotonic times of the windows.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time

CTRACER = [sys.executable, "-m", "ctracer"]
FIELDS = ("sk_forward_alloc", "skc_state")


def exchange(client, peer, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        client.sendall(b"x" * 200)
        peer.recv(4096)
        peer.sendall(b"y" * 100)
        client.recv(4096)
        time.sleep(0.02)


def workload(seconds: float, ready, first, second, first_done, times: dict,
             info: dict) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    info["client_port"] = client.getsockname()[1]
    ready.set()
    first.wait()
    exchange(client, peer, seconds)
    first_done.set()
    second.wait()
    exchange(client, peer, seconds)
    times["close_ns"] = time.monotonic_ns()
    client.close()
    time.sleep(0.5)
    peer.close()
    server.close()


def socket_address(port: int) -> int:
    with open("/proc/sys/kernel/kptr_restrict", "w") as f:
        f.write("1")   # %pK in /proc/net/tcp shows root the real address
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if int(parts[1].split(":")[1], 16) == port and parts[3] == "01":
                return int(parts[11], 16)
    raise SystemExit(f"no established socket on port {port} in /proc/net/tcp")


def wait_for(path: str, text: str, process, what: str) -> None:
    while text not in open(path).read():
        if process.poll() is not None:
            raise SystemExit(f"{what} ended early: see {path}")
        time.sleep(0.5)


def bpftrace_sites(text: str) -> dict[str, dict[str, int]]:
    """@field[\\n    function+offset\\n]: count (kstack(1): the trap's own ip)."""
    seen: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"@(\w+)\[\s*([^\s\]]+)\s*\]: (\d+)", text):
        seen.setdefault(m[1], {})[m[2]] = int(m[3])
    return seen


def ctracer_sites(trace: str, times: dict) -> tuple[dict, dict]:
    """ctracer's writing sites per window and field, and each site's line."""
    db = sqlite3.connect(trace)
    windows: dict[str, dict[str, dict[str, int]]] = {"before": {}, "messages": {},
                                                     "close": {}}
    lines: dict[str, str] = {}
    for ts, field, function, offset, file, line, inlined in db.execute(
            "SELECT w.ts_ns, w.field, s.function, s.offset, s.file, s.line, s.inlined "
            "FROM watch_writes w JOIN watch_sites s ON s.address = w.ip "
            "AND s.kind = 'writer'"):
        window = ("before" if ts < times["second_ns"] else
                  "messages" if ts < times["close_ns"] else "close")
        site = f"{function}+{offset}"   # decimal, as bpftrace names it
        by_site = windows[window].setdefault(field.split(".")[-1], {})
        by_site[site] = by_site.get(site, 0) + 1
        if file:
            lines[site] = f"{file}:{line}" + (f" in {inlined}" if inlined else "")
    return windows, lines


def main() -> int:
    out = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 30
    vmlinux = sys.argv[3] if len(sys.argv) > 3 else None
    os.makedirs(out, exist_ok=True)
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.debuginfo.sources import TypeSource
    from ctracer.plan.selection import open_struct
    from ctracer.plan.watch import plan_watch
    from ctracer.record.breakpoints import refusal
    result: dict = {"kernel": os.uname().release}
    refused = refusal(kernel=True)
    if refused:
        result["refused"] = refused
        json.dump(result, open(os.path.join(out, "result.json"), "w"))
        print(f"refused: {refused}")
        return 0
    _, graph, _ = open_struct(TypeSource(btf="/sys/kernel/btf/vmlinux"), "sock",
                              ShapeKind.STRUCT)
    words = plan_watch(graph, list(FIELDS)).words
    ready, first, second, first_done = (threading.Event() for _ in range(4))
    times: dict = {}
    info: dict = {}
    worker = threading.Thread(target=workload, daemon=True,
                              args=(seconds, ready, first, second, first_done, times, info))
    worker.start()
    ready.wait()
    address = socket_address(info["client_port"])
    result["address"] = hex(address)
    trace = "/var/tmp/watch.ctrace"   # the guest's tmpfs: SQLite on the 9p root locks
    ct_log_path = os.path.join(out, "ctracer.log")
    ct_log = open(ct_log_path, "w")
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sock", "--function-probes", "none",
                                     "--watch", *FIELDS, "--object", hex(address),
                                     "-o", trace] + (["--vmlinux", vmlinux] if vmlinux else []),
                          stderr=ct_log, stdout=ct_log)
    wait_for(ct_log_path, "recording struct sock", ct, "ctracer")
    probes = " ".join(
        f"watchpoint:{address + w.offset:#x}:{w.length}:w "
        f"{{ @{w.field.split('.')[-1]}[kstack(1)] = count(); }}" for w in words)
    bt_path = os.path.join(out, "bpftrace.txt")
    bt_out = open(bt_path, "w")
    # bpftrace ends when this process calls getppid(2): a signal was seen to leave it
    # running for minutes in the 6.12 guest
    stop = f"tracepoint:syscalls:sys_enter_getppid /pid == {os.getpid()}/ {{ exit(); }}"
    bt = subprocess.Popen(["bpftrace", "-e", probes + ' BEGIN { printf("arm%s\\n", "ed"); } '
                           + stop], stdout=bt_out, stderr=bt_out)
    wait_for(bt_path, "armed", bt, "bpftrace")
    times["first_ns"] = time.monotonic_ns()
    first.set()
    first_done.wait()
    os.getppid()   # bpftrace prints its maps and disarms
    try:
        bt.wait(timeout=300)
    except subprocess.TimeoutExpired:
        bt.terminate()
        bt.wait(timeout=300)
    bt_out.close()
    times["second_ns"] = time.monotonic_ns()
    second.set()
    worker.join()
    time.sleep(2)
    ct.send_signal(2)   # Ctrl-C: ctracer keeps the trace
    ct.wait(timeout=900)
    ct_log.close()
    subprocess.run(["cp", trace, os.path.join(out, "watch.ctrace")], check=True)
    windows, lines = ctracer_sites(os.path.join(out, "watch.ctrace"), times)
    result.update(bpftrace=bpftrace_sites(open(bt_path).read()), ctracer=windows,
                  lines=lines, times=times, ctracer_exit=ct.returncode)
    json.dump(result, open(os.path.join(out, "result.json"), "w"), indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
