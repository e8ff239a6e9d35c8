"""Lifetime rules (`ctracer.plan.lifetime_rules`) as a user sees and changes them: the defaults,
``--lifetime-rule`` parsed and checked against the traced tracepoints (one line on bad
input), enumerator names looked up in the kernel's BTF, and the rules in the C and in
the trace's meta."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ctracer.errors import UsageError
from ctracer.plan import lifetime_rules

KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")

pytestmark = pytest.mark.usefixtures("private_cache")


def test_parse_rule_and_its_text():
    rule = lifetime_rules.parse_rule("starts:inet_sock_set_state:oldstate=TCP_CLOSE", "sock",
                                {"TCP_CLOSE": 7}.get)
    assert (rule.effect, rule.function, rule.arg, rule.equals) == \
        ("starts", "inet_sock_set_state", "oldstate", 7)
    assert rule.text == "starts:inet_sock_set_state:oldstate=TCP_CLOSE"
    assert rule.applies({"oldstate": 7}) and not rule.applies({"oldstate": 2})
    ends = lifetime_rules.parse_rule("ends:tcp_destroy_sock", "sock")
    assert ends.arg is None and ends.applies({}) and ends.text == "ends:tcp_destroy_sock"
    assert lifetime_rules.parse_rule("starts:x:a=0x10", "sock").equals == 16
    for bad in ("begins:x", "starts:", "starts:x:a", "starts:x:a=", "starts:x:a=1;b"):
        with pytest.raises(UsageError, match="expected starts|ends"):
            lifetime_rules.parse_rule(bad, "sock")
    with pytest.raises(UsageError, match="no enumerator TCP_NOPE"):
        lifetime_rules.parse_rule("starts:x:a=TCP_NOPE", "sock")


def test_the_sock_defaults_end_a_lifetime_at_tcp_destroy_sock():
    rules = {r.text: r for r in lifetime_rules.rules_for("sock")}
    assert set(rules) == {"starts:inet_sock_set_state:oldstate=TCP_CLOSE",
                          "starts:inet_sock_set_state:newstate=TCP_SYN_RECV",
                          "ends:tcp_destroy_sock", "ends:sk_destruct"}
    assert rules["ends:sk_destruct"].probe == "function"
    assert rules["ends:tcp_destroy_sock"].probe == "tracepoint"
    starts = [r for r in rules.values() if r.effect == "starts"]

    def starting(old, new):
        return [r.text for r in starts if r.applies({"oldstate": old, "newstate": new})]
    # client or listener out of TCP_CLOSE; an accepted socket, a copy of its listener,
    # at its first transition TCP_LISTEN -> TCP_SYN_RECV; never a listener's close nor
    # a connected socket's transitions
    assert starting(7, 2) == starting(7, 10) == ["starts:inet_sock_set_state:oldstate=TCP_CLOSE"]
    assert starting(10, 3) == ["starts:inet_sock_set_state:newstate=TCP_SYN_RECV"]
    assert starting(10, 7) == starting(2, 1) == starting(3, 1) == starting(1, 4) == []


def test_only_named_functions_end_a_life_never_a_word_in_a_name():
    """``tcp_stream_memory_free`` frees nothing: a function's rule comes from the list
    or from --lifetime-rule, and a tracepoint of the rule's name is preferred."""
    ending = {r.function for r in lifetime_rules.rules_for("sk_buff") if r.probe == "function"}
    assert "kfree_skbmem" in ending and "skb_free_head" not in ending
    assert not {r.function for r in lifetime_rules.rules_for("sock")
                if r.probe == "function"} & {"sk_free", "tcp_stream_memory_free", "sock_kfree_s"}

    class M:  # a traced method as discovery gives it
        def __init__(self, name, tracepoint, param_index=0):
            self.name, self.is_tracepoint, self.param_index = name, tracepoint, param_index
            self.path, self.holder = (), None
    both = [M("consume_skb", True), M("consume_skb", False), M("kfree_skbmem", False, 0)]
    placed = lifetime_rules.place([lifetime_rules.parse_rule("ends:consume_skb", "sk_buff"),
                              lifetime_rules.parse_rule("ends:kfree_skbmem", "sk_buff")], both)
    assert [(r.function, r.probe) for r in placed] == [("consume_skb", "tracepoint"),
                                                       ("kfree_skbmem", "function")]
    with pytest.raises(UsageError, match="not a traced tracepoint"):
        lifetime_rules.place([lifetime_rules.parse_rule("starts:kfree_skbmem", "sk_buff")], both)
    # a default naming a tracepoint never falls back to a function of that name
    with pytest.raises(UsageError):
        lifetime_rules.place([r for r in lifetime_rules.rules_for("sk_buff")
                         if r.function == "consume_skb"], both[1:])


