"""The house rules a linter can hold (pyproject.toml's [tool.ruff]: pycodestyle, pyflakes, isort,
bugbear, pyupgrade), held on the whole tree. ruff comes with the dev extra (`make setup`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), f"{ruff} is missing: install the dev extra (make setup)"
    result = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
