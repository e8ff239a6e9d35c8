"""The kernel-corpus oracle (check_corpus.py) as tests: one test per check, all sharing
one run of the checks (about two minutes: pfunct alone takes ~25 s per struct).

Marked ``corpus`` and run only when asked for (``pytest -m corpus``), so the default
suite stays fast even where the corpus is present; skipped, saying why, when Debian's
kernel debug package is not extracted where the script looks (fetch it with
``.venv/bin/python tests/corpus/check_corpus.py``, or point $CTRACER_CORPUS at an
extracted tree) or when a reference tool is missing.
"""

from __future__ import annotations

import check_corpus
import corpus_files
import corpus_oracles
import pytest

pytestmark = pytest.mark.corpus

#: check key -> test id
CHECKS = {"a": "methods-vs-pfunct", "b": "layouts-vs-pahole", "c": "dwarf-vs-btf",
          "d": "nfs-split-btf", "e": "nfs-probe-plan"}


def corpus_selected(config: pytest.Config) -> bool:
    """Whether the run's -m expression asks for corpus tests."""
    expression = config.option.markexpr or ""
    return "corpus" in expression and "not corpus" not in expression


@pytest.fixture(scope="module")
def report(request) -> check_corpus.Report:
    if not corpus_selected(request.config):
        pytest.skip("the kernel-corpus check takes about two minutes: run it with "
                    "pytest -m corpus")
    corpus = corpus_files.find_corpus()
    if corpus is None:
        pytest.skip(f"{corpus_files.PACKAGE} is not extracted in "
                    f"{corpus_files.describe_search()}; tests/corpus/check_corpus.py fetches it")
    missing = corpus_oracles.missing_tools()
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (scripts/setup.sh installs them)")
    done = check_corpus.run_checks(corpus)
    print("\n" + done.text())
    return done


@pytest.mark.parametrize("key", sorted(CHECKS), ids=lambda k: CHECKS[k])
def test_corpus_check(report: check_corpus.Report, key: str) -> None:
    check = next(c for c in report.checks if c.key == key)
    assert check.ok, check.text()
