#!/usr/bin/env python3
"""Kernel-function tracing against bpftrace on the same functions, in one run (needs
root and a kernel with fentry and kprobes: run it in a guest):

    scripts/vm-run --kernel 6.12 -- .venv/bin/python bench/bench_kmethods.py [--struct sock]
        [--functions GLOB...] [--rounds N]

* attach + detach: ``ctracer trace struct S -d 1`` over every method the plan places,
  with fentry/fexit and with kprobes (``--kinds``; its summary line says compile, attach
  and detach seconds) against bpftrace attaching a kprobe to each of the same functions
  (those kallsyms names once) and detaching (goal: ctracer's attach + detach no slower:
  ratio <= 1);
* attach + detach by size (``--sizes 50 200 --all-kinds kprobe``, e.g. on 6.1, where
  fentry attaches a function at a time): each of ``--kinds`` on the same evenly spaced
  subsets of the planned functions of at most ``--max-routes`` routes (6.1's verifier
  refuses the kprobe entry program of more), and ``--all-kinds`` on every one of them;
  the kinds' seconds a function and their ratio at each size;
* cost per traced call: the loopback workload (tcploop, many small messages) untraced,
  under ctracer tracing the struct's functions the workload runs through (every field,
  entry and exit), and under bpftrace's empty probes on the same functions, entry and
  exit, of the same kind (``kfunc:``/``kretfunc:``, ``kprobe:``/``kretprobe:``) (goal
  <= 1.3x the empty probes' cost over the untraced run; best of ``--rounds``);
* events written: ctracer's events per second, 0 lost, against bpftrace printing the same
  functions' entries and exits with two fields of the object (goal >= 2x).
* per call against a peer (``--peer-rounds N``, e.g. on 7.2 with ``--kinds
  fsession.multi fentry.multi kprobe``): ctracer recording two fields of the object on
  the hot functions, entry and exit, against bpftrace recording the same two fields with
  the time, thread and object on the same functions (printed lines; kfunc/kretfunc and
  kprobe/kretprobe, ``--peers``), N rounds in one boot with the variants' order
  rotating: the workload's added time a call and the BPF programs' run time a call.
Ratios are against anchors measured in the same run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
#: the functions a loopback exchange runs through, for the per-call and events figures
HOT = ("tcp_sendmsg", "tcp_sendmsg_locked", "tcp_push", "tcp_write_xmit",
       "__tcp_transmit_skb", "tcp_recvmsg", "tcp_rcv_established", "tcp_v4_do_rcv",
       "tcp_ack", "tcp_data_queue", "tcp_event_data_recv", "tcp_rcv_space_adjust",
       "tcp_cleanup_rbuf", "tcp_check_space", "sk_reset_timer", "tcp_rate_gen")


def _planned(struct: str, globs: list[str]) -> list[str]:
    import json
    cmd = CTRACER + ["plan", "struct", struct, "--json"]
    if globs:
        cmd += ["--functions", *globs]
    doc = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return sorted({p["function"].split("@")[0] for p in doc["probes"]
                   if p["kind"] in ("fentry", "kprobe")})


def _unique_in_kallsyms(names: list[str]) -> list[str]:
    """The names kallsyms holds once (a kprobe by an ambiguous name is refused)."""
    seen: dict[str, int] = {}
    with open("/proc/kallsyms") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tT":
                seen[parts[2]] = seen.get(parts[2], 0) + 1
    return [n for n in names if seen.get(n) == 1]


def _few_routes(struct: str, most: int) -> set[str]:
    """The functions reaching the struct by at most ``most`` routes (`ctracer functions`)."""
    import json
    from collections import Counter
    doc = json.loads(subprocess.run(CTRACER + ["functions", "struct", struct, "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    routes = Counter(m["function"] for m in doc["methods"] if not m["tracepoint"])
    return {f for f, n in routes.items() if n <= most}


def _spread(names: list[str], size: int) -> list[str]:
    """``size`` of ``names`` evenly spaced through them (all when ``size`` is 0 or more)."""
    if not size or size >= len(names):
        return list(names)
    return [names[i * len(names) // size] for i in range(size)]


def _by_size(args, tmp: str) -> None:
    """Attach + detach of each kind on the same subsets, smallest first (`_spread`)."""
    few = _few_routes(args.struct, args.max_routes)
    names = [f for f in _unique_in_kallsyms(_planned(args.struct, args.functions)) if f in few]
    print(f"by size: {len(names)} planned functions of at most {args.max_routes} routes "
          f"that kallsyms names once", flush=True)
    runs = [(size, kind) for size in sorted(args.sizes) for kind in args.kinds]
    runs += [(0, kind) for kind in args.all_kinds]
    seen: dict[int, dict] = {}
    for size, kind in runs:
        subset = _spread(names, size)
        try:
            got = _ctracer_attach(args.struct, subset, os.path.join(tmp, f"s{size}-{kind}.ctrace"),
                                  kind)
        except SystemExit as e:
            print(f"  {len(subset)} functions, {kind}: could not run: {e}", flush=True)
            continue
        total = got["attach"] + got["detach"]
        each = total / max(got["functions"] - got["failed"], 1)
        seen.setdefault(len(subset), {})[kind] = total
        print(f"  {len(subset)} functions, --function-probes {kind}: {got['functions']} "
              f"probed, {got['failed']} failed; attach {got['attach']:.1f} s + detach "
              f"{got['detach']:.1f} s = {total:.1f} s ({each:.3f} s a function; bcc compile "
              f"{got['compile']:.1f} s more; the whole command {got['wall']:.1f} s; load "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    first = args.kinds[0]
    for n, kinds in sorted(seen.items()):
        if first in kinds and len(kinds) > 1:
            print(f"  {n} functions: " + ", ".join(
                f"{k}/{first} {t / max(kinds[first], 1e-9):.3f}x"
                for k, t in kinds.items() if k != first), flush=True)


def _ctracer_attach(struct: str, globs: list[str], out: str, kind: str) -> dict:
    cmd = CTRACER + ["trace", "struct", struct, "-d", "1", "-q", "-o", out,
                     "--function-probes", kind]
    if globs:
        cmd += ["--functions", *globs]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    # "(fsession.multi)", or "(kernel functions: N on fentry.multi, M on kprobe)" when one
    # recording mixes kinds
    m = re.search(r"probes on (\d+) functions(?: \([^)]*\))?, (\d+) failed.*bcc compile "
                  r"([\d.]+) s, attach "
                  r"([\d.]+) s, detach ([\d.]+) s", r.stderr)
    if not m:
        raise SystemExit(f"ctracer trace failed: {r.stderr[-1500:]}")
    n, failed, comp, att, det = m.groups()
    return {"functions": int(n), "failed": int(failed), "compile": float(comp),
            "attach": float(att), "detach": float(det), "wall": wall}


def _bpftrace(script: str, env_extra: dict, until: str = "Attaching") -> tuple[subprocess.Popen, str, float]:
    out = tempfile.NamedTemporaryFile("w+", delete=False, suffix=".bt")
    env = dict(os.environ, **env_extra)
    start = time.monotonic()
    p = subprocess.Popen(["bpftrace", "-B", "full", "-e", script], stdout=out,
                         stderr=subprocess.STDOUT, env=env)
    while True:
        text = open(out.name).read()
        if time.monotonic() - start > 900:
            p.kill()
            raise SystemExit(f"bpftrace did not attach in 900 s: {text.strip()[-800:]!r}")
        if p.poll() is not None:
            raise SystemExit(f"bpftrace ended (exit {p.returncode}): "
                             f"{text.strip()[-800:]!r} (its output: {out.name})")
        if until in text and "Attaching" in text:
            break
        time.sleep(0.2)
    return p, out.name, time.monotonic() - start


def _drained(path: str, start: float, quiet: float = 3.0) -> float:
    """Seconds from ``start`` until the file at ``path`` last grew, once it has not grown
    for ``quiet`` seconds (bpftrace prints what its buffers hold after the workload)."""
    size, grew = -1, time.monotonic()
    while time.monotonic() - grew < quiet:
        now = os.path.getsize(path)
        if now != size:
            size, grew = now, time.monotonic()
        time.sleep(0.1)
    return grew - start


#: seconds any one step may take before the bench gives up on it, saying which (a TCG
#: guest once sat idle for 15 minutes inside a step, and nothing said where)
STEP_TIMEOUT_S = 900


def _stop(p: subprocess.Popen, what: str = "bpftrace") -> float:
    start = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        p.wait(STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        raise SystemExit(f"{what} did not stop in {STEP_TIMEOUT_S} s after Ctrl-C") from None
    return time.monotonic() - start


def _workload(messages: int) -> float:
    start = time.monotonic()
    try:
        subprocess.run([TCPLOOP, "--connections", "2", "--messages", str(messages),
                        "--bytes", "64"], check=True, capture_output=True,
                       timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"tcploop did not finish in {STEP_TIMEOUT_S} s") from None
    return time.monotonic() - start


def _started(ct: subprocess.Popen, log: str) -> None:
    """Wait until ctracer says it records (its log at ``log``)."""
    start = time.monotonic()
    while "recording struct" not in open(log).read():
        if ct.poll() is not None:
            raise SystemExit(open(log).read()[-1500:])
        if time.monotonic() - start > STEP_TIMEOUT_S:
            ct.kill()
            raise SystemExit(f"ctracer did not start recording in {STEP_TIMEOUT_S} s: "
                             f"{open(log).read()[-800:]!r}")
        time.sleep(0.3)


def _traced_run(struct: str, functions, fields, tmp: str, name: str,
                messages: int, kind: str = "auto") -> tuple[float, int, int]:
    """The workload's seconds under ctracer tracing ``functions`` (``fields``: the
    mini's, all when empty), and the events written and lost."""
    log = os.path.join(tmp, f"{name}.log")
    cmd = CTRACER + ["trace", "struct", struct, "--functions", *functions, "-o",
                     os.path.join(tmp, f"{name}.ctrace"), "-d", "3600", "--buffer-mb", "64",
                     "--function-probes", kind]
    if fields:
        cmd += ["--fields", *fields]
    ct = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    _started(ct, log)
    seconds = _workload(messages)
    _stop(ct, "ctracer")
    return (seconds, *_written_and_lost(open(log).read()))


