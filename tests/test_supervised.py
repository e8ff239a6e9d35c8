"""A heavy command's child (``report``, ``export``) that dies by a signal is said in one
line with that signal's exit status; only a SIGKILL, most likely the OOM killer's, adds
what to try about memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, sys
sys.path.insert(0, {src!r})
from ctracer.commands.supervised import run_supervised

def on_killed(why, out_of_memory):
    return why + ("; try more memory" if out_of_memory else "")

try:
    run_supervised(lambda: os.kill(os.getpid(), signal.{name}), "the work", on_killed)
except Exception as e:
    print(e, file=sys.stderr)
    sys.exit(e.exit_status)
"""


@pytest.mark.parametrize("name, status, memory", [("SIGTERM", 143, False),
                                                  ("SIGKILL", 137, True)])
def test_a_child_killed_by_a_signal_is_one_line_with_its_status(name, status, memory):
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {k: v for k, v in os.environ.items() if k != "CTRACER_NO_SUPERVISOR"}
    p = subprocess.run([sys.executable, "-c", SCRIPT.format(src=src, name=name)],
                       capture_output=True, text=True, timeout=60, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == status, p.stderr
    assert len(lines) == 1, p.stderr
    assert ("try more memory" in lines[0]) == memory, lines[0]
    if not memory:
        assert lines[0] == "the work was killed by signal 15"


LEFT = """
import os, signal, sys
sys.path.insert(0, {src!r})
from ctracer.commands.supervised import run_supervised
from ctracer.files import private_temp_dir

def work():
    for prefix in (".ctracer-", "ctracer-export-"):
        path = private_temp_dir(prefix, {parent!r})
        open(os.path.join(path, "out"), "w").write("partial")
    os.kill(os.getpid(), signal.SIGKILL)

try:
    run_supervised(work, "the work", lambda why, oom: why)
except Exception as e:
    sys.exit(e.exit_status)
"""


def test_what_a_killed_child_staged_is_removed(tmp_path):
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {k: v for k, v in os.environ.items() if k != "CTRACER_NO_SUPERVISOR"}
    p = subprocess.run([sys.executable, "-c", LEFT.format(src=src, parent=str(tmp_path))],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 137, p.stderr
    assert os.listdir(tmp_path) == []
