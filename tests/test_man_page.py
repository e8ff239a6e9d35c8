"""ctracer(1) is generated from the command line's own parsers (scripts/man-page, run by
scripts/setup.sh): it has a section for every subcommand and names every option each
one takes, and the page set-up installed is the one the parsers give today."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from ctracer import cli

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = ROOT / ".venv" / "share" / "man" / "man1" / "ctracer.1"


def _roff(text: str) -> str:
    return text.replace("-", "\\-")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("man") / "ctracer.1"
    r = subprocess.run([str(ROOT / "scripts" / "man-page"), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out.read_text()


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_has_its_section(page):
    subparsers = _subparsers()
    assert set(subparsers) == set(cli.COMMANDS) | set(cli.ALIASES)
    for old, new in cli.ALIASES.items():  # an old name is the same parser, no section
        assert subparsers[old] is subparsers[new], old
        assert f".SH COMMAND \\fI\\,'ctracer {old}'" not in page, old
    for name, (_, help_text) in cli.COMMANDS.items():
        assert f".SH COMMAND \\fI\\,'ctracer {name}'\\/\\fR" in page, name
        assert _roff(help_text) in page, name


def test_every_option_of_every_subcommand_is_named(page):
    for name, sub in _subparsers().items():
        if name in cli.ALIASES:
            continue
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert _roff(option) in page, f"ctracer {name} {option}"


def test_the_installed_page_is_the_parsers_of_today(page):
    if not INSTALLED.exists():
        pytest.skip(f"{INSTALLED.relative_to(ROOT)} not installed (scripts/setup.sh writes it)")
    def body(text):  # without the .TH line: it carries the day it was made
        return text.split("\n", 1)[1]
    assert body(INSTALLED.read_text()) == body(page), \
        "the installed ctracer(1) is out of date: run scripts/man-page (setup does)"
