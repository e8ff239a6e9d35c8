"""Boot a kernel in a throwaway QEMU guest (virtme-ng) with this machine's file system as
its root and run one command in it as root: KVM where a guest boots under it, else TCG;
the command's stdout and stderr passed through, its exit status returned; a guest that
hangs or dies is stopped and said in one line, nothing left running."""

from __future__ import annotations

import collections
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading

from ctracer.guest.common import Refused, cache_root

KVM_TRIAL_S = 20
DEFAULT_TIMEOUT_S = 1800
#: the source checkout this package runs from (its .venv holds vng)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__)))))
TAG = "\x1e"   # marks the command's stderr lines among the console's on vng's stderr


def _vng() -> str:
    if not shutil.which("qemu-system-x86_64"):
        raise Refused("qemu-system-x86_64 not found: run scripts/setup.sh (Debian package "
                      "qemu-system-x86)", 4)
    here = os.path.join(CHECKOUT, ".venv", "bin", "vng")
    for candidate in (os.path.join(os.path.dirname(sys.executable), "vng"), here,
                      shutil.which("vng") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise Refused("virtme-ng (vng) not found: run scripts/setup.sh (it installs it in .venv)", 4)


def _vng_env(vng: str) -> dict:
    """vng runs virtme-run, installed beside it."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(vng) + os.pathsep + env.get("PATH", "")
    return env


def _vng_command(vng: str, image: str, accel: str, cpus: int, memory: str, rwdirs: list[str],
                 script: str) -> list[str]:
    cmd = [vng, "--verbose", "--run", image, "--cpus", str(cpus), "--memory", memory]
    if accel == "tcg":
        # one host thread runs every vCPU in turn: with a thread per vCPU (QEMU's default)
        # a vCPU now and then ran code the kernel had just patched back (a static key's
        # or a function's int3 of text_poke_bp) and the guest died of "Oops: int3" (at
        # boot once; under ctracer's probes once, detaching a tracepoint in
        # __sys_sendto); the guests run under load beside each other anyway
        cmd += ["--disable-kvm", "--qemu-opts=-cpu max -accel tcg,thread=single"]
    for d in rwdirs:
        cmd += ["--rwdir", d]
    return cmd + ["--exec", script]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def choose_accel(vng: str, image: str, wanted: str) -> tuple[str, str]:
    """('kvm'|'tcg', why): KVM when a guest boots under it within `KVM_TRIAL_S` (tried
    once per boot of this machine; the verdict is cached)."""
    if wanted in ("kvm", "tcg"):
        return wanted, "asked for"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg", "no usable /dev/kvm"
    verdict = os.path.join(cache_root(), f"accel-{_boot_id()}")
    try:
        with open(verdict) as f:
            accel, why = f.read().strip().split(" ", 1)
            return accel, why + " (cached verdict)"
    except (OSError, ValueError):
        pass
    cmd = _vng_command(vng, image, "kvm", 1, "1G", [], "true")
    trial = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             env=_vng_env(vng))
    try:
        code = trial.wait(timeout=KVM_TRIAL_S)
        accel, why = ("kvm", "a KVM guest booted") if code == 0 else \
            ("tcg", f"a KVM guest failed (exit {code})")
    except subprocess.TimeoutExpired:
        _stop(trial)
        accel, why = "tcg", f"a KVM guest did not boot within {KVM_TRIAL_S} s"
    os.makedirs(cache_root(), exist_ok=True)
    with open(verdict, "w") as f:
        f.write(f"{accel} {why}\n")
    return accel, why


def guest_script(argv: list[str], cwd: str, status_file: str, series: str, image: str) -> str:
    """The shell text the guest runs: set-up, the command with its stderr tagged, its
    status written where the host reads it."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "HOME": "/root", "XDG_CACHE_HOME": "/tmp/ctracer-vm-cache",
           "CTRACER_VM_KERNEL": series, "CTRACER_VM_IMAGE": image, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    for name, value in os.environ.items():
        if name.startswith(("CTRACER_", "PYTEST_")) and name not in env:
            env[name] = value
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    tag = "\\036"
    return "\n".join([
        f"export {exports}",
        "ulimit -l unlimited",
        "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing",
        "mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null",
        f"cd {shlex.quote(cwd)} 2>/dev/null || cd /",
        "exec 3>&1",
        f"{{ {shlex.join(argv)} 2>&1 1>&3 3>&-; echo $? > {shlex.quote(status_file)}; }} | "
        f"while IFS= read -r l || [ -n \"$l\" ]; do printf '{tag}%s\\n' \"$l\"; done >&2",
        f"exit $(cat {shlex.quote(status_file)} 2>/dev/null || echo 125)",
    ])


def run(argv: list[str], image: str, series: str, out: str, accel: str, cpus: int,
        memory: str, timeout: float, vng: str) -> int:
    """Boot ``image`` in a QEMU guest with virtme-ng, run ``argv`` in it as root with ``out``
    shared read-write, pass its output through and return its exit status; a guest that
    hangs past ``timeout`` or dies is stopped and said in one line."""
    control = os.path.join(out, ".vm-run")
    os.makedirs(control, exist_ok=True)
    status_file = os.path.join(control, "status")
    console_path = os.path.join(control, "console.log")
    for stale in (status_file,):
        if os.path.exists(stale):
            os.unlink(stale)
    # the script goes in a file the guest reads through the shared directory: virtme-ng
    # hands --exec over on the kernel command line (base64), which x86 cuts at 2,048
    # bytes; a longer one (a long PATH, a long command) left the guest hanging at boot
    script_path = os.path.join(control, "script.sh")
    with open(script_path, "w") as f:
        f.write(guest_script(argv, os.getcwd(), status_file, series, image) + "\n")
    cmd = _vng_command(vng, image, accel, cpus, memory, [out], f"sh {shlex.quote(script_path)}")
    tail: collections.deque[str] = collections.deque(maxlen=12)
    panic: list[str] = []
    started: list[bool] = []
    with open(console_path, "w", errors="replace") as console:
        # vng's QEMU reopens its stdout by path: a file would be written from offset 0
        # over what is there, so the command's stdout comes through a pipe
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env=_vng_env(vng))

        def copy_stdout() -> None:
            out = sys.stdout.buffer
            while True:
                chunk = os.read(proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    return
                out.write(chunk)
                out.flush()

        def pump() -> None:
            for raw in proc.stderr:  # type: ignore[union-attr]
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                at = line.find(TAG)
                if at >= 0:
                    sys.stderr.write(line[at + 1:] + "\n")
                    sys.stderr.flush()
                    continue
                console.write(line + "\n")
                if line.strip():
                    tail.append(line.strip())
                if "Kernel panic" in line or "BUG:" in line or "watchdog: BUG" in line:
                    panic.append(line.strip())
                if "virtme-ng-init: starting script" in line:
                    started.append(True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        copier = threading.Thread(target=copy_stdout, daemon=True)
        copier.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            reader.join(5)
            copier.join(5)
            raise Refused(f"the guest did not finish within {timeout:.0f} s; console: "
                          f"{' | '.join(list(tail)[-4:])} (all of it in {console_path})", 124)
        except KeyboardInterrupt:
            _stop(proc)
            raise Refused("interrupted; the guest was stopped", 130)
        reader.join(10)
        copier.join(10)
    try:
        with open(status_file) as f:
            status = int(f.read().strip())
    except (OSError, ValueError):
        why = panic[0] if panic else f"vng exited {code} without the command's status"
        error = BootFailed if not started else Refused
        raise error(f"the guest died {'while booting' if not started else 'before the command finished'} ({why}); console: "
                    f"{' | '.join(list(tail)[-4:])} (all of it in {console_path})", 125)
    return status


class BootFailed(Refused):
    """The guest died before it ran the command (under TCG a kernel's early code
    patching has been seen to oops at boot: nothing of the command ran)."""


def _stop(proc: subprocess.Popen) -> None:
    """End vng and the QEMU below it (its own session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


#: what emulation costs, said beside the choice (DESIGN: TCG runs ~8-15x slower)
TCG_COST = "emulated, roughly 10x slower than the host: compiling and attaching take minutes"


def start(command: list[str], image: str, series: str, out: str, wanted_accel: str,
          cpus: int, memory: str, timeout: float, vng: str, say) -> int:
    """Boot ``image`` and run ``command`` in it (`run`), said first in one line: the
    kernel, KVM or TCG and why, what TCG costs; a guest that died while booting is
    booted once more.  Returns the command's exit status."""
    accel, why = choose_accel(vng, image, wanted_accel)
    version = os.path.basename(image).replace("vmlinuz-", "")
    cost = f"; {TCG_COST}" if accel == "tcg" else ""
    say(f"Linux {version} under {accel.upper()} ({why}{cost}); writable: {out}")
    try:
        return run(command, image, series, out, accel, cpus, memory, timeout, vng)
    except BootFailed as e:
        say(f"{e}; booting once more")
        return run(command, image, series, out, accel, cpus, memory, timeout, vng)
