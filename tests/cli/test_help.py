"""Every ``msgindex`` help text is plain text: no reStructuredText markup (double backticks) and
no pointer to a README section that does not exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from msgindex.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child, subparser in action.choices.items():
                    walk(f"{name} {child}".strip(), subparser)

    walk("msgindex", build_parser())
    return found


PARSERS = _parsers()


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_help_is_plain_text(command):
    text = PARSERS[command].format_help()
    assert "``" not in text, text
    headings = {line.lstrip("#").strip() for line in README.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")}
    for section in re.findall(r'README[,:]? (?:section )?"([^"]+)"', text):
        assert section in headings, f"{command} --help points at README section {section!r}, which does not exist"


def test_every_command_is_listed():
    assert {"msgindex lookup", "msgindex doctor", "msgindex serve", "msgindex kafka start"} <= set(PARSERS)


def test_relative_times_may_start_with_a_minus(tmp_path, capsys):
    from msgindex.cli import main
    from msgindex.storage.store import open_store

    open_store(tmp_path / "s", create=True).close()
    for option in ("--since", "--begin", "--end"):
        assert main(["lookup", str(tmp_path / "s"), "--key", "k", option, "-15m"]) == 0
    assert capsys.readouterr().out.count("(0 messages)") == 3
