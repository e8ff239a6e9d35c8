#!/usr/bin/env python3
"""Run in a guest (scripts/vm-run): `ctracer trace --watch` and bpftrace's `watchpoint:`
on the same socket's fields in the same run, and their writing functions side by side.

    PYTHONPATH=SRC python -m ... watch_kernel.py OUT_DIR [SECONDS]

A loopback TCP connection (this script's own threads) is opened and left idle; the
client socket's kernel address comes from /proc/net/tcp (kptr_restrict=1 shows it to
root).  ctracer follows only that object (--object) with write breakpoints on
sk_forward_alloc and skc_state; once it records, bpftrace arms its own watchpoints on
the same two addresses, and once bpftrace runs, the connection sends a small message
every 20 ms for SECONDS and closes (both tools armed all along).  OUT_DIR gets
the trace (watch.ctrace), bpftrace's counts (bpftrace.txt) and result.json: each tool's
set of writing functions per field.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

CTRACER = [sys.executable, "-m", "ctracer"]


def workload(seconds: float, ready: threading.Event, go: threading.Event,
             info: dict) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    info["client_port"] = client.getsockname()[1]
    ready.set()
    go.wait()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        client.sendall(b"x" * 200)
        peer.recv(4096)
        peer.sendall(b"y" * 100)
        client.recv(4096)
        time.sleep(0.02)
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


def main() -> int:
    out = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 240
    os.makedirs(out, exist_ok=True)
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.debuginfo.sources import TypeSource
    from ctracer.plan.selection import open_struct
    from ctracer.plan.watch import plan_watch
    from ctracer.record.breakpoints import refusal
    refused = refusal(kernel=True)
    if refused:
        json.dump({"refused": refused}, open(os.path.join(out, "result.json"), "w"))
        print(f"refused: {refused}")
        return 0
    _, graph, _ = open_struct(TypeSource(btf="/sys/kernel/btf/vmlinux"), "sock",
                              ShapeKind.STRUCT)
    words = {w.field: w.__dict__ for w in plan_watch(graph, ["sk_forward_alloc",
                                                             "skc_state"]).words}
    ready, go, info = threading.Event(), threading.Event(), {}
    worker = threading.Thread(target=workload, args=(seconds, ready, go, info), daemon=True)
    worker.start()
    ready.wait()
    address = socket_address(info["client_port"])
    trace = "/var/tmp/watch.ctrace"
    log = open(os.path.join(out, "ctracer.log"), "w")
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sock", "--function-probes", "none",
                                     "--watch", "sk_forward_alloc", "skc_state",
                                     "--object", hex(address), "-o", trace],
                          stderr=log, stdout=log)
    while "recording struct sock" not in open(os.path.join(out, "ctracer.log")).read():
        if ct.poll() is not None:
            raise SystemExit("ctracer ended before recording: see ctracer.log")
        time.sleep(0.5)
    left = int(seconds) + 5   # bpftrace until after the close
    probes = " ".join(
        f"watchpoint:{address + w['offset']:#x}:{w['length']}:w "
        f"{{ @{name.split('.')[-1]}[kstack(1)] = count(); }}" for name, w in words.items())
    bt_out = open(os.path.join(out, "bpftrace.txt"), "w")
    bt = subprocess.Popen(["bpftrace", "-e", probes + " BEGIN { printf(\"arm%s\\n\", \"ed\"); } "
                           f"interval:s:{left} {{ exit(); }}"], stdout=bt_out, stderr=bt_out)
    while "armed" not in open(os.path.join(out, "bpftrace.txt")).read():
        if bt.poll() is not None:
            raise SystemExit("bpftrace ended before arming: see bpftrace.txt")
        time.sleep(0.5)
    go.set()
    bt.wait(timeout=seconds + 900)
    bt_out.close()
    worker.join()
    time.sleep(2)
    ct.send_signal(2)   # Ctrl-C: ctracer keeps the trace
    ct.wait(timeout=600)
    log.close()
    subprocess.run(["cp", trace, os.path.join(out, "watch.ctrace")], check=True)
    seen_bt: dict[str, dict[str, int]] = {}
    # @field[\n    function+offset\n]: count (kstack(1): the trap's own ip)
    for m in re.finditer(r"@(\w+)\[\s*([^\s\]]+)\s*\]: (\d+)",
                         open(os.path.join(out, "bpftrace.txt")).read()):
        seen_bt.setdefault(m[1], {})[m[2]] = int(m[3])
    import sqlite3
    db = sqlite3.connect(os.path.join(out, "watch.ctrace"))
    seen_ct: dict[str, dict[str, int]] = {}
    for field, function, offset, n in db.execute(
            "SELECT w.field, s.function, s.offset, count(*) FROM watch_writes w JOIN "
            "watch_sites s ON s.address = w.ip AND s.kind = 'writer' GROUP BY 1, 2, 3"):
        seen_ct.setdefault(field.split(".")[-1], {})[f"{function}+{offset}"] = n
    result = {"address": hex(address), "ctracer": seen_ct, "bpftrace": seen_bt,
              "kernel": os.uname().release}
    json.dump(result, open(os.path.join(out, "result.json"), "w"), indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
