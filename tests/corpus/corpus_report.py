"""What the corpus check reports: findings per check (summary lines and failures) and
the time each stage took."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Findings:
    """One check's readable summary; any failure fails the check."""

    key: str
    title: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.lines.append(text)

    def fail(self, text: str) -> None:
        self.failures.append(text)

    def extend(self, other: "Findings") -> None:
        """Take in a part of this check: its title, its lines indented, its failures."""
        self.lines.append(f"{other.title}:")
        self.lines.extend("  " + line for line in other.lines)
        self.failures.extend(f"{other.title}: {f}" for f in other.failures)

    @property
    def ok(self) -> bool:
        return not self.failures

    def text(self) -> str:
        head = f"[{self.key}] {self.title}: {'PASS' if self.ok else 'FAIL'}"
        body = [f"    {line}" for line in self.lines]
        if self.failures:
            body.append(f"    {plural(len(self.failures), 'failure')}:")
            body.extend("      " + line for f in self.failures for line in f.splitlines())
        return "\n".join([head] + body)


class Timings:
    """Wall time of named stages, in the order they finished."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, float]] = []

    def add(self, label: str, seconds: float) -> None:
        self.stages.append((label, seconds))

    @contextmanager
    def measure(self, label: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(label, time.perf_counter() - start)

    def text(self) -> str:
        width = max((len(label) for label, _ in self.stages), default=0)
        return "\n".join(f"    {label:<{width}}  {seconds:8.2f} s"
                         for label, seconds in self.stages)


def plural(n: int, word: str, many: str = "") -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"
