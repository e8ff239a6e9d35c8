#!/usr/bin/env python3
"""fsession.multi and fentry.multi (tracing_multi links) against kprobe.multi on the same
functions, in one boot (needs root and a kernel with all three: Debian's 7.2 guest):

    scripts/vm-run --kernel 7.2 -- .venv/bin/python bench/bench_tracing_multi.py
        [--struct sock] [--functions GLOB...] [--rounds N] [--messages N]
        [--kinds fsession.multi fentry.multi kprobe]

* attach and detach: ``ctracer trace struct S -d 1`` over every method the plan places,
  ``--function-probes fsession.multi`` (one session program a function),
  ``fentry.multi`` (an fentry and an fexit program) and ``kprobe`` (kprobe.multi links)
  taking turns, ``--rounds`` times; the attach and detach seconds from each summary line,
  the best of each kind, and each tracing_multi kind's over kprobe.multi's (goal: <= 1);
* bpftrace on the same functions: bpftrace 0.17 attaching an empty ``kprobe:*`` and
  ``kretprobe:*`` whose wildcards match exactly the function set (each a kprobe.multi
  link: ``available_filter_functions`` bind-mounted over by their names in a mount
  namespace of its own, as tests/vm/guest/method_counts.py does), ``--rounds`` times:
  start to "Attaching N probes" (its compile), to ready (its BEGIN's line: every probe
  attached), Ctrl-C to exit; each kind of ctracer's over bpftrace's (attach against
  "Attaching" to ready, detach against Ctrl-C to exit, and the whole command with bcc's
  compile against start to ready plus exit).  The function set, for every kind and
  bpftrace alike (``--functions`` naming them): the functions the plan puts on its main
  kind (7.2: fsession.multi) that bpftrace can name (in kallsyms once, in
  ``available_filter_functions``, not on the kprobe deny list) and on which an empty
  program's kprobe.multi and kretprobe.multi links are made (a refused link split in
  halves down to the names refused alone); one line says what was left out and why.
  bpftrace failing to attach is one line, with the empty program's links tried again;
  ``--skip-bpftrace``: every method, as the plan places it for each kind;
* per call: the loopback workload (tcploop, small messages) untraced, then under each kind
  tracing the functions it runs through (`bench_kmethods.HOT`), every field and two
  fields: the BPF programs' own run time per run (``kernel.bpf_stats_enabled``: entry or
  exit, the program only, not the trampoline or the kprobe around it) and the whole
  workload's added time per traced call (the probe machinery, the program and ctracer's
  reader), each tracing_multi kind's over kprobe.multi's.  A session program runs twice
  a call too (at entry and at return), so runs count alike for every kind.

Ratios are between the two kinds measured in the same boot; nothing is asserted.  In a
TCG guest a figure counts emulated steps, not a real CPU's cost.
"""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kmethods as km  # noqa: E402

#: tests/vm/guest: method_counts.py's bpftrace process whose wildcards match given names
GUEST_SCRIPTS = os.path.join(km.ROOT, "tests", "vm", "guest")

KINDS = ("fsession.multi", "fentry.multi", "kprobe")
LABEL = {"fsession.multi": "fsession.multi", "fentry.multi": "fentry.multi",
         "kprobe": "kprobe.multi"}
#: the anchor every kind is compared with
ANCHOR = "kprobe"
PROG_TYPE_KPROBE = 2


def _plan_functions(struct: str, globs: list[str]) -> tuple[str, list[str]]:
    """The kind the plan puts most functions on (7.2: fsession.multi) and those functions
    (a function beside them on another kind, e.g. kprobes where a tracing_multi link
    refused it, is left out: every kind compared can take the set)."""
    import collections
    import json
    cmd = km.CTRACER + ["plan", "struct", struct, "--json"]
    if globs:
        cmd += ["--functions", *globs]
    doc = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    probes = [p for p in doc["probes"] if p["kind"] not in (None, "raw_tracepoint", "kretprobe")]
    kind = collections.Counter(p["kind"] for p in probes).most_common(1)[0][0]
    return kind, sorted({p["function"].split("@")[0] for p in probes if p["kind"] == kind})


def _multi_link(prog_fd: int, names: list[str], ret: bool) -> int:
    """0 when one kprobe.multi (``ret``: kretprobe.multi) link of ``prog_fd`` on the
    names' symbols is made (then closed), else the kernel's errno."""
    from ctracer.host.bpf_calls import kprobe_multi_link
    fd, err = kprobe_multi_link(prog_fd, names, ret)
    if fd >= 0:
        os.close(fd)
        return 0
    return err


