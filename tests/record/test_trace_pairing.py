"""Entry/exit pairing under the two things that break naive schemes (real BPF):

* a tail call: ``outer`` jumps to ``inner`` with the stack pointer it was entered with,
  so both return through the same stack slot (a key of thread + stack pointer alone
  would mix them up);
* a longjmp out of ``thrower`` back into ``catcher``: thrower never returns (a key of
  thread + depth alone would stay one level too deep for ever after).

The trace must pair every exit with its entry (no FLAG_NO_ENTRY), give the right depths
and objects, and recover its depth after the longjmp.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support.cbuild import Build, compile_c

from ctracer.event import FLAG_NO_ENTRY, PHASE_ENTRY
from ctracer.tracefile import Trace

pytestmark = pytest.mark.bpf

SOURCE = r"""
#include <setjmp.h>
#include <stdio.h>

struct obj {
	int a;
	long b;
};

static jmp_buf env;

__attribute__((noinline)) int inner(struct obj *o)
{
	o->a++;
	return o->a * 10;
}

__attribute__((noinline)) int outer(struct obj *o)
{
	o->b += 2;
	return inner(o);		/* a tail call at -O2 */
}

__attribute__((noinline)) void thrower(struct obj *o)
{
	o->a = 100;
	longjmp(env, 1);
}

__attribute__((noinline)) int catcher(struct obj *o)
{
	if (setjmp(env) == 0)
		thrower(o);
	return o->a;
}

int main(void)
{
	static struct obj one, two;
	volatile int sum = 0;

	sum += outer(&one);
	sum += catcher(&two);
	sum += outer(&two);
	sum += catcher(&one);
	sum += inner(&one);
	printf("%d\n", sum);
	return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    from test_trace_bpf import _skip_reason
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("pairing")
    (d / "pairing.c").write_text(SOURCE)
    exe = d / "pairing"
    compile_c(d / "pairing.c", exe, Build(opt=2))
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)],
                                 capture_output=True, text=True, check=True).stdout
    body = disassembly.split("<outer>:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"\bjmp\s+\w+ <inner>", body), "gcc did not tail-call inner:\n" + body
    return exe


def test_tail_calls_and_longjmp_pair_correctly(program, tmp_path):
    out = tmp_path / "pairing.ctrace"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "obj", "--binary", str(program),
                        "-o", str(out), "--", str(program)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    trace = Trace(str(out))
    rows = {fid: row.name for fid, row in trace.functions.items()}
    events = [(rows[e.function_id], "entry" if e.phase == PHASE_ENTRY else "exit", e.depth,
               e.retval, e.flags & FLAG_NO_ENTRY) for e in trace.events()]
    assert events == [
        ("outer", "entry", 0, None, 0),
        ("inner", "entry", 1, None, 0),
        ("inner", "exit", 1, 10, 0),      # both return through outer's slot: inner first
        ("outer", "exit", 0, 10, 0),
        ("catcher", "entry", 0, None, 0),
        ("thrower", "entry", 1, None, 0),  # never returns: longjmp
        ("catcher", "exit", 0, 100, 0),
        ("outer", "entry", 0, None, 0),
        ("inner", "entry", 1, None, 0),
        ("inner", "exit", 1, 1010, 0),
        ("outer", "exit", 0, 1010, 0),
        ("catcher", "entry", 0, None, 0),
        ("thrower", "entry", 1, None, 0),
        ("catcher", "exit", 0, 100, 0),
        ("inner", "entry", 0, None, 0),    # back at depth 0 after the longjmp
        ("inner", "exit", 0, 1010, 0),
    ]
    values = [trace.values(e) for e in trace.events()]
    # outer's exit sees what inner did to the object
    assert (values[3]["a"], values[3]["b"]) == (1, 2)
    assert r.stdout.strip() == str(10 + 100 + 1010 + 100 + 1010)
