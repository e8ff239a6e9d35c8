"""Tests marked ``vm`` run inside QEMU guests booting Debian 12's 6.1 and 6.12 kernels and
Debian unstable's 7.2 (``scripts/vm-run``), started from the ordinary ``python -m pytest``
on the host.

A vm test is parametrized by ``vm_kernel`` (a fixture every test sees, None outside vm
tests) over the kernels its marker names, ``pytest.mark.vm(kernels=("6.1", "7.2"))``, or
`DEFAULT_KERNELS` ("6.1", "6.12") when it names none: each kernel's guest keeps about one
of CI's two cores busy for the length of its tests, so a test runs on the kernels where it
proves something the others do not (where each module runs, and why, is said in its
docstring).  On the host, when the session's tests start, every kernel
wanted boots once, in the background and niced, while the host's own tests run (vm
items are moved last), and runs ``pytest -p no:cacheprovider -m vm NODEID...`` in the
guest over exactly the selected vm items of that kernel; the guests of both kernels run
at the same time (each keeps about one core busy: TCG).  Every host item then waits
for its guest and reports its guest outcome
(passed; failed with the guest's failure text; skipped with the guest's reason) without
running its fixtures or body on the host.  The guest's output is kept in
``<basetemp>/vm-<kernel>/pytest.log`` (with ``junit.xml``, the per-report
``results.jsonl`` the host reads, and vm-run's console log under ``.vm-run/``), named in
every failure.  A guest that hangs (``CTRACER_VM_TIMEOUT``, default 4500 s a kernel, counted from the session's start) or
dies fails its items with vm-run's one-line message.  vm items are skipped, with the
reason, only where QEMU cannot start at all: not root, no qemu-system-x86_64, no vng.

Inside a guest (``CTRACER_VM_KERNEL`` set by vm-run) only vm items of that kernel run;
every other item is deselected.  ``-m "not vm"`` deselects them all before anything
boots.

What a guest's tests leave for the host goes in ``CTRACER_VM_SHARE`` (the fixture
``vm_share``: ``<basetemp>/vm-<kernel>/share``, a directory the host sees).  A host test
marked ``after_guests`` runs after every vm item and reads those directories through the
fixture ``guest_shares`` ({kernel: directory}, once each guest has finished): a check
that needs both kernels' output at once (two kernels' exports read as one fleet).  It is
skipped, saying why, where no guest ran in the session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

KERNELS = ("6.1", "6.12", "7.2")
#: the kernels of a vm test whose marker names none
DEFAULT_KERNELS = ("6.1", "6.12")
ROOT = Path(__file__).resolve().parents[2]
VM_RUN = ROOT / "scripts" / "vm-run"
GUEST_KERNEL = os.environ.get("CTRACER_VM_KERNEL")
RESULTS_ENV = "CTRACER_VM_RESULTS"
SHARE_ENV = "CTRACER_VM_SHARE"
TIMEOUT_S = float(os.environ.get("CTRACER_VM_TIMEOUT", "4500"))
GUEST_NICE = 10    # guests yield to the host's tests running beside them

_runs = pytest.StashKey[dict]()       # kernel -> GuestRun (host)
_wanted = pytest.StashKey[dict]()     # kernel -> [nodeid] (host)
_said = pytest.StashKey[bool]()       # why no guest can start, said once (host)


def in_guest() -> bool:
    return GUEST_KERNEL is not None


def qemu_unavailable() -> Optional[str]:
    """Why no guest can start here at all, or None."""
    if os.geteuid() != 0:
        return "booting a guest (scripts/vm-run) needs root"
    if not shutil.which("qemu-system-x86_64"):
        return "qemu-system-x86_64 is not installed (Debian package qemu-system-x86; scripts/setup.sh)"
    candidates = [ROOT / ".venv" / "bin" / "vng", Path(sys.executable).parent / "vng"]
    if not any(os.access(c, os.X_OK) for c in candidates) and not shutil.which("vng"):
        return "virtme-ng (vng) is not installed (scripts/setup.sh puts it in .venv)"
    return None


def _is_vm(item) -> bool:
    return item.get_closest_marker("vm") is not None


def _after_guests(item) -> bool:
    return item.get_closest_marker("after_guests") is not None


def _kernel_of(item) -> Optional[str]:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("vm_kernel") if callspec else None


# ------------------------------------------------------------------ both sides

def kernels_of(marker) -> tuple[str, ...]:
    """The kernels a ``vm`` marker names (`DEFAULT_KERNELS` when it names none)."""
    wanted = tuple(marker.kwargs.get("kernels", DEFAULT_KERNELS))
    unknown = [k for k in wanted if k not in KERNELS]
    if unknown or not wanted:
        raise pytest.UsageError(f"vm(kernels={wanted!r}): known kernels are {KERNELS}")
    return wanted


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("vm")
    if marker is not None:
        metafunc.parametrize("vm_kernel", kernels_of(marker))


@pytest.fixture(autouse=True)
def vm_kernel(request) -> Optional[str]:
    """The guest kernel a vm test runs on (one of `KERNELS`); None for other tests."""
    return getattr(request, "param", None)


@pytest.fixture
def vm_share(vm_kernel) -> Path:
    """In a guest: the directory whose files the host's ``after_guests`` tests read."""
    path = os.environ.get(SHARE_ENV)
    if not in_guest():
        pytest.fail("vm_share is for vm tests running in a guest")
    if not path:
        pytest.skip("no share directory: this guest was started by hand, not by the "
                    "host's pytest (tests/support/vmguest.py), so no host test reads what it shares")
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


