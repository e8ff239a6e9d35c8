"""The probe plan on hand-built methods and kernel facts: the kind chosen by what the kernel
accepted (fentry, kprobe, kprobe.multi, raw tracepoints, uprobes), and every reason a
function is left out."""

from ctracer.debuginfo.catalog import FunctionInfo, Inline, Parameter, ShapeKind, TracepointInfo, TypeShape
from ctracer.host.facts import KernelFacts, Mechanism
from ctracer.plan.attach import PROBE_KINDS, mixed_in, plan_probes
from ctracer.plan.discovery import Method

YES, NO = Mechanism(True, "tried: works"), Mechanism(False, "tried: refused")
SOCK = TypeShape(ShapeKind.STRUCT, "sock", 1, text="struct sock *")
VOID = TypeShape(ShapeKind.VOID, None, 0, text="void")


def method(name, kind="direct", **kw):
    f = FunctionInfo(name, (Parameter("sk", SOCK),), VOID, **kw)
    return Method(f, kind, "struct sock", 0, "sk", "struct sock *", route_form="struct sock",
                  probeable=not kw.get("inlined_only"),
                  not_probeable="inline only: no out-of-line copy" if kw.get("inlined_only") else "")


def tracepoint(name):
    return Method(TracepointInfo(name, (Parameter("sk", SOCK),)), "tracepoint", "struct sock",
                  0, "sk", "struct sock *", route_form="struct sock")


METHODS = [method("tcp_close"), method("tcp_close", kind="holder"), method("sk_free"),
           method("sk_is_ready", inlined_only=True, inline=Inline.DECLARED_INLINED),
           method("__SCT__tp_func_sock_x"), method("__bpf_trace_inet_sock_set_state"),
           method("tcp_v4_rcv_helper"), method("sk_notrace"),
           tracepoint("inet_sock_set_state"), tracepoint("bare_tp")]
SYMBOLS = frozenset({"tcp_close", "sk_free", "__SCT__tp_func_sock_x", "sk_notrace",
                     "__bpf_trace_inet_sock_set_state", "tcp_v4_rcv_helper.isra.0"})


def facts(**kw):
    base = dict(fentry=NO, kprobes=NO, kprobe_multi=NO, raw_tracepoints=YES, uprobes=YES,
                symbols=SYMBOLS, symbols_source="available_filter_functions",
                notrace=frozenset({"sk_notrace"}),
                clones={"tcp_v4_rcv_helper": ("tcp_v4_rcv_helper.isra.0",)},
                tracepoints={"inet_sock_set_state": True, "bare_tp": False})
    base.update(kw)
    return KernelFacts(**base)


def kinds(plan):
    return {f: [p.kind for p in ps] for f, ps in plan.by_function().items()}


def test_neither_fentry_nor_kprobes_plans_kprobes_not_attachable_and_uses_tracepoints():
    plan = plan_probes(METHODS, facts())
    assert kinds(plan)["tcp_close"] == ["kprobe", "kretprobe"]
    close = plan.by_function()["tcp_close"]
    assert all(p.attachable is False and "neither fentry nor kprobes" in p.reason for p in close)
    assert len(close[0].methods) == 2            # one probe serves both ways in
    placed = plan.placed()
    assert [(p.function, p.kind) for p in placed] == [("tp:inet_sock_set_state", "raw_tracepoint")]
    assert plan.counts()["kprobe"] == {"attachable": 0, "not attachable": 2, "unknown": 0}


def test_fentry_is_preferred_where_it_loads():
    plan = plan_probes(METHODS, facts(fentry=YES, kprobes=YES))
    assert kinds(plan)["sk_free"] == ["fentry", "fexit"]
    assert all(p.attachable for p in plan.by_function()["sk_free"])


