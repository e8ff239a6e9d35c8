#!/usr/bin/env python3
"""Which of the functions bench_tracing_multi.py gives bpftrace make a kprobe.multi or
kretprobe.multi link fail, and why (root, in a guest: ``scripts/vm-run --kernel 7.2 --out
OUT -- .venv/bin/python -u bench/kprobe_multi_bisect.py OUT [--methods]``):

* the names: every method of ``struct sock`` the plan places (``--methods``: every
  probeable one, those the plan leaves out too, listed with its reasons) that kallsyms
  holds once, ftrace can hook and kprobes do not deny;
* one empty program linked to all of them in one kprobe.multi link, entry and return,
  with and without cookies, the entry link held while the return link is made (bpftrace's
  order); a link refused is split in halves until the names that fail alone are found
  (or the halves pass and only the whole fails: said so);
* bpftrace 0.17 on the same names (``kprobe:*`` and ``kretprobe:*``, its wildcards seeing
  only those names, as the bench runs it) under ``strace -Z -e trace=bpf`` (the failed
  bpf(2) calls and what they passed), ``-v``; then on the names that link.

Everything is written to OUT (log.txt, the names, bpftrace's and strace's output, the
kernel log's new lines).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "vm", "guest"))

import bench_kmethods as km  # noqa: E402
import bench_tracing_multi as tm  # noqa: E402
import method_counts as mc  # noqa: E402
from ctracer.host.bpf_calls import (RETURN_ZERO, TRACE_KPROBE_MULTI, errno_text,  # noqa: E402
                                    kprobe_multi_link)
from ctracer.record.kattach import load_program  # noqa: E402

PROG_TYPE_KPROBE = 2

OUT = sys.argv[1]   # then --methods: every probeable method, not only the planned ones
LOG = open(os.path.join(OUT, "log.txt"), "a")


def say(text: str) -> None:
    line = f"[{time.monotonic():8.1f}] {text}"
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


def link(prog_fd: int, names: list[str], ret: bool, cookies: bool) -> tuple[int, int]:
    return kprobe_multi_link(prog_fd, names, ret,
                             list(range(1, len(names) + 1)) if cookies else None)


def try_link(prog_fd: int, names: list[str], ret: bool, cookies: bool = False) -> int:
    """0 when the link is made (and closed at once), else its errno."""
    fd, err = link(prog_fd, names, ret, cookies)
    if fd >= 0:
        os.close(fd)
        return 0
    return err


def failing(prog_fd: int, names: list[str], ret: bool, err: int) -> tuple[list, int]:
    """The names refused alone, each with its errno, from one link of ``names`` refused
    with ``err`` (`bench_tracing_multi.refused_parts`; for a part whose halves both link,
    the longest prefix of it that links is said); and how many links were tried."""
    tried = 0

    def attempt(part: list[str]) -> int:
        nonlocal tried
        tried += 1
        return try_link(prog_fd, part, ret)

    found = []
    for part, e in tm.refused_parts(names, attempt, err):
        if len(part) == 1:
            found.append((part[0], e))
            continue
        lo, hi = len(part) // 2, len(part)   # the longest prefix that links
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if attempt(part[:mid]) == 0 else (lo, mid)
        say(f"  both halves of {len(part)} names link, the whole does not; the longest "
            f"prefix that links: {lo} names (up to {part[lo - 1]}, then {part[lo]})")
        found.append((f"<whole of {len(part)}: {part[0]}..{part[-1]}>", e))
    return found, tried


def kernel_log(tag: str) -> None:
    text = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    with open(os.path.join(OUT, f"dmesg-{tag}.txt"), "w") as f:
        f.write(text)
    tail = [ln for ln in text.splitlines()[-15:]]
    say(f"kernel log, last lines ({tag}):\n    " + "\n    ".join(tail))


def facts(name: str) -> str:
    kall = [ln.strip() for ln in open("/proc/kallsyms") if ln.split()[2:3] == [name]
            or ln.split()[2:3] and ln.split()[2].startswith(name + ".")]
    aff = [ln.strip() for ln in open("/sys/kernel/tracing/available_filter_functions")
           if ln.split() and (ln.split()[0] == name or ln.split()[0].startswith(name + "."))]
    return f"kallsyms {kall}; available_filter_functions {aff}"


def bpftrace(tag: str, names: list[str], script: str, timeout: float = 900) -> bool:
    listed = os.path.join(OUT, f"names-{tag}.txt")
    with open(listed, "w") as f:
        f.write("\n".join(names) + "\n")
    bt = os.path.join(OUT, f"bt-{tag}.bt")
    with open(bt, "w") as f:
        f.write(script)
    out = os.path.join(OUT, f"bpftrace-{tag}.txt")
    trace = os.path.join(OUT, f"strace-{tag}.txt")
    binds = " ".join(f"mount --bind {listed} {d}/available_filter_functions &&"
                     for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
                     if os.path.exists(f"{d}/available_filter_functions"))
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(2 * len(names) + 100))
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           f"{binds} exec strace -f -Z -e trace=bpf -e signal=none -s 80 -v -o {trace} "
           f"bpftrace -v -B line {bt}"]
    start = time.monotonic()
    # its own group: Ctrl-C reaches bpftrace itself, not only strace above it
    proc = subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    ready = False
    while proc.poll() is None and time.monotonic() - start < timeout:
        if "ready" in open(out, errors="replace").read():
            ready = True
            break
        time.sleep(0.5)
    took = time.monotonic() - start
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = open(out, errors="replace").read()
    errors = [ln for ln in text.splitlines() if "ERROR" in ln or "rror" in ln][:10]
    say(f"bpftrace {tag} on {len(names)} names: {'ready' if ready else 'NOT ready'} after "
        f"{took:.1f} s, exit {proc.returncode}; {errors}")
    failed = open(trace, errors="replace").read().splitlines() if os.path.exists(trace) else []
    say(f"  strace, failed bpf calls ({len(failed)}):\n    " +
        "\n    ".join(ln[:600] for ln in failed[-8:]))
    return ready


def main() -> int:
    say(f"kernel {os.uname().release}")
    doc = json.loads(subprocess.run(km.CTRACER + ["plan", "struct", "sock", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    kinds: dict = {}
    for p in doc["probes"]:
        kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
    say(f"plan kinds: {kinds}")
    planned = sorted({p["function"].split("@")[0] for p in doc["probes"]
                      if p["kind"] not in (None, "raw_tracepoint")})
    if "--methods" in sys.argv:   # every probeable method, whatever the plan's kind
        planned = sorted({m["function"].split("@")[0] for m in mc.probeable_methods("sock", [])})
        left = [p for p in doc["probes"] if p["kind"] is None]
        say(f"--methods: {len(planned)} probeable methods; the plan leaves out {len(left)}: "
            + "; ".join(f"{p['function']}: {p['error']}" for p in left))
    names = sorted(set(planned) & mc.attachable())
    say(f"planned {len(planned)}, given to bpftrace {len(names)}")
    with open(os.path.join(OUT, "names.json"), "w") as f:
        json.dump({"planned": planned, "names": names}, f)
    fd, why = load_program(RETURN_ZERO, PROG_TYPE_KPROBE, TRACE_KPROBE_MULTI, name=b"empty")
    if fd < 0:
        say(f"load: {why}")
        return 1
    subprocess.run(["dmesg", "-C"])
    for ret in (False, True):
        for cookies in (False, True):
            t = time.monotonic()
            err = try_link(fd, names, ret, cookies)
            say(f"one {'kretprobe' if ret else 'kprobe'}.multi link on {len(names)} names, "
                f"{'with' if cookies else 'without'} cookies: "
                f"{errno_text(err) if err else 'made'} ({time.monotonic() - t:.1f} s)")
    entry, err = link(fd, names, False, False)
    err_ret = try_link(fd, names, True)
    say(f"entry link held: {errno_text(err) if err else 'made'}; then the return link: "
        f"{errno_text(err_ret) if err_ret else 'made'}")
    if entry >= 0:
        os.close(entry)
    kernel_log("links")
    bad: dict[bool, list] = {}
    for ret in (False, True):
        err = try_link(fd, names, ret)
        if err == 0:
            continue
        found, tried = failing(fd, names, ret, err)
        bad[ret] = found
        say(f"{'kretprobe' if ret else 'kprobe'}.multi: {tried + 1} links tried, refused "
            f"alone: {[(n, errno_text(e) if e else '') for n, e in found]}")
        for n, _ in found:
            if not n.startswith("<"):
                e1 = try_link(fd, [n], False)
                say(f"  {n}: entry alone {errno_text(e1) if e1 else 'made'}; "
                    f"{facts(n)}")
    kernel_log("bisect")
    script = 'BEGIN { printf("ready\\n"); }\nkprobe:* { }\nkretprobe:* { }\n'
    bpftrace("all", names, script)
    kernel_log("bpftrace-all")
    left_out = {n for found in bad.values() for n, _ in found if not n.startswith("<")}
    if left_out:
        rest = [n for n in names if n not in left_out]
        bpftrace("linkable", rest, script)
        kernel_log("bpftrace-linkable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
