"""`ctracer diff` of two kernels on synthetic traces: the same simulated workload
recorded under two kernels whose function tables and struct layouts differ (a function
of one kernel only, functions renamed or cloned, a member added, a recorded field moved
or present in one layout only), so that what the diff says can be checked against what
was changed."""

from __future__ import annotations

import dataclasses

import pytest

from ctracer.analysis.diff import CHANGES, FINAL, FUNCTION, compare
from ctracer.event import Layout
from ctracer.report.diff_page import describe, write_page
from ctracer.report.profiles import read_profiles
from support.synthetic_trace import MINI, write_synthetic_trace

OLD_LAYOUT = ("struct sock {\n\tstruct sock_common sk_common; /* 0 136 */\n"
              "\tint sk_err; /* 136 4 */\n\tint sk_pacing_rate; /* 140 4 */\n};")
NEW_LAYOUT = ("struct sock {\n\tstruct sock_common sk_common; /* 0 136 */\n"
              "\tstruct tcp_ao_info * sk_ao_info; /* 136 8 */\n"
              "\tint sk_err; /* 144 4 */\n\tlong sk_pacing_rate; /* 152 8 */\n};")


def _layout(offsets: dict[str, int], renamed: dict[str, str]) -> Layout:
    fields = []
    for f in MINI.fields:
        source = dict(f.source, byte_offset=offsets.get(f.name, f.offset), ctype=f.ctype)
        fields.append(dataclasses.replace(f, name=renamed.get(f.name, f.name), source=source))
    return Layout(MINI.name, tuple(fields), MINI.size)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Two runs a kernel; the new kernel's tables rename, clone and replace functions."""
    d = tmp_path_factory.mktemp("kernels")
    old, new = [], []
    for seed in (1, 2):
        path = str(d / f"old-{seed}.ctrace")
        write_synthetic_trace(path, lifecycles=5, seed=seed, kernel="6.12.0-old",
                              layout=_layout({}, {}), full_layout=OLD_LAYOUT)
        old.append(path)
        path = str(d / f"new-{seed}.ctrace")
        write_synthetic_trace(
            path, lifecycles=5, seed=seed, kernel="7.2.0-new",
            renamed={"sock_init_data": "sock_init_data_uid",
                     "tcp_set_state": "tcp_set_state.isra.0",
                     "tcp_poll": "xdp_umem_ready"},
            layout=_layout({"sk_err": 144}, {"sk_prio_class": "sk_txrehash"}),
            full_layout=NEW_LAYOUT)
        new.append(path)
    profiles = read_profiles(old + new)
    return compare(profiles[:2], profiles[2:])


def test_a_function_of_one_kernel_only_is_named_so(kernels):
    assert kernels.across_kernels and kernels.kernels == ("6.12.0-old", "7.2.0-new")
    assert kernels.presence.before_only == ["tcp_poll"]
    assert kernels.presence.after_only == ["xdp_umem_ready"]
    gone = [d for d in kernels.differences if d.kind == FUNCTION and d.subject == "tcp_poll"]
    new = [d for d in kernels.differences if d.kind == FUNCTION
           and d.subject == "xdp_umem_ready"]
    assert len(gone) == len(new) == 1
    assert gone[0].exists_only == "before" and new[0].exists_only == "after"
    text = describe(gone[0], kernels.unit)
    assert "exists in the before kernel only" in text and "no longer" not in text
    assert "exists in the after kernel only" in describe(new[0], kernels.unit)


def test_renamed_and_cloned_functions_are_matched_not_gone_and_new(kernels):
    pairs = {m.before: m.after for m in kernels.matches}
    assert pairs == {"sock_init_data": "sock_init_data_uid",
                     "tcp_set_state": "tcp_set_state.isra.0"}
    evidence = {m.before: " ".join(m.evidence) for m in kernels.matches}
    assert "clone" in evidence["tcp_set_state"]
    assert "param 2 sk" in evidence["sock_init_data"]
    # the same workload under both names: the matched functions differ in nothing
    # beyond noise, and never as one gone and one new
    for d in kernels.differences:
        names = {d.subject, d.function, *d.subject.split(" → ")}
        assert not names & {"sock_init_data_uid", "tcp_set_state.isra.0"}
        if names & {"sock_init_data", "tcp_set_state"} and \
                d.field not in ("sk_prio_class", "sk_txrehash"):  # a field of one layout
            assert d.noise is True and not d.only, d


def test_members_moved_added_or_in_one_layout_only_are_listed(kernels):
    what = {m.name: m.what for m in kernels.members}
    assert what["sk_ao_info"] == "added"
    assert what["sk_err"] == "moved"
    assert what["sk_pacing_rate"] == "type changed, moved"
    assert what["sk_prio_class"] == "removed" and what["sk_txrehash"] == "added"
    assert "sk_common" not in what and "sk_refcnt" not in what
    # a field of one layout only is not "changed to 0" nor compared by its final values
    for d in kernels.differences:
        if d.field in ("sk_prio_class", "sk_txrehash"):
            assert d.kind == CHANGES, d
            text = describe(d, kernels.unit)
            assert "layout" in text and "no longer" not in text and "now changed" not in text
        assert not (d.kind == FINAL and d.field in ("sk_prio_class", "sk_txrehash"))


def test_the_page_leads_with_the_kernel_headlines(kernels, tmp_path):
    page = write_page(kernels, str(tmp_path / "diff"), {"before": None, "after": None}, [])
    html = open(page, encoding="utf-8").read()
    order = [html.index(s) for s in ('id="headlines"', 'id="functions"', 'id="members"',
                                     'id="differences"')]
    assert order == sorted(order)
    assert "Linux 6.12.0-old → 7.2.0-new" in html
    assert "sock_init_data_uid" in html and "sk_ao_info" in html
    headlines = kernels.headlines()
    assert [d.subject for d in headlines["functions new to the path"]] == ["xdp_umem_ready"]


def test_members_of_an_anonymous_union_are_the_structs_own():
    """7.2 puts sk_rcu in an anonymous union with sk_freeptr: moved, not removed."""
    from ctracer.report.profiles import top_level_members
    text = ("struct sock {\n\tint a; /* 0 4 */\n\tunion {\n\t\tstruct callback_head sk_rcu;"
            " /* 8 16 */\n\t\tfreeptr_t sk_freeptr; /* 8 8 */\n\t};  /* 8 16 */\n"
            "\tstruct {\n\t\tint len; /* 24 4 */\n\t} sk_backlog; /* 24 4 */\n};")
    assert dict(top_level_members(text)) == {"a": (0, "int"),
                                             "sk_rcu": (8, "struct callback_head"),
                                             "sk_freeptr": (8, "freeptr_t")}