@pytest.fixture(scope="module")
def guest_shares(request) -> dict[str, Path]:
    """On the host, in an ``after_guests`` test: {kernel: the guest's share directory},
    each guest finished first.  Only the guests that ran the test named by the
    requesting module's ``SHARED_BY`` (a test function's name), when it has one: a
    guest that never ran the test that writes the share has nothing in it."""
    config = request.config
    why = qemu_unavailable()
    if why:
        pytest.skip(f"no guest can start here: {why}")
    runs = config.stash.get(_runs, {})
    if not runs:
        pytest.skip("no guest ran in this session (the vm tests that share files were not "
                    "selected)")
    shared_by = getattr(request.module, "SHARED_BY", None)
    shares = {}
    for kernel, run in sorted(runs.items()):
        if shared_by and not any(n.split("::")[-1].split("[")[0] == shared_by
                                 for n in run.nodeids):
            continue
        run.finish()
        shares[kernel] = run.share
    return shares


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(config, items):
    if in_guest():
        keep = [i for i in items if _is_vm(i) and _kernel_of(i) == GUEST_KERNEL]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        return
    wanted: dict[str, list[str]] = {}
    items[:] = ([i for i in items if not _is_vm(i) and not _after_guests(i)]
                + [i for i in items if _is_vm(i)] + [i for i in items if _after_guests(i)])
    for item in items:
        if _is_vm(item):
            wanted.setdefault(_kernel_of(item), []).append(item.nodeid)
            # the body and the fixtures run in the guest, not here
            item.setup = lambda: None  # type: ignore[method-assign]
    config.stash[_wanted] = wanted
    config.stash[_runs] = {}


# ------------------------------------------------------------------ the guest's side

def pytest_runtest_logreport(report):
    path = os.environ.get(RESULTS_ENV)
    if not in_guest() or not path:
        return
    if report.skipped and isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    else:
        text = report.longreprtext
    row = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
           "text": text, "wasxfail": getattr(report, "wasxfail", None),
           "duration": round(report.duration, 2)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_collectreport(report):
    path = os.environ.get(RESULTS_ENV)
    if in_guest() and path and report.failed:
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": "collect",
                                "outcome": "failed", "text": report.longreprtext}) + "\n")


# ------------------------------------------------------------------ the host's side