def refused_parts(names: list[str], attempt: Callable[[list[str]], int],
                  err: int) -> list[tuple[list[str], int]]:
    """The parts of ``names`` that a link refuses, from one link of all of them refused
    with errno ``err``: split in halves down to the names refused alone, or to a part
    whose halves both link (only the whole is refused); each part with its errno.
    ``attempt(part)`` makes a link on ``part`` (and closes it): 0, else the errno."""
    if len(names) <= 1:
        return [(names, err)]
    halves = [names[:len(names) // 2], names[len(names) // 2:]]
    errs = [attempt(h) for h in halves]
    if not any(errs):
        return [(names, err)]
    return [part for h, e in zip(halves, errs) if e for part in refused_parts(h, attempt, e)]


def refused_by_links(names: list[str]) -> dict[str, str]:
    """The names that one kprobe.multi or kretprobe.multi link of an empty program (what
    bpftrace's ``kprobe:*`` and ``kretprobe:*`` are) is refused on, each with the errno
    (`refused_parts`)."""
    from ctracer.host.bpf_calls import RETURN_ZERO, TRACE_KPROBE_MULTI, errno_text
    from ctracer.record.kattach import load_program
    fd, why = load_program(RETURN_ZERO, PROG_TYPE_KPROBE, TRACE_KPROBE_MULTI, name=b"empty")
    if fd < 0:
        raise SystemExit(f"bench_tracing_multi: an empty kprobe.multi program: {why}")
    refused: dict[str, str] = {}
    try:
        for ret in (True, False):   # bpftrace links its kretprobe:* first
            err = _multi_link(fd, names, ret) if names else 0
            if not err:
                continue
            if err in (errno.EOPNOTSUPP, 524):   # 524: the kernel's ENOTSUPP
                raise SystemExit(f"bench_tracing_multi: no kprobe.multi links here "
                                 f"({errno_text(err)})")
            kind = "kretprobe.multi" if ret else "kprobe.multi"
            for part, e in refused_parts(names, lambda p: _multi_link(fd, p, ret), err):
                if len(part) == 1:
                    refused.setdefault(part[0], f"{kind}: {errno_text(e)}")
                else:
                    refused.setdefault(f"<{len(part)} names together>",
                                       f"{kind}: {errno_text(e)} on the whole, its halves "
                                       f"linked")
    finally:
        os.close(fd)
    return refused


def bpftrace_set(args) -> list[str]:
    """The functions every kind and bpftrace are timed on: those the plan puts on its
    main kind that bpftrace can name and whose kprobe.multi and kretprobe.multi links the
    kernel accepts; one line saying how many were left out and why."""
    sys.path.insert(0, GUEST_SCRIPTS)
    import method_counts as mc
    kind, planned = _plan_functions(args.struct, args.functions)
    once, traceable, denied = mc._kallsyms_once(), mc.traceable(), mc._blacklisted()
    why = {"named more than once in kallsyms or in a module": [n for n in planned if n not in once],
           "not in available_filter_functions": [n for n in planned if n in once and n not in traceable],
           "on the kprobe deny list": [n for n in planned if n in once and n in traceable and n in denied]}
    named = sorted(set(planned) & mc.attachable())
    refused = refused_by_links(named)
    names = [n for n in named if n not in refused]
    parts = [f"{len(v)} {k}" + (f" ({', '.join(v[:4])}{', ...' if len(v) > 4 else ''})" if v else "")
             for k, v in why.items()]
    parts.append(f"{len(refused)} refused by a link of an empty program"
                 + (f" ({'; '.join(f'{n}: {e}' for n, e in list(refused.items())[:6])})"
                    if refused else ""))
    print(f"function set: {len(names)} of the {len(planned)} functions the plan puts on "
          f"{kind}; left out: {', '.join(parts)}", flush=True)
    return names


def attach_detach(args, tmp: str, names: Optional[list[str]] = None) -> dict[str, dict]:
    """The best attach and detach seconds of each kind over the rounds (kinds taking
    turns, the first kind alternating), on ``names`` when given (else ``--functions``)."""
    best: dict[str, dict] = {}
    for round_ in range(args.rounds):
        for kind in (args.kinds if round_ % 2 == 0 else args.kinds[::-1]):
            got = km._ctracer_attach(args.struct, names or args.functions,
                                     os.path.join(tmp, f"a-{kind}-{round_}.ctrace"), kind)
            for leftover in os.listdir(tmp):
                if leftover.startswith(f"a-{kind}-{round_}"):
                    os.remove(os.path.join(tmp, leftover))
            print(f"round {round_ + 1}, {LABEL[kind]}: {got['functions']} functions "
                  f"({got['failed']} failed): attach {got['attach']:.1f} s, detach "
                  f"{got['detach']:.1f} s (bcc compile {got['compile']:.1f} s more)", flush=True)
            old = best.get(kind)
            if old is None or got["attach"] + got["detach"] < old["attach"] + old["detach"]:
                best[kind] = got
    k = best[ANCHOR]
    for kind in args.kinds:
        if kind == ANCHOR:
            continue
        f = best[kind]
        print(f"attach + detach, best of {args.rounds}: {LABEL[kind]} {f['attach']:.1f} + "
              f"{f['detach']:.1f} = {f['attach'] + f['detach']:.1f} s on {f['functions']} "
              f"functions; kprobe.multi {k['attach']:.1f} + {k['detach']:.1f} = "
              f"{k['attach'] + k['detach']:.1f} s on {k['functions']}; "
              f"{LABEL[kind]}/kprobe.multi: attach "
              f"{f['attach'] / max(k['attach'], 1e-3):.2f}x, detach "
              f"{f['detach'] / max(k['detach'], 1e-3):.2f}x, both "
              f"{(f['attach'] + f['detach']) / max(k['attach'] + k['detach'], 1e-3):.2f}x "
              f"(goal <= 1)", flush=True)
    return best


def bpftrace_attach_detach(args, ours: dict[str, dict], names: list[str]) -> None:
    """bpftrace's empty kprobe and kretprobe on ``names``, each a kprobe.multi link,
    ``--rounds`` times: the best start to ready plus Ctrl-C to exit, against ``ours``
    (each kind's best from `attach_detach`, on the same functions)."""
    import json
    sys.path.insert(0, GUEST_SCRIPTS)
    import method_counts as mc
    os.makedirs(mc.LOCAL, exist_ok=True)
    script = 'BEGIN { printf("ready\\n"); }\nkprobe:* { }\nkretprobe:* { }\n'
    best = None
    for round_ in range(args.rounds):
        start = time.monotonic()
        bt = mc.Bpftrace(round_, script, names, 2 * len(names))
        attaching = ready = None
        while ready is None and bt.proc.poll() is None and time.monotonic() - start < 1800:
            text = bt.text()
            if attaching is None and "Attaching" in text:
                attaching = time.monotonic() - start
            if "ready" in text:
                ready = time.monotonic() - start
            time.sleep(0.1)
        if ready is None:
            bt.stop(60)
            error = next((ln for ln in bt.text().splitlines() if "ERROR" in ln),
                         bt.text().strip().splitlines()[-1:] or ["no output"])
            now = refused_by_links(names)
            print(f"bpftrace did not attach on {len(names)} functions in round {round_ + 1}: "
                  f"{error if isinstance(error, str) else error[0]}; an empty program's "
                  f"links on them now: "
                  f"{'; '.join(f'{n}: {e}' for n, e in list(now.items())[:6]) or 'made'}",
                  flush=True)
            return
        links = subprocess.run(["bpftool", "-j", "link", "show"], capture_output=True,
                               text=True).stdout
        types: dict[str, int] = {}
        for link in json.loads(links or "[]"):
            types[link.get("type", "?")] = types.get(link.get("type", "?"), 0) + 1
        stopping = time.monotonic()
        bt.stop(900)
        got = {"attaching": attaching, "ready": ready, "exit": time.monotonic() - stopping,
               "announced": next((ln for ln in bt.text().splitlines() if "Attaching" in ln), "")}
        print(f"round {round_ + 1}, bpftrace: {len(names)} functions, {got['announced']!r}: "
              f"start to 'Attaching' {attaching:.1f} s, to ready {ready:.1f} s "
              f"({ready - attaching:.1f} s attaching), Ctrl-C to exit {got['exit']:.1f} s; "
              f"links while attached: {types}", flush=True)
        if best is None or ready + got["exit"] < best["ready"] + best["exit"]:
            best = got
    theirs_attach = best["ready"] - best["attaching"]
    for kind, o in ours.items():
        print(f"{LABEL[kind]}/bpftrace, best of {args.rounds}: attach {o['attach']:.1f} s / "
              f"{theirs_attach:.1f} s = {o['attach'] / max(theirs_attach, 1e-3):.2f}x, detach "
              f"{o['detach']:.1f} s / {best['exit']:.1f} s = "
              f"{o['detach'] / max(best['exit'], 1e-3):.2f}x, both "
              f"{(o['attach'] + o['detach']) / max(theirs_attach + best['exit'], 1e-3):.2f}x; "
              f"with the compile (bcc {o['compile']:.1f} s; bpftrace's start to 'Attaching' "
              f"{best['attaching']:.1f} s) "
              f"{(o['compile'] + o['attach'] + o['detach']) / max(best['ready'] + best['exit'], 1e-3):.2f}x",
              flush=True)


def traced(args, kind: str, hot: list[str], fields: list[str], tmp: str) -> dict:
    """The workload's best time under ctracer tracing ``hot`` with ``kind``, and its
    programs' run time and runs."""
    name = f"percall-{kind}-{len(fields) or 'all'}"
    log = os.path.join(tmp, f"{name}.log")
    cmd = km.CTRACER + ["trace", "struct", args.struct, "--functions", *hot, "-o",
                        os.path.join(tmp, f"{name}.ctrace"), "-d", "3600",
                        "--buffer-mb", str(args.buffer_mb), "--function-probes", kind]
    if fields:
        cmd += ["--fields", *fields]
    before = km._program_ids()
    ct = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    km._started(ct, log)
    ours = km._program_ids() - before
    rounds = [km._workload(args.messages) for _ in range(args.rounds)]
    ns, runs = km._program_stats(ours)
    km._stop(ct, "ctracer")
    written, lost = km._written_and_lost(open(log).read())
    for leftover in os.listdir(tmp):
        if leftover.startswith(name) and not leftover.endswith(".log"):
            os.remove(os.path.join(tmp, leftover))
    return {"seconds": min(rounds), "rounds": rounds, "ns": ns, "runs": runs,
            "written": written, "lost": lost}


def per_call(args, tmp: str) -> None:
    hot = km._unique_in_kallsyms(list(km.HOT))
    base = min(km._workload(args.messages) for _ in range(args.rounds))
    print(f"per call: tcploop {args.messages} messages x 2 connections untraced {base:.2f} s "
          f"(best of {args.rounds}); {len(hot)} functions on entry and exit", flush=True)
    subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"], check=True)
    for fields in ([], ["skc_state", "sk_sndbuf"]):
        got = {}
        for kind in args.kinds:
            r = got[kind] = traced(args, kind, hot, fields, tmp)
            calls = max(r["runs"] // 2 // args.rounds, 1)
            r["program_ns"] = r["ns"] / max(r["runs"], 1)
            r["call_ns"] = (r["seconds"] - base) * 1e9 / calls
            print(f"  {LABEL[kind]}, {', '.join(fields) or 'every field'}: program "
                  f"{r['program_ns']:.0f} ns a run ({r['runs']} runs); workload "
                  f"{r['seconds']:.2f} s (rounds {', '.join(f'{s:.2f}' for s in r['rounds'])}), "
                  f"~{r['call_ns']:.0f} ns added per traced call ({calls} calls a run); "
                  f"{r['written']} events, {r['lost']} lost", flush=True)
        k = got[ANCHOR]
        for kind in args.kinds:
            if kind == ANCHOR:
                continue
            f = got[kind]
            print(f"per call, {', '.join(fields) or 'every field'}: {LABEL[kind]}/kprobe.multi: "
                  f"program run time {f['program_ns'] / max(k['program_ns'], 1e-9):.2f}x, "
                  f"whole added cost per call {f['call_ns'] / max(k['call_ns'], 1e-9):.2f}x",
                  flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--struct", default="sock")
    p.add_argument("--functions", nargs="*", default=[],
                   help="globs of the functions for attach + detach (default: every method)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--buffer-mb", type=int, default=256)
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                   help="the kinds compared (kprobe, the anchor, always among them)")
    p.add_argument("--skip-attach", action="store_true")
    p.add_argument("--skip-per-call", action="store_true")
    p.add_argument("--skip-bpftrace", action="store_true",
                   help="leave out bpftrace's attach and detach on the same functions")
    args = p.parse_args()
    if ANCHOR not in args.kinds:
        args.kinds.append(ANCHOR)
    if os.geteuid() != 0:
        print("bench_tracing_multi: needs root", file=sys.stderr)
        return 2
    subprocess.run(["make", "-s", "-C", os.path.join(km.ROOT, "samples")], check=True)
    tmp = tempfile.mkdtemp(prefix="bench-tmulti-", dir="/var/tmp")
    print(f"kernel {os.uname().release}, load {os.getloadavg()[0]:.1f}", flush=True)
    if not args.skip_attach:
        if args.skip_bpftrace:
            ours = attach_detach(args, tmp)
        else:
            names = bpftrace_set(args)
            if not names:
                print("bench_tracing_multi: no function both can attach", file=sys.stderr)
                return 1
            ours = attach_detach(args, tmp, names)
            bpftrace_attach_detach(args, ours, names)
    if not args.skip_per_call:
        per_call(args, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