def test_fentry_multi_is_preferred_where_tracing_multi_links_work():
    plan = plan_probes(METHODS, facts(fentry=YES, kprobes=YES, kprobe_multi=YES,
                                      tracing_multi=YES))
    assert kinds(plan)["sk_free"] == ["fentry.multi", "fexit.multi"]
    assert all(p.attachable for p in plan.by_function()["sk_free"])
    assert "tracing_multi links work here" in plan.by_function()["sk_free"][0].reason
    # asked for fentry or kprobes: that kind still
    fentry = plan_probes(METHODS, facts(fentry=YES, kprobes=YES, tracing_multi=YES),
                         prefer="fentry")
    assert kinds(fentry)["sk_free"] == ["fentry", "fexit"]
    # asked for where the kernel refuses it: not attachable, with the trial's reason
    refused = plan_probes(METHODS, facts(fentry=YES, kprobes=YES,
                                         tracing_multi=Mechanism(False, "EINVAL here")),
                          prefer="fentry.multi").by_function()["sk_free"]
    assert [p.kind for p in refused] == ["fentry.multi", "fexit.multi"]
    assert refused[0].attachable is False and "EINVAL here" in refused[0].reason
    # not asked for and refused: fentry, as before
    assert kinds(plan_probes(METHODS, facts(fentry=YES, kprobes=YES,
                                            tracing_multi=NO)))["sk_free"] == ["fentry", "fexit"]


def test_fsession_multi_is_preferred_where_tracing_multi_links_run_session_programs():
    """One session probe a function (its program runs at entry and exit); the pair
    where the session trial failed, saying why; either asked for by name."""
    both = dict(fentry=YES, kprobes=YES, kprobe_multi=YES, tracing_multi=YES)
    plan = plan_probes(METHODS, facts(**both, fsession_multi=YES))
    assert kinds(plan)["sk_free"] == ["fsession.multi"]
    assert plan.by_function()["sk_free"][0].attachable
    assert "session programs work here" in plan.by_function()["sk_free"][0].reason
    pair = plan_probes(METHODS, facts(**both, fsession_multi=Mechanism(False, "no kfunc")))
    assert kinds(pair)["sk_free"] == ["fentry.multi", "fexit.multi"]
    assert "no session programs: no kfunc" in pair.by_function()["sk_free"][0].reason
    forced = plan_probes(METHODS, facts(**both, fsession_multi=YES), prefer="fentry.multi")
    assert kinds(forced)["sk_free"] == ["fentry.multi", "fexit.multi"]
    refused = plan_probes(METHODS, facts(**both, fsession_multi=Mechanism(False, "no kfunc")),
                          prefer="fsession.multi").by_function()["sk_free"]
    assert [p.kind for p in refused] == ["fsession.multi"]
    assert refused[0].attachable is False and "no kfunc" in refused[0].reason
    # without tracing_multi, no session either
    assert kinds(plan_probes(METHODS, facts(fentry=YES, kprobes=YES, tracing_multi=NO,
                                            fsession_multi=YES)))["sk_free"] == ["fentry", "fexit"]


def test_a_struct_returned_by_value_goes_on_kprobes_beside_fentry():
    batch = TypeShape(ShapeKind.STRUCT, "desc_batch", 0, text="struct desc_batch")
    f = FunctionInfo("xsk_peek_batch", (Parameter("sk", SOCK),), batch)
    m = Method(f, "direct", "struct sock", 0, "sk", "struct sock *", route_form="struct sock")
    symbols = SYMBOLS | {"xsk_peek_batch"}
    mixed = plan_probes([m, method("tcp_close")], facts(fentry=YES, kprobes=YES, symbols=symbols))
    entry, exit_ = mixed.by_function()["xsk_peek_batch"]
    assert (entry.kind, exit_.kind) == ("kprobe", "kretprobe") and entry.placed
    assert "returning a struct by value: kprobes instead" in entry.reason and mixed_in(entry)
    assert kinds(mixed)["tcp_close"] == ["fentry", "fexit"]
    assert not mixed_in(mixed.by_function()["tcp_close"][0])
    # the kind asked for is kept to: left out, saying auto traces it
    asked = plan_probes([m], facts(fentry=YES, kprobes=YES, symbols=symbols), prefer="fentry")
    (left,) = asked.by_function()["xsk_peek_batch"]
    assert left.kind is None and "returning a struct by value" in left.reason
    assert "--function-probes fentry asked for it alone; auto traces it" in left.reason
    # no kprobes here: left out, saying so
    (left,) = plan_probes([m], facts(fentry=YES, kprobes=NO, symbols=symbols)
                          ).by_function()["xsk_peek_batch"]
    assert left.kind is None and "kprobes are refused here" in left.reason
    kprobe = plan_probes([m], facts(fentry=YES, kprobes=YES, symbols=symbols), prefer="kprobe")
    assert kinds(kprobe)["xsk_peek_batch"] == ["kprobe", "kretprobe"]
    assert not mixed_in(kprobe.by_function()["xsk_peek_batch"][0])
    logf = FunctionInfo("nf_log_packet", (Parameter("sk", SOCK),), VOID, variadic=True)
    m = Method(logf, "direct", "struct sock", 0, "sk", "struct sock *", route_form="struct sock")
    plan = plan_probes([m], facts(fentry=YES, kprobes=YES, kprobe_multi=YES,
                                  symbols=SYMBOLS | {"nf_log_packet"}))
    entry = plan.by_function()["nf_log_packet"][0]
    assert entry.kind == "kprobe" and "variable arguments" in entry.reason
    assert "through a kprobe.multi link" in entry.reason


