"""Building the C programs tests read: one helper for every compile a test makes.

`compile_c` runs gcc or clang with the debug-info format and optimization level a test
asks for (``-gdwarf-N``, ``-O<n>``) and the output kind (an executable, ``-c`` object,
``-shared`` library), and fails with the compiler's own message; `need` skips a test,
saying why, when a tool it needs is not installed.  `Build` names one compiler set-up, so
that tests parametrized over compilers, DWARF versions and -O levels spell each once.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import pytest

Source = Union[str, Path]


def need(*tools: str) -> None:
    """Skip the calling test when one of ``tools`` is not on PATH."""
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh installs it)")


@dataclass(frozen=True)
class Build:
    """A compiler set-up: ``cc`` with ``-gdwarf-<dwarf>`` (plain ``-g`` when None), and
    ``-O<opt>`` (the compiler's default when None), plus ``flags``."""

    cc: str = "gcc"
    dwarf: Optional[int] = None
    opt: Optional[Union[int, str]] = None
    flags: tuple[str, ...] = ()

    def argv(self, debug: bool = True) -> list[str]:
        argv = [self.cc]
        if debug:
            argv.append(f"-gdwarf-{self.dwarf}" if self.dwarf is not None else "-g")
        if self.opt is not None:
            argv.append(f"-O{self.opt}")
        return argv + list(self.flags)


def compile_c(sources: Union[Source, Sequence[Source]], out: Optional[Source],
              build: Build = Build(),
              *, debug: bool = True, flags: Sequence[str] = (), cwd: Optional[Source] = None,
              check: bool = True) -> subprocess.CompletedProcess:
    """Compile ``sources`` into ``out`` as ``build`` says (``flags`` adds ``-c``,
    ``-shared -fPIC``, ``-I...``; no ``out`` for ``-fsyntax-only``); skips the test
    when the compiler is missing.  With
    ``check`` (the default) a failed compile fails the test with the compiler's message;
    without, the result is returned for the test to look at."""
    need(build.cc)
    if isinstance(sources, (str, Path)):
        sources = [sources]
    argv = build.argv(debug) + list(flags) + (["-o", str(out)] if out is not None else []) \
        + [str(s) for s in sources]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return done