def _say(config, line: str) -> None:
    """A line on the terminal now, not in the running test's captured output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


class GuestRun:
    """One boot of a kernel running the selected vm items of that kernel, started in the
    background when the session's tests start (`start_guests`) and waited for by the
    first vm item of that kernel."""

    def __init__(self, config, kernel: str, nodeids: list[str]):
        self.config = config
        self.kernel = kernel
        self.nodeids = nodeids
        self.out = Path(config._tmp_path_factory.getbasetemp()) / f"vm-{kernel}"
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = self.out / "pytest.log"
        self.results_path = self.out / "results.jsonl"
        self.share = self.out / "share"
        shutil.rmtree(self.share, ignore_errors=True)
        self.share.mkdir()
        self.reports: dict[str, list[dict]] = {}
        self.broken: Optional[str] = None   # why no item of this run has a result
        self.seconds = 0.0
        self.returncode: Optional[int] = None
        if self.results_path.exists():
            self.results_path.unlink()
        cmd = [sys.executable, str(VM_RUN), "--kernel", kernel, "--out", str(self.out),
               "--timeout", str(int(TIMEOUT_S)), "--",
               sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "vm",
               "-v", "-rA", f"--junitxml={self.out / 'junit.xml'}", *nodeids]
        env = dict(os.environ, **{RESULTS_ENV: str(self.results_path),
                                  SHARE_ENV: str(self.share)})
        env.pop("PYTEST_ADDOPTS", None)  # the host's options are not the guest's
        env.pop("PYTEST_CURRENT_TEST", None)
        self.started = time.monotonic()
        with open(self.log, "w") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            # niced: the host's own tests, running meanwhile, come first; a session of
            # its own: the host stops it (SIGTERM stops the guest), not the terminal
            self.process = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: os.nice(GUEST_NICE))

    def finish(self) -> None:
        """Wait for the guest, once, and read what it said."""
        if self.returncode is not None:
            return
        self.returncode = self.process.wait()
        self.seconds = time.monotonic() - self.started
        lines = self.log.read_text(errors="replace").splitlines()
        # vm-run's own refusal (its first line only says which kernel and accelerator)
        refused = [ln for ln in lines if ln.startswith("vm-run: ")
                   and not ln.startswith("vm-run: Linux ")]
        if self.returncode not in (0, 1):   # 1: some test failed; the rest say why not
            self.broken = refused[-1] if refused else (
                f"the guest's pytest exited {self.returncode}: "
                f"{lines[-1] if lines else 'no output'}")
        self._read_results()
        _say(self.config, f"vm: {self.kernel} guest done in {self.seconds:.0f} s "
                          f"(exit {self.returncode})")

    def stop(self) -> None:
        """End a guest still running (the session stopped early)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _read_results(self) -> None:
        if not self.results_path.exists():
            return
        for line in self.results_path.read_text().splitlines():
            row = json.loads(line)
            self.reports.setdefault(row["nodeid"], []).append(row)

    def report(self, nodeid: str) -> None:
        """Raise (or return, for a pass) what the guest said of this item."""
        self.finish()
        where = f"in the {self.kernel} guest (log: {self.log})"
        rows = self.reports.get(nodeid)
        if not rows:
            errors = [r for rs in self.reports.values() for r in rs if r["when"] == "collect"]
            why = self.broken or (f"collection failed: {errors[0]['text'].splitlines()[-1]}"
                                  if errors else "the guest reported no result for it")
            pytest.fail(f"{why} ({where})", pytrace=False)
        for r in rows:
            if r["outcome"] == "failed":
                pytest.fail(f"{where}, {r['when']}:\n{r['text']}", pytrace=False)
        for r in rows:
            if r["outcome"] == "skipped":
                if r.get("wasxfail") is not None:
                    pytest.xfail(f"{r['wasxfail']} ({where})")
                pytest.skip(f"{r['text'].removeprefix('Skipped: ')} ({where})")
        if not any(r["when"] == "call" and r["outcome"] == "passed" for r in rows):
            pytest.fail(f"{self.broken or 'the guest did not finish this test'} ({where})",
                        pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """Boot every wanted kernel now, in the background, while the host's own tests run
    (vm items run last and wait for their guest)."""
    config = session.config
    if in_guest() or config.option.collectonly or not config.stash.get(_wanted, None):
        return None
    why = qemu_unavailable()
    if why:
        return None
    runs = config.stash[_runs]
    for kernel, nodeids in config.stash[_wanted].items():
        runs[kernel] = GuestRun(config, kernel, nodeids)
        _say(config, f"vm: booting Debian's {kernel} kernel in the background for "
                     f"{len(nodeids)} tests (guest log: {runs[kernel].log})")
    return None


def pytest_sessionfinish(session):
    for run in session.config.stash.get(_runs, {}).values():
        run.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if in_guest() or not _is_vm(pyfuncitem):
        return None
    config = pyfuncitem.config
    why = qemu_unavailable()
    if why:
        if not config.stash.get(_said, False):
            _say(config, f"vm: no guest can start here: {why}; vm tests skipped")
            config.stash[_said] = True
        pytest.skip(f"no guest can start here: {why}")
    kernel = _kernel_of(pyfuncitem)
    config.stash[_runs][kernel].report(pyfuncitem.nodeid)
    return True


def pytest_terminal_summary(terminalreporter, config):
    runs = config.stash.get(_runs, {})
    for kernel, run in runs.items():
        terminalreporter.write_line(
            f"vm: {kernel} guest {run.seconds:.0f} s for {len(config.stash[_wanted][kernel])} "
            f"tests; log {run.log}")