def _written_and_lost(log: str) -> tuple[int, int]:
    """The events written and lost, from ctracer's last summary line (the progress
    lines before it say the same words)."""
    found = re.findall(r"(\d+) events, \d+ object addresses, (\d+) lost", log)
    return (int(found[-1][0]), int(found[-1][1])) if found else (0, -1)


def _program_ids() -> set[int]:
    """The ids of the BPF programs loaded now."""
    import json
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    return {int(p["id"]) for p in json.loads(r.stdout or "[]")}


def _program_stats(ids: set[int]) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs of ``ids``
    (``kernel.bpf_stats_enabled`` on)."""
    import json
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    ns = cnt = 0
    for prog in json.loads(r.stdout or "[]"):
        if int(prog["id"]) in ids:
            ns += int(prog.get("run_time_ns", 0))
            cnt += int(prog.get("run_cnt", 0))
    return ns, cnt


def _settled(before: set[int], quiet: float = 5.0, limit: float = 600.0) -> set[int]:
    """The programs loaded since ``before``, once their number has not grown for
    ``quiet`` seconds: bpftrace says "Attaching" before it has loaded them all (its
    kfunc programs take a while in a guest; read at once, none was found and the
    empty fentry probes' run time came out 0)."""
    start = time.monotonic()
    ids, grew = _program_ids() - before, time.monotonic()
    while time.monotonic() - grew < quiet and time.monotonic() - start < limit:
        time.sleep(0.5)
        now = _program_ids() - before
        if len(now) != len(ids):
            ids, grew = now, time.monotonic()
    return ids


def _start_recording(struct: str, hot: list[str], kind: str, fields: list[str], tmp: str,
                     args, name: str, *extra: str) -> tuple[subprocess.Popen, str, str, set[int]]:
    """ctracer recording ``hot`` with ``kind`` (``fields``; every field when empty), once
    it records: the process, its log, its trace file and the ids of its BPF programs."""
    log = os.path.join(args.logs or tmp, f"{name}.log")
    trace = os.path.join(tmp, f"{name}.ctrace")
    cmd = CTRACER + ["trace", "struct", struct, "--functions", *hot, "-o", trace,
                     "-d", "3600", "--buffer-mb", str(args.buffer_mb),
                     "--function-probes", kind, *extra]
    if fields:
        cmd += ["--fields", *fields]
    before = _program_ids()
    ct = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    _started(ct, log)
    return ct, log, trace, _program_ids() - before


def _per_call(struct: str, hot: list, kind: str, base: float, tmp: str, args,
              fields: list[str]) -> None:
    """Cost per traced call: the workload under bpftrace's empty entry+exit probes of
    ``kind`` and under ctracer on the same functions, each with the BPF programs' own
    run time (``bpf_stats``), so the probes' cost is told apart from ctracer's reader
    (which, in a guest whose vCPUs share one host thread, slows the workload too).
    ``fields``: ctracer's ``--fields`` (every field when empty)."""
    entry, ret = {"fentry": ("kfunc", "kretfunc"), "kprobe": ("kprobe", "kretprobe")}[kind]
    script = ",".join(f"{entry}:{f},{ret}:{f}" for f in hot) + " { }"
    before = _program_ids()
    bt, _, _ = _bpftrace(script, {})
    theirs = _settled(before)
    empty = min(_workload(args.messages) for _ in range(args.rounds))
    empty_ns, empty_cnt = _program_stats(theirs)
    _stop(bt)
    name = f"percall-{kind}-{len(fields) or 'all'}"
    ct, log, _, ours = _start_recording(struct, hot, kind, fields, tmp, args, name)
    rounds = [_workload(args.messages) for _ in range(args.rounds)]
    ours_ns, ours_cnt = _program_stats(ours)
    _stop(ct, "ctracer")
    written, lost = _written_and_lost(open(log).read())
    # every field of a million events is most of a guest's tmpfs: only the counts stay
    for leftover in (os.path.join(tmp, f"{name}.ctrace"), os.path.join(tmp, f"{name}.ctrace-wal")):
        if os.path.exists(leftover):
            os.remove(leftover)
    traced = min(rounds)
    pairs = max(empty_cnt // 2 // args.rounds, 1)   # calls of one workload run
    empty_prog = empty_ns / max(empty_cnt, 1)      # ns per program run (entry or exit)
    ours_prog = ours_ns / max(ours_cnt, 1)
    mechanism = (empty - base) * 1e9 / pairs - 2 * empty_prog   # the probe machinery's
    estimate = (mechanism + 2 * ours_prog) / max(mechanism + 2 * empty_prog, 1e-9)
    print(f"per call, {kind}, {len(hot)} functions on entry and exit, ~{pairs} calls a run: "
          f"BPF program run time per entry or exit: ctracer {ours_prog:.0f} ns "
          f"({', '.join(fields) or 'every field'}), bpftrace's empty probe {empty_prog:.0f} ns; "
          f"the probe machinery ~{mechanism:.0f} ns a call; cost per traced call against the empty probes "
          f"{estimate:.2f}x (goal <= 1.3). Workload: untraced {base:.2f} s, empty probes "
          f"{empty:.2f} s, ctracer {traced:.2f} s (rounds {', '.join(f'{r:.2f}' for r in rounds)}"
          f"; {written} events, {lost} lost; its reader shares the guest's one host "
          f"thread): {(traced - base) / max(empty - base, 1e-3):.2f}x", flush=True)


#: the two fields the events figure and the peer comparison record
TWO_FIELDS = ["skc_state", "sk_sndbuf"]


def _peer_script(hot: list[str], family: str) -> str:
    """bpftrace recording what ctracer's two-field recording keeps of each call: at entry
    and at return the time, the thread, the object's address and its two fields, one
    printed line each (not the return value: bpftrace refuses ``retval`` of a void
    function). ``family``: "fentry" (kfunc/kretfunc) or
    "kprobe" (kprobe/kretprobe, the entry's object kept for its return in a map of the
    function's own, keyed by thread)."""
    fields = "$s->__sk_common.skc_state, $s->sk_sndbuf"
    probes = []
    for i, f in enumerate(hot):
        if family == "fentry":
            probes.append(f"kfunc:{f} {{ $s = args->sk; printf(\"{f} e %llu %d %p %d %d\\n\", "
                          f"nsecs, tid, $s, {fields}); }}")
            probes.append(f"kretfunc:{f} {{ $s = args->sk; printf(\"{f} x %llu %d %p %d %d\\n\", "
                          f"nsecs, tid, $s, {fields}); }}")
        else:
            probes.append(f"kprobe:{f} {{ $s = (struct sock *)arg0; @o{i}[tid] = arg0; "
                          f"printf(\"{f} e %llu %d %p %d %d\\n\", nsecs, tid, $s, {fields}); }}")
            probes.append(f"kretprobe:{f} {{ $s = (struct sock *)@o{i}[tid]; "
                          f"delete(@o{i}[tid]); printf(\"{f} x %llu %d %p %d %d\\n\", "
                          f"nsecs, tid, $s, {fields}); }}")
    return " ".join(probes)


def _bpftrace_recording(hot: list[str], family: str, tmp: str, args) -> dict:
    """The workload under bpftrace recording the two fields (``_peer_script``): best of
    ``--rounds`` runs, the lines printed and lost, its programs' run time and runs."""
    before = _program_ids()
    # a perf ring as large as ctracer's (--buffer-mb over the guest's CPUs): with
    # bpftrace's default most lines of a run were lost
    pages = args.buffer_mb * 256 // max(os.cpu_count() or 1, 1)
    bt, out, _ = _bpftrace(_peer_script(hot, family),
                           {"BPFTRACE_PERF_RB_PAGES": str(1 << max(pages.bit_length() - 1, 0))})
    theirs = _settled(before)
    start_ns, start_cnt = _program_stats(theirs)
    runs = [_workload(args.messages) for _ in range(args.rounds)]
    _drained(out, time.monotonic())
    ns, cnt = _program_stats(theirs)
    _stop(bt)
    text = open(out).read()
    os.remove(out)
    lines = sum(1 for line in text.splitlines() if line.startswith(tuple(hot)))
    lost = sum(int(m) for m in re.findall(r"Lost (\d+) events", text))
    return {"runs": runs, "calls": lines // 2, "lost": lost, "ns": ns - start_ns,
            "prog_runs": cnt - start_cnt, "programs": len(theirs)}


def _program_table(ids: set[int]) -> list[dict]:
    """Name, runs, run time and sizes of the BPF programs of ``ids``."""
    import json
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    return [{"id": int(p["id"]), "name": p.get("name", "?"), "type": p.get("type", "?"),
             "run_cnt": int(p.get("run_cnt", 0)), "run_time_ns": int(p.get("run_time_ns", 0)),
             "xlated": int(p.get("bytes_xlated", 0)), "jited": int(p.get("bytes_jited", 0))}
            for p in json.loads(r.stdout or "[]") if int(p["id"]) in ids]


def _ctracer_recording(struct: str, hot: list[str], kind: str, fields: list[str],
                       tmp: str, args, tag: str) -> dict:
    """The workload under ctracer recording ``hot`` with ``kind`` (``fields``; every
    field when empty): best of ``--rounds`` runs, events written and lost, its programs'
    run time and runs, and its programs one by one."""
    name = f"peer-{kind}-{len(fields) or 'all'}-{tag}"
    # no lifetime rules: the peer follows no lifetimes either
    ct, log, trace, ours = _start_recording(struct, hot, kind, fields, tmp, args, name,
                                            "--lifetime-rule", "none")
    start = {p["id"]: p for p in _program_table(ours)}
    runs = [_workload(args.messages) for _ in range(args.rounds)]
    table = _program_table(ours)
    if args.logs and tag == "r1":
        # what the verifier and the JIT made of each program, to read beside the figures
        for p in table:
            for what in ("xlated", "jited"):
                with open(os.path.join(args.logs, f"{name}-{p['id']}-{p['name']}.{what}"),
                          "w") as f:
                    subprocess.run(["bpftool", "prog", "dump", what, "id", str(p["id"])],
                                   stdout=f, stderr=subprocess.STDOUT)
    _stop(ct, "ctracer")
    text = open(log).read()
    written, lost = _written_and_lost(text)
    for leftover in (trace, trace + "-wal"):
        if os.path.exists(leftover):
            os.remove(leftover)
    probes = re.search(r"probes on .*", text)
    # the functions' programs (entry and exit, or one session program run at both): a
    # call is two runs of them; the events written hold other records too
    funcs = [p for p in table if p["type"] in ("tracing", "kprobe")]
    ns = sum(p["run_time_ns"] - start.get(p["id"], {}).get("run_time_ns", 0) for p in funcs)
    cnt = sum(p["run_cnt"] - start.get(p["id"], {}).get("run_cnt", 0) for p in funcs)
    return {"runs": runs, "calls": cnt // 2, "lost": lost, "ns": ns, "events": written,
            "prog_runs": cnt, "programs": len(funcs), "table": table,
            "probes": probes.group(0)[:200] if probes else "?"}


def _peer_rounds(struct: str, hot: list[str], tmp: str, args) -> None:
    """Per traced call, ctracer's kinds (``--kinds``) against bpftrace recording the same
    two fields on the same functions (``--peers``), ``--peer-rounds`` rounds in one boot,
    the variants' order rotating each round; each variant's figures per round and the
    medians. A call's added time: the workload's best run traced minus the round's best
    untraced run, over the calls of one run; BPF time a call: the programs' run time
    (``bpf_stats``, counted from the first workload run) over the calls recorded."""
    import statistics
    variants = [("ctracer", k, "two") for k in args.kinds] + \
        [("ctracer", k, "all") for k in args.all_fields_kinds] + \
        [("bpftrace", fam, "two") for fam in args.peers]
    results: dict[tuple, list[dict]] = {v: [] for v in variants}
    for r in range(args.peer_rounds):
        base = min(_workload(args.messages) for _ in range(args.rounds))
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        print(f"round {r + 1}: untraced {base:.3f} s (best of {args.rounds}), load "
              f"{os.getloadavg()[0]:.1f}; order {', '.join(f'{v[0]} {v[1]} {v[2]}' for v in order)}",
              flush=True)
        for v in order:
            who, kind, fset = v
            try:
                if who == "ctracer":
                    got = _ctracer_recording(struct, hot, kind,
                                             TWO_FIELDS if fset == "two" else [], tmp,
                                             args, f"r{r + 1}")
                else:
                    got = _bpftrace_recording(hot, kind, tmp, args)
            except SystemExit as e:
                print(f"  {who} {kind} {fset} fields: could not run: {e}", flush=True)
                continue
            per_run = got["calls"] / args.rounds
            got["added_us"] = (min(got["runs"]) - base) * 1e6 / max(per_run, 1)
            got["bpf_ns"] = got["ns"] / max(got["calls"], 1)
            results[v].append(got)
            print(f"  {who} {kind}, {fset} fields: runs "
                  f"{', '.join(f'{x:.3f}' for x in got['runs'])} s, {got['calls']} calls "
                  f"recorded ({per_run:.0f} a run), {got['lost']} lost; added "
                  f"{got['added_us']:.2f} us a call; BPF {got['bpf_ns']:.0f} ns a call "
                  f"({got['prog_runs']} program runs = {got['prog_runs'] / max(got['calls'], 1):.2f} "
                  f"a call, {got['programs']} programs)", flush=True)
            if who == "ctracer":
                print(f"    {got['probes']}", flush=True)
                for p in sorted(got["table"], key=lambda p: -p["run_time_ns"])[:6]:
                    print(f"    {p['name']} {p['type']}: {p['run_cnt']} runs, "
                          f"{p['run_time_ns'] / max(p['run_cnt'], 1):.0f} ns a run, "
                          f"xlated {p['xlated']} B, jited {p['jited']} B", flush=True)
    print("medians over the rounds (added time a call, BPF time a call):", flush=True)
    med = {}
    for v in variants:
        if results[v]:
            med[v] = (statistics.median(g["added_us"] for g in results[v]),
                      statistics.median(g["bpf_ns"] for g in results[v]))
            print(f"  {v[0]} {v[1]} {v[2]} fields: {med[v][0]:.2f} us, {med[v][1]:.0f} ns "
                  f"({len(results[v])} rounds)", flush=True)
    peers = [v for v in variants if v[0] == "bpftrace" and v in med]
    for v in variants:
        if v[0] != "ctracer" or v not in med:
            continue
        for p in peers:
            print(f"  ctracer {v[1]} {v[2]} fields / bpftrace {p[1]} two fields: added "
                  f"{med[v][0] / max(med[p][0], 1e-9):.2f}x, BPF {med[v][1] / max(med[p][1], 1e-9):.2f}x",
                  flush=True)
    for fset in ("two", "all"):
        s, f = ("ctracer", "fsession.multi", fset), ("ctracer", "fentry.multi", fset)
        if s in med and f in med:
            pairs = [(a["added_us"] / max(b["added_us"], 1e-9), a["bpf_ns"] / max(b["bpf_ns"], 1e-9))
                     for a, b in zip(results[s], results[f])]
            print(f"  fsession.multi / fentry.multi, {fset} fields, per round: "
                  f"{'; '.join(f'added {a:.2f}x, BPF {b:.2f}x' for a, b in pairs)}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--struct", default="sock")
    p.add_argument("--functions", nargs="*", default=[],
                   help="globs of the functions for attach + detach (default: every method)")
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--skip-attach", action="store_true")
    p.add_argument("--attach-only", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", nargs="*", type=int, default=[],
                   help="attach + detach of each of --kinds on this many of the planned "
                        "functions, evenly spaced (instead of every method against bpftrace)")
    p.add_argument("--all-kinds", nargs="*", default=[],
                   help="with --sizes: the kinds also run on every planned function of at "
                        "most --max-routes routes")
    p.add_argument("--max-routes", type=int, default=4,
                   help="with --sizes: only functions of at most this many routes (6.1's "
                        "verifier refuses the kprobe entry program of 5-8)")
    p.add_argument("--buffer-mb", type=int, default=64,
                   help="ctracer's ring for the per-call runs (a lost event skips its "
                        "snapshot and flatters the figure: make it hold a run's events)")
    p.add_argument("--logs", help="where ctracer's output goes (e.g. vm-run's --out)")
    p.add_argument("--events-messages", type=int,
                   help="tcploop's messages for the events figure (default --messages)")
    p.add_argument("--skip-events", action="store_true",
                   help="leave out the events-written figure (per call only)")
    p.add_argument("--kinds", nargs="*", default=["fentry", "kprobe"],
                   help="ctracer's probe kinds for attach + detach and per call "
                        "(none: only the events figure)")
    p.add_argument("--peer-rounds", type=int, default=0,
                   help="per call against bpftrace recording the same two fields: rounds "
                        "in one boot, the variants' order rotating (replaces the per-call "
                        "figures against the empty probes)")
    p.add_argument("--peers", nargs="*", default=["fentry", "kprobe"],
                   help="bpftrace's probe families for --peer-rounds (fentry: kfunc/"
                        "kretfunc; kprobe: kprobe/kretprobe)")
    p.add_argument("--all-fields-kinds", nargs="*", default=[],
                   help="for --peer-rounds, ctracer's kinds recording every field too "
                        "(--kinds record the two fields skc_state and sk_sndbuf)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_kmethods: needs root", file=sys.stderr)
        return 2
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    tmp = tempfile.mkdtemp(prefix="bench-kmethods-", dir="/var/tmp")
    print(f"kernel {os.uname().release}, load {os.getloadavg()[0]:.1f}")

    if args.sizes or args.all_kinds:
        _by_size(args, tmp)
    elif not args.skip_attach:
        functions = _unique_in_kallsyms(_planned(args.struct, args.functions))
        probes = ",".join(f"kprobe:{f}" for f in functions)
        bt, _, bt_attach = _bpftrace(probes + " { }",
                                     {"BPFTRACE_MAX_PROBES": str(len(functions) + 100)})
        bt_detach = _stop(bt)
        theirs = bt_attach + bt_detach
        print(f"bpftrace, {len(functions)} kprobes (the planned functions kallsyms names "
              f"once): start to attached {bt_attach:.1f} s + detach {bt_detach:.1f} s = "
              f"{theirs:.1f} s", flush=True)
        for kind in args.kinds:
            ours = _ctracer_attach(args.struct, args.functions,
                                   os.path.join(tmp, f"a-{kind}.ctrace"), kind)
            total = ours["attach"] + ours["detach"]
            print(f"ctracer --function-probes {kind}, {ours['functions']} functions "
                  f"({ours['failed']} failed): attach {ours['attach']:.1f} s + detach "
                  f"{ours['detach']:.1f} s = {total:.1f} s (bcc compile {ours['compile']:.1f} s "
                  f"more; the whole command {ours['wall']:.1f} s); ratio to bpftrace "
                  f"{total / theirs:.2f} (goal <= 1; with our compile "
                  f"{(total + ours['compile']) / theirs:.2f})", flush=True)

    if args.attach_only:
        return 0
    if args.peer_rounds:
        subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"], check=True)
        _peer_rounds(args.struct, _unique_in_kallsyms(list(HOT)), tmp, args)
        return 0 if args.skip_events else _events(args, tmp)
    base = min(_workload(args.messages) for _ in range(args.rounds))
    print(f"per call: tcploop {args.messages} messages x 2 connections untraced "
          f"{base:.2f} s (best of {args.rounds})", flush=True)
    subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"], check=True)
    hot = _unique_in_kallsyms(list(HOT))
    for kind in args.kinds:
        for fields in ([], ["skc_state", "sk_sndbuf"]):
            _per_call(args.struct, hot, kind, base, tmp, args, fields)
    if args.skip_events:
        return 0
    return _events(args, tmp)


def _events(args, tmp: str) -> int:
    """Events written: ctracer on six functions, two fields, against bpftrace printing
    the same."""
    messages = args.events_messages or args.messages
    six = _unique_in_kallsyms(["tcp_sendmsg", "tcp_recvmsg", "tcp_rcv_established", "tcp_ack",
                               "tcp_data_queue", "tcp_v4_do_rcv"])
    traced, events, lost = _traced_run(args.struct, six, ["skc_state", "sk_sndbuf"], tmp, "e",
                                       messages)
    print(f"events: ctracer on {len(six)} functions (entry and exit), 2 fields: {events} "
          f"events, {lost} lost, in {traced:.2f} s ({events / traced:.0f}/s)", flush=True)
    # bpftrace 0.17 refuses the func builtin in kfunc/kretfunc probes: the name is
    # written into each probe's format instead
    script = " ".join(f"kfunc:{f} {{ printf(\"{f} %d %d\\n\", args->sk->__sk_common.skc_state, "
                      "args->sk->sk_sndbuf); } "
                      f"kretfunc:{f} {{ printf(\"{f} %d %d\\n\", args->sk->__sk_common.skc_state, "
                      "args->sk->sk_sndbuf); }" for f in six)
    try:
        bt, out, _ = _bpftrace(script, {})
        start = time.monotonic()
        _workload(messages)
        printed_time = _drained(out, start)
        _stop(bt)
        text = open(out).read()
        if args.logs:
            shutil.copy(out, os.path.join(args.logs, "bpftrace-printing.txt"))
        lines = sum(1 for line in text.splitlines() if line.startswith(("tcp_", "__tcp")))
        dropped = sum(int(m) for m in re.findall(r"Lost (\d+) events", text))
        print(f"bpftrace printing the same functions' entries and exits, 2 fields: {lines} "
              f"lines, {dropped} lost, in {printed_time:.2f} s (the workload until its last line) ({lines / printed_time:.0f}/s); "
              f"ctracer/bpftrace events per second: "
              f"{(events / traced) / max(lines / printed_time, 1):.2f} (goal >= 2)")
    except SystemExit as e:
        print(f"bpftrace printing could not run: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