def test_more_arguments_than_a_trampoline_takes_go_on_kprobes_beside_it():
    def with_params(n):
        f = FunctionInfo(f"send_{n}", tuple(Parameter(f"a{i}", SOCK) for i in range(n)), VOID)
        return Method(f, "direct", "struct sock", 0, "a0", "struct sock *",
                      route_form="struct sock")
    methods = [with_params(12), with_params(14)]
    symbols = SYMBOLS | {"send_12", "send_14"}
    for multi in (YES, NO):
        plan = plan_probes(methods, facts(fentry=YES, kprobes=YES, tracing_multi=multi,
                                          symbols=symbols)).by_function()
        entry = plan["send_14"][0]
        assert entry.kind == "kprobe" and entry.placed and mixed_in(entry)
        assert "14 arguments" in entry.reason and "at most 12" in entry.reason
        assert "one perf kprobe each" in entry.reason   # no kprobe.multi in these facts
        assert plan["send_12"][0].kind in ("fentry", "fentry.multi") and plan["send_12"][0].placed
        asked = plan_probes(methods, facts(fentry=YES, kprobes=YES, tracing_multi=multi,
                                           symbols=symbols),
                            prefer="fentry.multi" if multi is YES else "fentry").by_function()
        (left,) = asked["send_14"]
        assert left.kind is None and "14 arguments" in left.reason and "auto traces it" in left.reason
    session = plan_probes(methods, facts(fentry=YES, kprobes=YES, tracing_multi=YES,
                                         fsession_multi=YES, symbols=symbols)).by_function()
    assert kinds_of_plan(session) == {"send_12": ["fsession.multi"],
                                      "send_14": ["kprobe", "kretprobe"]}
    assert mixed_in(session["send_14"][0])
    kprobe = plan_probes(methods, facts(fentry=YES, kprobes=YES, symbols=symbols), prefer="kprobe")
    assert kinds(kprobe)["send_14"] == ["kprobe", "kretprobe"]


def kinds_of_plan(by_function):
    return {f: [p.kind for p in ps] for f, ps in by_function.items()}


def test_kprobes_when_fentry_is_refused_saying_whether_kprobe_multi_links():
    multi = plan_probes(METHODS, facts(kprobes=YES, kprobe_multi=YES)).by_function()["sk_free"]
    single = plan_probes(METHODS, facts(kprobes=YES)).by_function()["sk_free"]
    assert [p.kind for p in multi] == ["kprobe", "kretprobe"] and multi[0].attachable
    assert "kprobe.multi link" in multi[0].reason
    assert "one kprobe per function" in single[0].reason


def test_left_out_functions_with_their_reasons():
    plan = plan_probes(METHODS, facts(kprobes=YES))
    why = {p.function: p.reason for p in plan.left_out()}
    assert why["sk_is_ready"].startswith("inline only")
    assert why["__SCT__tp_func_sock_x"].startswith("static-call trampoline")
    assert why["__bpf_trace_inet_sock_set_state"].startswith("tracepoint glue")
    assert why["tcp_v4_rcv_helper"].startswith("only a compiler clone exists: tcp_v4_rcv_helper.isra.0")
    assert why["sk_notrace"].startswith("notrace")
    assert set(why) == {"sk_is_ready", "__SCT__tp_func_sock_x", "__bpf_trace_inet_sock_set_state",
                        "tcp_v4_rcv_helper", "sk_notrace"}
    assert all(p.kind is None and not p.placed for p in plan.left_out())


