"""`ctracer trace` on bad input: one line on stderr, a non-zero exit, no traceback, and
no trace file left behind.  None of these needs BPF (the failures happen before, or the
check runs as an unprivileged user)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support import groundtruth as gt


@pytest.fixture(scope="module", autouse=True)
def built():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)


def ctracer(args, tmp_path, *, as_nobody=False, env=None):
    argv = [sys.executable, "-m", "ctracer", *args]
    if as_nobody and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is not installed (util-linux)")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + argv
        os.chmod(tmp_path, 0o777)
    full_env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
                "HOME": str(tmp_path), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=full_env,
                          timeout=300)


def assert_one_line_error(r, *words):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ctracer"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_binary(tmp_path):
    r = ctracer(["trace", "sock", "--binary", str(tmp_path / "nope"), "--", "true"], tmp_path)
    assert_one_line_error(r, "no such file")


def test_binary_without_debug_info(tmp_path):
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-g", "-o", str(stripped), gt.SOCKDEMO], check=True)
    r = ctracer(["trace", "sock", "--binary", str(stripped), "--", str(stripped)], tmp_path)
    assert_one_line_error(r, "debug info")


def test_unknown_struct_suggests_close_names(tmp_path):
    r = ctracer(["trace", "struct", "sockk", "--binary", gt.SOCKDEMO, "--print-bpf"], tmp_path)
    assert_one_line_error(r, "no struct sockk", "did you mean", "sock")


def test_struct_without_methods(tmp_path):
    r = ctracer(["trace", "sock_stats", "--binary", gt.SOCKDEMO, "--", gt.SOCKDEMO], tmp_path)
    assert_one_line_error(r, "nothing to probe")


def test_function_glob_matching_nothing(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "--functions", "tcp_sendmsgg"],
                tmp_path)
    assert_one_line_error(r, "tcp_sendmsgg", "did you mean", "tcp_sendmsg")


def test_field_glob_matching_nothing(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "--fields", "sk_rcvbuff"], tmp_path)
    assert_one_line_error(r, "sk_rcvbuff")


def test_kernel_object_options_need_a_kernel_trace(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "--where", "sk_state == 1",
                 "--print-bpf"], tmp_path)
    assert_one_line_error(r, "--where", "kernel")


def test_command_without_double_dash(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, gt.SOCKDEMO], tmp_path)
    assert_one_line_error(r, "after --")


def test_pid_and_command_together(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "-p", "1", "--", gt.SOCKDEMO],
                tmp_path)
    assert_one_line_error(r, "-p")


def test_no_such_process(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "-p", "999999999"], tmp_path)
    assert_one_line_error(r, "no process")


def test_not_root(tmp_path):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "--", gt.SOCKDEMO], tmp_path,
                as_nobody=True)
    assert_one_line_error(r, "root")
    assert not (tmp_path / "sock.ctrace").exists()


@pytest.mark.parametrize("target", [["sock", "--binary", gt.SOCKDEMO], ["struct", "sock"]])
@pytest.mark.parametrize("command, words", [
    ("no-such-command-ctracer", "command not found"),
    ("/no/such/program", "no such file"),
    ("/etc", "is a directory"),
    ("/etc/passwd", "not executable")])
def test_a_command_that_cannot_run_exits_127_before_anything_is_compiled(tmp_path, target,
                                                                        command, words):
    """As a shell says it (127), and before the seconds of compiling: run as nobody, the
    recording would stop at 'needs root' after building the probes, so 127 here shows
    the command was checked first."""
    r = ctracer(["trace", *target, "--", command], tmp_path, as_nobody=True)
    assert_one_line_error(r, f"cannot run {command}", words)
    assert r.returncode == 127


@pytest.mark.parametrize("extra, words", [(["--", gt.SOCKDEMO], "-- COMMAND"),
                                          (["-d", "3"], "-d"), (["--tail"], "--tail")])
def test_print_bpf_refuses_what_it_would_ignore(tmp_path, extra, words):
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "--print-bpf", *extra], tmp_path)
    assert_one_line_error(r, "--print-bpf prints the program and records nothing", words)
    assert r.returncode == 2


def test_a_field_glob_is_suggested_names_it_could_use(tmp_path):
    """Suggestions include the names a glob may give (skc_num for __sk_common.skc_num,
    as --where and the pages name it), not only full paths."""
    r = ctracer(["trace", "sock", "--binary", gt.SOCKDEMO, "--fields", "skc_nmu",
                 "--print-bpf"], tmp_path)
    assert_one_line_error(r, "'skc_nmu' matches no recordable field", "did you mean skc_num")


@pytest.mark.parametrize("options, words", [
    (["--exclude", "*"], ["is left after --functions and --exclude"]),
    (["--exclude-fields", "*"], ["no field of struct sock is left after --exclude-fields"]),
    (["--fields", "sk_rcvbuf", "--exclude-fields", "sk_rcv*"],
     ["is left after --fields, --exclude-fields"]),
])
def test_a_selection_that_leaves_nothing_says_so(tmp_path, options, words):
    r = ctracer(["trace", "struct", "sock", "--binary", gt.SOCKDEMO, *options, "--print-bpf"],
                tmp_path)
    assert_one_line_error(r, *words)
    assert r.returncode == 2
