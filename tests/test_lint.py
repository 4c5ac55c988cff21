"""The house rules a linter can hold (pyproject.toml's [tool.ruff]: pycodestyle, pyflakes, isort,
bugbear, pyupgrade), held on the whole tree. ruff comes with the dev extra (`make setup`)."""

from __future__ import annotations

import ast
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


# Functions left unannotated on purpose, with why.
UNANNOTATED = {
    "msgindex.spark.pipeline.task_writer.task_function":
        "a mapInArrow function: pyspark infers UDF kinds from type hints and fails on postponed ones",
}


def test_public_functions_and_classes_say_what_they_take():
    """Type hints on every public function of a library module, a docstring on every public
    class (the project's house rules): checked on the source, none imported."""
    unannotated, undocumented = [], []
    for path in sorted((ROOT / "connector" / "msgindex").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "connector").with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if node.returns is None or any(a.annotation is None for a in arguments):
                    if f"{module}.{node.name}" not in UNANNOTATED:
                        unannotated.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not ast.get_docstring(node):
                undocumented.append(f"{path.relative_to(ROOT)}:{node.lineno} class {node.name}")
    assert not unannotated, "public functions without type hints:\n" + "\n".join(unannotated)
    assert not undocumented, "public classes without a docstring:\n" + "\n".join(undocumented)
