"""``struct sk_buff`` through its allocation and freeing functions, in the guests: over the
loopback workload, each buffer's lifetime (as the export gives it) ends where it is freed
(``consume_skb``, the ``kfree_skb`` family, the ``kfree_skb`` tracepoint), and what
ctracer recorded at ``consume_skb``'s and ``__kfree_skb``'s entries — the buffer and its
``len`` — is what bpftrace's kprobes on the same functions read in the same run, in the
same window of time (both clocks are CLOCK_MONOTONIC)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.kernelrun import stop_bpftrace, wait_for_text

from support import groundtruth as gt

pytestmark = pytest.mark.vm

CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")
#: globs that match on both kernels (6.1 frees through kfree_skb_reason, 6.12 through
#: sk_skb_reason_drop, whose name varies; the kfree_skb tracepoint fires in both)
FUNCTIONS = ("__alloc_skb", "consume_skb", "*kfree_skb*", "skb_release_data", "tcp_v4_rcv",
             "ip_rcv")


def _is_free(function: str) -> bool:
    return function in ("consume_skb", "tp:consume_skb") or "kfree_skb" in function


@pytest.fixture(scope="module")
def skb_run(tmp_path_factory):
    """One recording of sk_buff's functions over the workload, bpftrace beside it."""
    tmp_path = tmp_path_factory.mktemp("skb")
    bt_out = tmp_path / "bpftrace.txt"
    bt = subprocess.Popen(["bpftrace", "-B", "line", "-e",
                           "kprobe:consume_skb,kprobe:__kfree_skb { "
                           "printf(\"skb %llu %s %lu %u\\n\", nsecs, func, arg0, "
                           "((struct sk_buff *)arg0)->len); }"],
                          stdout=open(bt_out, "w"), stderr=subprocess.STDOUT)
    wait_for_text(bt_out, "Attaching", bt, 900)
    log, trace = tmp_path / "ctracer.log", tmp_path / "skb.ctrace"
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sk_buff", "--functions", *FUNCTIONS,
                                     "--fields", "len", "data_len", "truesize", "-d", "900",
                                     "-o", str(trace)],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for_text(log, "recording struct sk_buff", ct)
    begin = time.monotonic_ns()   # CLOCK_MONOTONIC, the probes' bpf_ktime_get_ns too
    work = subprocess.run([TCPLOOP, "--connections", "3", "--messages", "2"],
                          capture_output=True, text=True, timeout=300)
    assert work.returncode == 0, work.stderr
    time.sleep(1)
    end = time.monotonic_ns()
    ct.send_signal(signal.SIGINT)
    assert ct.wait(300) == 130, log.read_text()  # 128 + SIGINT
    stop_bpftrace(bt, bt_out)
    print(log.read_text().splitlines()[-3:])
    jsonl = tmp_path / "skb.jsonl"
    r = subprocess.run(CTRACER + ["export", str(trace), "--format", "jsonl", "-o", str(jsonl)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return events, bt_out.read_text(), begin, end


def _brief(e) -> str:
    return (f"{e['time_ns']} tid {e['tid']} {e['function']} {e['phase']} depth {e['depth']} "
            f"lifetime {e['lifetime']}")


def test_freed_buffers_and_their_lengths_equal_bpftrace(vm_kernel, skb_run):
    events, bt_text, begin, end = skb_run
    # both sides within the same window: both recorders run longer than the workload
    theirs = collections.Counter()
    for line in bt_text.splitlines():
        if line.startswith("skb "):
            _, ns, func, address, length = line.split()
            if begin <= int(ns) <= end:
                theirs[(func, int(address), int(length))] += 1
    ours = collections.Counter((e["function"], int(e["object"], 16), e["fields"]["len"])
                               for e in events if e["phase"] == "entry"
                               and e["function"] in ("consume_skb", "__kfree_skb")
                               and begin <= e["time_ns"] <= end)
    assert theirs and ours == theirs


def test_lifetimes_end_where_the_buffer_is_freed(vm_kernel, skb_run):
    events = skb_run[0]
    by_life = collections.defaultdict(list)
    for e in events:
        by_life[(e["object"], e["lifetime"])].append(e)
    ended = 0
    for life in by_life.values():
        frees = [i for i, e in enumerate(life) if _is_free(e["function"])
                 and e["phase"] in ("entry", "tracepoint")]
        if not frees:
            continue
        ended += 1
        # once the outermost free is entered, on its thread only calls nested in it and
        # the returns of the calls it was made from follow (a caller's exit still names
        # the buffer): no new call takes it, and no other thread touches it
        first = life[frees[0]]
        rest = life[frees[0]:]
        wrong = [e for e in rest if not (e["tid"] == first["tid"] and (
            e["phase"] in ("tracepoint", "exit") or e["depth"] >= first["depth"]))]
        assert not wrong, [_brief(e) for e in [first] + wrong[:5]]
    assert ended >= 10
