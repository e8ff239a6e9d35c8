#!/usr/bin/env python3
"""One fsession program against a separate fentry and fexit program, all on tracing_multi
links over the same hot functions, in one boot (needs root and a kernel with
fsession.multi: Debian's 7.2 guest):

    scripts/vm-run --kernel 7.2 -- .venv/bin/python bench/bench_fsession.py [--rounds N] [--calls N]

Every variant does the same minimal work per call: count the call and add its duration
into the function's slot of an array (the slot is the link's cookie of the function):

* ``session``: one fsession.multi program; at entry it writes the time into the session
  cookie (``bpf_session_cookie``), at return it reads it back;
* ``pair+hash``: an fentry.multi and an fexit.multi program; the entry's time kept in a
  hash keyed by (thread, function), looked up and deleted by the exit (the usual way
  separate programs pair a call);
* ``pair+slot``: the same pair, the time kept in an array slot of (thread id & 0xffff,
  function): no hash, no delete: the least any pair can do to hand a value to its exit
  (ctracer's programs use task storage, not measured here).

The programs are written here instruction by instruction (bcc cannot emit the kfunc
calls of the session program; the pairs are written the same way so that only the
pairing differs).  The workload is ``dd bs=1`` from /dev/zero to /dev/null (two system
calls a byte through ksys_read, vfs_read, rw_verify_area, ... ).  Per variant and round:
the programs' own run time per traced call (``kernel.bpf_stats_enabled``: the sum of the
programs' ``run_time_ns`` over the calls the array counted — each call runs a program
twice in every variant) and the workload's seconds against the untraced workload in the
same round.  Variants take turns, the order rotating each round; the medians over the
rounds and each pair's over the session's are printed.  Nothing is asserted.  In a TCG
guest a figure counts emulated steps, not a real CPU's cost.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "src"))

from ctracer.host.bpf_calls import (MULTI_ATTACH_BTF_ID, TRACE_FENTRY_MULTI,  # noqa: E402
                                    TRACE_FEXIT_MULTI, bpf_syscall, errno_text,
                                    tracing_multi_link)
from ctracer.host.fsession import TRACE_FSESSION_MULTI, kernel_func_ids  # noqa: E402
from ctracer.record.kattach import load_program, prog_run_stats  # noqa: E402

#: on the read and write system calls' path; those BTF lacks or a link refuses are left out
HOT = ("ksys_read", "vfs_read", "ksys_write", "vfs_write", "rw_verify_area",
       "security_file_permission", "read_iter_zero", "read_zero", "write_null",
       "fsnotify_perm", "__fsnotify_parent", "__fdget_pos", "fdget_pos", "__f_unlock_pos")
VARIANTS = ("session", "pair+hash", "pair+slot")
_PROG_TYPE_TRACING = 26
_MAP_HASH, _MAP_ARRAY = 1, 2
_LOOKUP, _UPDATE, _DELETE, _KTIME, _PID_TGID, _ATTACH_COOKIE = 1, 2, 3, 5, 14, 174
_PSEUDO_MAP_FD, _PSEUDO_KFUNC_CALL = 1, 2
SLOT_THREADS, SLOT_FUNCTIONS = 1 << 16, 16
STATS_PATH = "/proc/sys/kernel/bpf_stats_enabled"


# ------------------------------------------------------------------ a tiny assembler

class Asm:
    """eBPF instructions with named jump targets."""

    def __init__(self) -> None:
        self.code: list = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> "Asm":
        self.code.append((code, dst, src, off, imm))
        return self

    def jump(self, code: int, dst: int, imm: int, label: str) -> "Asm":
        self.code.append((code, dst, 0, label, imm))
        return self

    def label(self, name: str) -> "Asm":
        self.labels[name] = len(self.code)
        return self

    def map_fd(self, dst: int, fd: int) -> "Asm":
        self.op(0x18, dst, _PSEUDO_MAP_FD, 0, fd)
        return self.op(0, 0, 0, 0, 0)

    def call(self, helper: int) -> "Asm":
        return self.op(0x85, 0, 0, 0, helper)

    def kfunc(self, btf_id: int) -> "Asm":
        return self.op(0x85, 0, _PSEUDO_KFUNC_CALL, 0, btf_id)

    def mov(self, dst: int, src: int) -> "Asm":
        return self.op(0xBF, dst, src)

    def mov_imm(self, dst: int, imm: int) -> "Asm":
        return self.op(0xB7, dst, 0, 0, imm)

    def stack_ptr(self, dst: int, off: int) -> "Asm":
        return self.mov(dst, 10).op(0x07, dst, 0, 0, off)

    def add_stats(self, stats_fd: int, cookie_reg: int, duration_reg: int) -> "Asm":
        """stats[cookie].calls += 1, .ns += duration (the exit's common tail)."""
        (self.op(0x63, 10, cookie_reg, -24)          # *(u32 *)(r10 - 24) = cookie
             .map_fd(1, stats_fd).stack_ptr(2, -24).call(_LOOKUP)
             .jump(0x15, 0, 0, "out")                 # if r0 == 0 goto out
             .mov_imm(1, 1).op(0xDB, 0, 1, 0)         # lock *(u64 *)(r0 + 0) += 1
             .op(0xDB, 0, duration_reg, 8))           # lock *(u64 *)(r0 + 8) += duration
        return self

    def done(self) -> bytes:
        self.label("out").mov_imm(0, 0).op(0x95)
        out = []
        for i, (code, dst, src, off, imm) in enumerate(self.code):
            if isinstance(off, str):
                off = self.labels[off] - i - 1
            out.append(struct.pack("<BBhi", code, (src << 4) | dst, off, imm))
        return b"".join(out)


def session_program(stats: int, cookie_kfunc: int, is_return_kfunc: int) -> bytes:
    a = Asm().mov(6, 1).kfunc(cookie_kfunc).mov(7, 0)   # r7 = the session cookie
    a.mov(1, 6).kfunc(is_return_kfunc).jump(0x55, 0, 0, "return")
    a.call(_KTIME).op(0x7B, 7, 0, 0).jump(0x05, 0, 0, "out")   # *cookie = now
    a.label("return").call(_KTIME).mov(8, 0).op(0x79, 1, 7, 0).op(0x1F, 8, 1)  # r8 -= *cookie
    a.mov(1, 6).call(_ATTACH_COOKIE).mov(9, 0)
    return a.add_stats(stats, 9, 8).done()


def _thread_function_key(a: Asm, slot: bool) -> Asm:
    """r7 = (thread, function) key, r9 = the function's cookie (ctx in r6)."""
    a.call(_PID_TGID)
    if slot:
        a.op(0x57, 0, 0, 0, SLOT_THREADS - 1).op(0x67, 0, 0, 0, 4)   # (tid & 0xffff) << 4
    else:
        a.op(0x67, 0, 0, 0, 32)                                     # tid << 32
    a.mov(7, 0).mov(1, 6).call(_ATTACH_COOKIE).mov(9, 0)
    if slot:
        a.op(0x57, 0, 0, 0, SLOT_FUNCTIONS - 1)
    return a.op(0x4F, 7, 0)                                         # r7 |= function


def pair_entry(times: int, slot: bool) -> bytes:
    a = _thread_function_key(Asm().mov(6, 1), slot)
    if slot:
        a.op(0x63, 10, 7, -4).call(_KTIME).mov(8, 0)
        a.map_fd(1, times).stack_ptr(2, -4).call(_LOOKUP).jump(0x15, 0, 0, "out")
        a.op(0x7B, 0, 8, 0)                                         # *slot = now
    else:
        a.op(0x7B, 10, 7, -8).call(_KTIME).op(0x7B, 10, 0, -16)
        a.map_fd(1, times).stack_ptr(2, -8).stack_ptr(3, -16).mov_imm(4, 0).call(_UPDATE)
    return a.done()


def pair_exit(times: int, stats: int, slot: bool) -> bytes:
    a = Asm().mov(6, 1).call(_KTIME).op(0x7B, 10, 0, -32)           # now at -32
    _thread_function_key(a, slot)
    if slot:
        a.op(0x63, 10, 7, -4).map_fd(1, times).stack_ptr(2, -4)
    else:
        a.op(0x7B, 10, 7, -8).map_fd(1, times).stack_ptr(2, -8)
    a.call(_LOOKUP).jump(0x15, 0, 0, "out")
    a.op(0x79, 8, 10, -32).op(0x79, 1, 0, 0).op(0x1F, 8, 1)         # r8 = now - start
    if not slot:
        a.map_fd(1, times).stack_ptr(2, -8).call(_DELETE)
    return a.add_stats(stats, 9, 8).done()


# ------------------------------------------------------------------ maps and stats

def _map(kind: int, key: int, value: int, entries: int) -> int:
    attr = ctypes.create_string_buffer(72)
    for offset, v in ((0, kind), (4, key), (8, value), (12, entries)):
        ctypes.c_uint32.from_buffer(attr, offset).value = v
    fd, err = bpf_syscall(0, attr)
    if fd < 0:
        raise SystemExit(f"bench_fsession: map create refused ({errno_text(err)})")
    return fd


def _array_values(fd: int, n: int) -> list[tuple[int, int]]:
    out = []
    for i in range(n):
        key, value = ctypes.c_uint32(i), ctypes.create_string_buffer(16)
        attr = ctypes.create_string_buffer(32)
        ctypes.c_uint32.from_buffer(attr, 0).value = fd
        ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(key)
        ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(value)
        bpf_syscall(1, attr)
        out.append(struct.unpack("<QQ", value.raw))
    return out


# ------------------------------------------------------------------ variants

class Attached:
    """One variant's maps, programs and links on the functions (closed by ``close``)."""

    def __init__(self, variant: str, ids: list[int], kfuncs: dict[str, int]) -> None:
        self.fds: list[int] = []
        self.progs: list[int] = []
        self.n = len(ids)
        self.stats = self._own(_map(_MAP_ARRAY, 4, 16, self.n))
        if variant == "session":
            plan = [(session_program(self.stats, kfuncs["bpf_session_cookie"],
                                     kfuncs["bpf_session_is_return"]), TRACE_FSESSION_MULTI)]
        else:
            slot = variant == "pair+slot"
            times = self._own(_map(_MAP_ARRAY, 4, 8, SLOT_THREADS * SLOT_FUNCTIONS) if slot
                              else _map(_MAP_HASH, 8, 8, 16384))
            plan = [(pair_entry(times, slot), TRACE_FENTRY_MULTI),
                    (pair_exit(times, self.stats, slot), TRACE_FEXIT_MULTI)]
        for insns, attach in plan:
            fd, why = load_program(insns, _PROG_TYPE_TRACING, attach, MULTI_ATTACH_BTF_ID, 0,
                                   b"bench_fsess")
            if fd < 0:
                self.close()
                raise SystemExit(f"bench_fsession: {variant}: {why}")
            self.progs.append(self._own(fd))
            link, err = tracing_multi_link(fd, attach, ids, list(range(self.n)))
            if link < 0:
                self.close()
                raise SystemExit(f"bench_fsession: {variant}: link refused ({errno_text(err)})")
            self._own(link)

    def _own(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    def result(self) -> dict:
        run_ns = run_cnt = 0
        for fd in self.progs:
            ns, cnt = prog_run_stats(fd)
            run_ns, run_cnt = run_ns + ns, run_cnt + cnt
        calls = sum(c for c, _ in _array_values(self.stats, self.n))
        return {"calls": calls, "runs": run_cnt, "run_ns": run_ns}

    def close(self) -> None:
        for fd in reversed(self.fds):
            os.close(fd)
        self.fds = []


def linkable(ids: dict[str, int], kfuncs: dict[str, int]) -> dict[str, int]:
    """The hot functions one session program can be linked to (each tried alone)."""
    out = {}
    stats = _map(_MAP_ARRAY, 4, 16, 1)
    fd, why = load_program(session_program(stats, kfuncs["bpf_session_cookie"],
                                           kfuncs["bpf_session_is_return"]),
                           _PROG_TYPE_TRACING, TRACE_FSESSION_MULTI, MULTI_ATTACH_BTF_ID, 0,
                           b"bench_fsess")
    if fd < 0:
        raise SystemExit(f"bench_fsession: the session program was refused: {why}")
    for name, tid in ids.items():
        link, err = tracing_multi_link(fd, TRACE_FSESSION_MULTI, [tid], [0])
        if link >= 0:
            os.close(link)
            out[name] = tid
        else:
            print(f"left out {name}: link refused ({errno_text(err)})")
    os.close(fd)
    os.close(stats)
    return out


def workload(calls: int) -> float:
    started = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={calls}"],
                   check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20_000, help="bytes dd copies one by one")
    args = parser.parse_args()
    kfuncs = kernel_func_ids(("bpf_session_cookie", "bpf_session_is_return"))
    if len(kfuncs) < 2:
        print("bench_fsession: no fsession kfuncs in this kernel's BTF", file=sys.stderr)
        return 1
    functions = linkable(kernel_func_ids(HOT), kfuncs)
    names, ids = list(functions), list(functions.values())
    print(f"functions ({len(names)}): {' '.join(names)}")
    with open(STATS_PATH) as f:
        stats_before = f.read().strip()
    with open(STATS_PATH, "w") as f:
        f.write("1")
    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS + ("none",)}
    try:
        workload(args.calls // 10)   # warm the caches
        for round_ in range(args.rounds):
            order = ("none",) + VARIANTS[round_ % 3:] + VARIANTS[:round_ % 3]
            for variant in order:
                attached = None if variant == "none" else Attached(variant, ids, kfuncs)
                seconds = workload(args.calls)
                got = attached.result() if attached else {}
                if attached:
                    attached.close()
                got["seconds"] = seconds
                rows[variant].append(got)
                per = (f"{got['run_ns'] / max(got['calls'], 1):.0f} ns/call over "
                       f"{got['calls']} calls ({got['runs']} runs)" if attached else "untraced")
                print(f"round {round_ + 1} {variant}: {seconds:.2f} s, {per}", flush=True)
    finally:
        with open(STATS_PATH, "w") as f:
            f.write(stats_before)
    med = {v: {"seconds": statistics.median(r["seconds"] for r in rows[v])} for v in rows}
    for v in VARIANTS:
        med[v]["ns_per_call"] = statistics.median(r["run_ns"] / max(r["calls"], 1) for r in rows[v])
        med[v]["calls"] = statistics.median(r["calls"] for r in rows[v])
        med[v]["added_s"] = med[v]["seconds"] - med["none"]["seconds"]
    s = med["session"]
    print(f"medians of {args.rounds} rounds, dd of {args.calls} bytes (untraced "
          f"{med['none']['seconds']:.2f} s):")
    for v in VARIANTS:
        m = med[v]
        print(f"  {v:10} programs {m['ns_per_call']:7.0f} ns/call ({m['calls']:.0f} calls), "
              f"workload {m['seconds']:.2f} s (+{m['added_s']:.2f} s); "
              f"over session: programs {m['ns_per_call'] / s['ns_per_call']:.2f}x, added "
              f"time {m['added_s'] / max(s['added_s'], 1e-3):.2f}x")
    print(json.dumps({"functions": names, "medians": med}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
