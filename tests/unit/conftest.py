"""Unit tests: fast, no service processes. `.ci/run` runs them in two parts: before the ocr extra is installed
every test not marked `ocr_extra`, with SIEVE_TESTS_NO_SKIPS=1 so that a test which skips there (one that needs
the extra but lacks the marker, and so would run nowhere) fails the run; after it, the `ocr_extra` ones.
"""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a module that skips itself while it is imported
        _skipped.append(report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):  # an expected failure is not a skip
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("SIEVE_TESTS_NO_SKIPS") == "1" and _skipped:
        print(
            f"\n{len(_skipped)} test(s) skipped where none may be (mark a test that needs the ocr extra "
            f"`@pytest.mark.ocr_extra`): {', '.join(_skipped)}"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