def _print_bpf(*options):
    return subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                           "--print-bpf", *options], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("rule, words", [
    ("ends:tcp_nothing", "tcp_nothing is neither a traced tracepoint handing sock itself"),
    ("starts:inet_sock_set_state:state=TCP_CLOSE", "has no argument state (it has sk, "
                                                   "oldstate, newstate)"),
    ("starts:inet_sock_set_state:oldstate=TCP_NOPE", "no enumerator TCP_NOPE"),
    ("starts", "expected starts|ends:TRACEPOINT"),
])
@pytest.mark.kernel
def test_a_rule_the_trace_cannot_use_is_one_line(rule, words):
    if not KERNEL_BTF.exists():
        pytest.skip("this kernel has no BTF at /sys/kernel/btf/vmlinux")
    r = _print_bpf("--lifetime-rule", rule)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and words in r.stderr, r.stderr


@pytest.mark.kernel
def test_rules_given_replace_the_defaults_in_the_c():
    if not KERNEL_BTF.exists():
        pytest.skip("this kernel has no BTF at /sys/kernel/btf/vmlinux")
    default = _print_bpf("--comm", "x").stdout
    only_end = _print_bpf("--comm", "x", "--lifetime-rule", "ends:tcp_destroy_sock").stdout
    none = _print_bpf("--comm", "x", "--lifetime-rule", "none").stdout
    # a transition out of TCP_CLOSE (7, from the kernel's enum) starts one by default
    starts = "starts a lifetime when args[1] (oldstate) == 7"
    assert starts in default and starts not in only_end
    assert "tcp_destroy_sock" in default and "; ends a lifetime" in default
    assert "; ends a lifetime" in only_end and "lifetime" not in none.split("ctracer_tps")[-1]
    both = _print_bpf("--comm", "x", "--lifetime-rule", "none", "--lifetime-rule",
                      "ends:tcp_destroy_sock")
    assert both.returncode != 0 and "goes alone" in both.stderr
    # a tracepoint's probe evaluates two rules starting a life and one ending it: more is
    # refused in one line, not silently dropped
    two = _print_bpf("--comm", "x", "--lifetime-rule", "starts:inet_sock_set_state:newstate=1",
                     "--lifetime-rule", "starts:inet_sock_set_state:oldstate=2")
    assert two.returncode == 0 and "starts a lifetime when args[2] (newstate) == 1" in two.stdout \
        and "starts a lifetime when args[1] (oldstate) == 2" in two.stdout
    three = _print_bpf("--comm", "x", *(f"--lifetime-rule=starts:inet_sock_set_state:newstate={n}"
                                        for n in (1, 2, 3)))
    assert three.returncode != 0 and "Traceback" not in three.stderr
    assert three.stderr.strip().count("\n") == 0 and \
        "inet_sock_set_state takes at most 2 starts rules" in three.stderr, three.stderr
    user = _print_bpf("--binary", sys.executable, "--lifetime-rule", "ends:x")
    assert user.returncode != 0 and "--lifetime-rule select kernel objects" in user.stderr


@pytest.mark.kernel
def test_the_trace_meta_carries_the_rules_as_used():
    if not KERNEL_BTF.exists():
        pytest.skip("this kernel has no BTF at /sys/kernel/btf/vmlinux")
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.record.request import TraceRequest, build
    built = build(TraceRequest(ShapeKind.STRUCT, "sock",
                               lifetime_rules=("ends:tcp_destroy_sock",
                                               "starts:inet_sock_set_state:newstate=TCP_SYN_SENT")))
    rules = built.meta["lifetime_rules"]
    assert [(r["function"], r["effect"], r["arg"], r["equals"]) for r in rules] == [
        ("tcp_destroy_sock", "ends", None, None),
        ("inet_sock_set_state", "starts", "newstate", 2)]
    assert all("(--lifetime-rule)" in r["rule"] for r in rules)
    json.dumps(rules)


def test_a_stand_in_default_goes_where_the_free_it_stands_for_is_traced():
    placed = [dataclasses.replace(r, probe="function" if r.function == "sk_destruct"
                                  else "tracepoint") for r in lifetime_rules.rules_for("sock")]
    kept = {r.text for r in lifetime_rules.without_stand_ins(placed)}
    assert "ends:tcp_destroy_sock" not in kept and "ends:sk_destruct" in kept
    only_tracepoints = [r for r in placed if r.probe == "tracepoint"]
    assert lifetime_rules.without_stand_ins(only_tracepoints) == tuple(only_tracepoints)