def test_a_missing_symbol_names_the_list_it_is_missing_from():
    plan = plan_probes([method("gone")], facts(kprobes=YES, symbols_source="/proc/kallsyms"))
    assert plan.left_out()[0].reason.startswith("not in /proc/kallsyms")


def test_tracepoints_by_what_the_kernel_said():
    plan = plan_probes(METHODS, facts())
    tps = {p.function: p for p in plan.of_kind("raw_tracepoint")}
    assert tps["tp:inet_sock_set_state"].attachable is True
    assert tps["tp:bare_tp"].attachable is False and "refused" in tps["tp:bare_tp"].reason
    assert tps["tp:bare_tp"].target == "bare_tp"
    refused = plan_probes(METHODS, facts(raw_tracepoints=NO)).of_kind("raw_tracepoint")
    assert all(p.attachable is False for p in refused)


def test_unknown_kernel_support_gives_unknown_not_yes():
    unknown = Mechanism(None, "needs root")
    plan = plan_probes(METHODS, facts(fentry=unknown, kprobes=unknown, raw_tracepoints=unknown,
                                      tracepoints=None, symbols=None))
    assert {p.attachable for p in plan.probes if p.kind} == {None}


def test_fentry_unknown_without_root_is_not_called_refused():
    plan = plan_probes(METHODS, facts(fentry=Mechanism(None, "needs root")))
    close = plan.by_function()["tcp_close"]
    assert [p.attachable for p in close] == [None, None] and "fentry not known" in close[0].reason
    assert plan.counts()["kprobe"]["unknown"] == len(plan.of_kind("kprobe")) == 2


def test_types_of_another_kernel_are_planned_but_not_checked_against_this_one():
    plan = plan_probes(METHODS, facts(running_kernel=False, symbols=None, tracepoints=None))
    assert kinds(plan)["tcp_v4_rcv_helper"] == ["kprobe", "kretprobe"]
    assert all(p.attachable is None for p in plan.probes if p.kind)


def test_user_space_functions_get_uprobes():
    ms = [method("parse", address=0x1000), method("decl_only")]
    plan = plan_probes(ms, facts(), space="user")
    assert kinds(plan) == {"decl_only": [None], "parse": ["uprobe", "uretprobe"]}
    assert plan.by_function()["parse"][0].attachable is True


def test_every_kind_is_a_known_probe_kind():
    for f in (facts(), facts(fentry=YES), facts(kprobes=YES),
              facts(tracing_multi=YES, fsession_multi=YES)):
        plan = plan_probes(METHODS, f)
        assert {p.kind for p in plan.probes} - {None} <= set(PROBE_KINDS)


def test_auto_takes_kprobes_over_per_function_fentry_above_the_counts():
    """Where fentry attaches a function at a time, ``auto`` takes kprobe.multi links
    above FENTRY_AUTO_MAX functions, and without them (6.1) perf kprobes above
    FENTRY_AUTO_MAX_PERF_KPROBES, with the reason; never where kprobes do not attach;
    and `ctracer plan` says what the trace will do."""
    from ctracer.commands.plan import _trace_kind_note
    from ctracer.plan import selection
    multi = facts(fentry=YES, kprobes=YES, kprobe_multi=YES)
    perf = facts(fentry=YES, kprobes=YES)
    top = selection.FENTRY_AUTO_MAX_PERF_KPROBES
    assert selection.auto_kprobes_instead(selection.FENTRY_AUTO_MAX, multi) is None
    assert "kprobe.multi links attach and detach them all at once" in \
        selection.auto_kprobes_instead(selection.FENTRY_AUTO_MAX + 1, multi)
    assert selection.auto_kprobes_instead(top, perf) is None
    why = selection.auto_kprobes_instead(top + 1, perf)
    assert why.startswith(f"{top + 1} functions: one perf kprobe each (no kprobe.multi link")
    assert selection.auto_kprobes_instead(10 ** 4, facts(fentry=YES)) is None
    many = [method(f"sk_f{i}") for i in range(top + 1)]
    names = SYMBOLS | {m.name for m in many}
    named = facts(fentry=YES, kprobes=YES, symbols=names)
    assert _trace_kind_note(plan_probes(many, named)) == [
        f"ctracer trace probes these functions with perf kprobes and kretprobes by default "
        f"({why})"]
    assert _trace_kind_note(plan_probes(many[:top], named)) == []
