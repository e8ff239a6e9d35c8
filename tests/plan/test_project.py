"""Project files (`ctracer.plan.project`, `ctracer project init`, `ctracer trace
--project`): what init writes loads back and selects everything; every error in a file
is one line naming the file, the line and, for an unknown name, the close names."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support import groundtruth as gt
from ctracer.errors import CtracerError, UsageError
from ctracer.plan import project


def write(tmp_path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return str(path)


def ctracer(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_a_minimal_file_and_relative_paths(tmp_path):
    p = project.load(write(tmp_path, 'struct = "sock"\nbinary = "prog"\n'))
    assert (p.kind, p.name, p.binary) == ("struct", "sock", str(tmp_path / "prog"))
    assert p.functions == p.fields == p.cachelines == () and p.max_bytes is None
    p = project.load(write(tmp_path, 'union = "u"\n[fields]\ncachelines = [1, 3]\n'
                                     'max_bytes = 64\npointers = true\n'))
    assert (p.kind, p.cachelines, p.max_bytes, p.pointers) == ("union", (1, 3), 64, True)


@pytest.mark.parametrize("text, line, words", [
    ('struct = "sock"\n[fields]\ninclud = ["a"]\n', 3, "unknown key 'includ'; did you mean include"),
    ('struct = "sock"\nbinry = "x"\n', 2, "unknown key 'binry'; did you mean binary"),
    ('struct = "sock"\n[fields]\ncachelines = [1, "x"]\n', 3, "cachelines must be a list"),
    ('struct = "sock"\n[fields]\nmax_bytes = 0\n', 3, "max_bytes must be"),
    ('struct = "sock"\n[functions]\ninclude = "tcp_*"\n', 3, "include must be a list"),
    ('binary = "x"\n', 0, "say which struct to trace"),
    ('struct = "not a name"\n', 1, "is not a C struct name"),
])
def test_shape_errors_name_the_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        project.load(path)
    where = f"{path}:{line}: " if line else f"{path}: "
    assert str(e.value).startswith(where) and words in str(e.value), str(e.value)


def test_syntax_errors_and_missing_files(tmp_path):
    with pytest.raises(UsageError, match=r"not valid TOML: .*line 2"):
        project.load(write(tmp_path, 'struct = "sock"\n[fields\n'))
    with pytest.raises(CtracerError, match="no such file"):
        project.load(str(tmp_path / "missing.toml"))


def test_unknown_names_are_placed_and_close_names_offered(tmp_path):
    text = ('struct = "sock"\n[functions]\ninclude = [\n  "tcp_close",\n  "tcp_clse",\n]\n'
            '[fields]\ninclude = ["sk_lock.owned", "sk_lok"]\n')
    p = project.load(write(tmp_path, text))
    methods = ["tcp_close", "tcp_connect", "sk_free"]
    fields = ["sk_lock.owned", "sk_lock.slock.held", "sk_err"]
    with pytest.raises(UsageError) as e:
        p.check(methods, fields)
    assert str(e.value) == (f"{p.path}:5: [functions] include: 'tcp_clse' names no method of "
                            "struct sock; did you mean tcp_close, tcp_connect?")
    p = project.load(write(tmp_path, text.replace('"tcp_clse"', '"tcp_*"')))
    with pytest.raises(UsageError) as e:
        p.check(methods, fields)
    assert str(e.value).startswith(f"{p.path}:8: [fields] include: 'sk_lok' names no "
                                   "recordable field") and "sk_lock" in str(e.value)
    p.check(methods, ["sk_lok"] + fields)     # a struct's path names its fields


def test_init_writes_every_method_and_field_and_trace_uses_it(tmp_path):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    out = tmp_path / "sock.toml"
    r = ctracer("project", "init", "struct", "sock", "--binary", gt.SOCKDEMO, "-o", str(out))
    assert r.returncode == 0, r.stderr
    p = project.load(str(out))
    assert p.binary == gt.SOCKDEMO and p.name == "sock"
    assert "tcp_close" in p.functions and "sk_check@tcp.c" in p.functions
    assert {"sk_lock.slock.held", "__sk_common.skc_refcnt", "sk_mutex.locked",
            "sk_accept_waiters.empty", "sk_name", "sk_pacing_delta"} <= set(p.fields)
    r = ctracer("project", "init", "struct", "sock", "--binary", gt.SOCKDEMO, "-o", str(out))
    assert r.returncode == 1 and "exists" in r.stderr and "Traceback" not in r.stderr
    everything = ctracer("trace", "struct", "sock", "--binary", gt.SOCKDEMO, "--print-bpf")
    from_file = ctracer("trace", "--project", str(out), "--print-bpf")
    assert everything.returncode == from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == everything.stdout
    # an edited file: fewer functions and fields
    out.write_text(f'struct = "sock"\nbinary = "{gt.SOCKDEMO}"\n[functions]\n'
                   'include = ["tcp_*"]\nexclude = ["tcp_close"]\n[fields]\n'
                   'include = ["sk_lock", "__sk_common.skc_state", "sk_err", "sk_stats"]\n'
                   'max_bytes = 16\n')
    r = ctracer("trace", "--project", str(out), "--print-bpf")
    assert r.returncode == 0, r.stderr
    functions = set(re.findall(r"^/\* (\w+): entry \*/$", r.stdout, re.M))
    assert functions == {"tcp_set_state", "tcp_sendmsg", "tcp_recvmsg", "tcp_accept",
                         "tcp_rcv_nxt_update"}
    mini = re.search(r"struct ctracer__mini_sock \{(.*?)\}", r.stdout, re.S).group(1)
    names = set(re.findall(r"(\w+);", mini))
    # in source order while 16 bytes hold them: the 8-byte sk_stats counters do not fit,
    # the first 4-byte one still does
    assert names == {"sk_lock__owned", "sk_lock__slock__held", "__sk_common__skc_state",
                     "sk_err", "sk_stats__rx_packets"}, names
    r = ctracer("trace", "sock", "--project", str(out), "--print-bpf")
    assert r.returncode == 2 and "give no NAME with --project" in r.stderr


@pytest.mark.kernel
def test_lifetime_rules_from_the_file_as_from_the_command_line(tmp_path):
    """``[objects] lifetime_rules`` replaces the defaults as ``--lifetime-rule`` does (the
    same program); a rule the kernel's tracepoints refuse names the file's line."""
    p = project.load(write(tmp_path, 'struct = "sock"\n[objects]\nlifetime_rules = '
                                     '["ends:tcp_destroy_sock"]\n'))
    assert p.lifetime_rules == ("ends:tcp_destroy_sock",)
    assert project.load(write(tmp_path, 'struct = "sock"\n')).lifetime_rules is None
    with pytest.raises(UsageError, match=r"p.toml:3: \[objects\] lifetime_rules must be a list"):
        project.load(write(tmp_path, 'struct = "sock"\n[objects]\nlifetime_rules = "x"\n'))
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.skip("the kernel part needs the running kernel's BTF")
    path = write(tmp_path, 'struct = "sock"\n[objects]\nlifetime_rules = [\n'
                           '  "ends:tcp_destroy_sock",\n]\n')
    from_file = ctracer("trace", "--project", path, "--print-bpf")
    given = ctracer("trace", "struct", "sock", "--lifetime-rule", "ends:tcp_destroy_sock",
                    "--print-bpf")
    defaults = ctracer("trace", "struct", "sock", "--print-bpf")
    assert from_file.returncode == given.returncode == defaults.returncode == 0, from_file.stderr
    assert from_file.stdout == given.stdout != defaults.stdout
    path = write(tmp_path, 'struct = "sock"\n[objects]\nlifetime_rules = [\n'
                           '  "ends:tcp_destroy_sock",\n  "starts:no_such_tracepoint",\n]\n')
    r = ctracer("trace", "--project", path, "--print-bpf")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert f"{path}:5: [objects] lifetime_rules: 'starts:no_such_tracepoint': " \
           "no_such_tracepoint is not a traced tracepoint" in r.stderr, r.stderr


def test_summary_fields_name_recorded_fields_or_the_line(tmp_path):
    """``[objects] summary_fields``: recorded fields by path or by a last name only one
    has; a field the trace does not record, or a name two share, names the file's line."""
    path = write(tmp_path, 'struct = "sock"\n[objects]\nsummary_fields = [\n'
                           '  "sk_wmem_queued",\n  "__sk_common.skc_num",\n  "held",\n]\n')
    p = project.load(path)
    assert p.summary_fields == ("sk_wmem_queued", "__sk_common.skc_num", "held")
    recorded = ["sk_wmem_queued", "__sk_common.skc_num", "sk_lock.slock.held",
                "sk_mutex.locked"]
    assert p.summary_paths(recorded) == ("sk_wmem_queued", "__sk_common.skc_num",
                                         "sk_lock.slock.held")
    with pytest.raises(UsageError) as e:
        p.summary_paths(["sk_wmem_queued", "__sk_common.skc_num"])
    assert str(e.value).startswith(f"{path}:6: [objects] summary_fields: 'held' is not a "
                                   "recorded field"), str(e.value)
    with pytest.raises(UsageError, match=r":6: .*'held' is ambiguous: a.held, b.held"):
        p.summary_paths(["sk_wmem_queued", "__sk_common.skc_num", "a.held", "b.held"])
    with pytest.raises(UsageError, match=r"p.toml:3: \[objects\] summary_fields must be a list"):
        project.load(write(tmp_path, 'struct = "sock"\n[objects]\nsummary_fields = "x"\n'))
    assert project.load(write(tmp_path, 'struct = "sock"\n')).summary_fields == ()


def test_trace_refuses_summary_fields_it_does_not_record(tmp_path):
    """The check runs on the mini struct a trace builds (before any compile): a summary
    field that [fields] leaves out is one line naming the file's line."""
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    text = (f'struct = "sock"\nbinary = "{gt.SOCKDEMO}"\n[fields]\n'
            'include = ["__sk_common.skc_state", "sk_err"]\n[objects]\n'
            'summary_fields = ["sk_err", "sk_wmem_queued"]\n')
    path = write(tmp_path, text)
    r = ctracer("trace", "--project", path, "--print-bpf")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"ctracer: error: {path}:6: [objects] summary_fields: "
                                "'sk_wmem_queued' is not a recorded field (its [fields] may "
                                "leave it out; ctracer struct --mini lists them)"), r.stderr
    r = ctracer("trace", "--project", write(tmp_path, text.replace(', "sk_wmem_queued"', "")),
                "--print-bpf")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "init.toml"
    r = ctracer("project", "init", "struct", "sock", "--binary", gt.SOCKDEMO, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "# summary_fields = [" in out.read_text()  # said, for a person to fill in
