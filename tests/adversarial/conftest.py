"""Prints the adversarial tally (tally.py) after the run, without ``-s``."""

from __future__ import annotations

from tests.adversarial.tally import TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = TALLY.lines()
    if lines:
        terminalreporter.section("msgindex adversarial tally")
        for line in lines:
            terminalreporter.write_line(line)
