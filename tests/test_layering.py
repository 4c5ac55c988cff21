"""The library's layering, enforced the way Kafka's build enforces its import-control rules.

Layers, lowest first; a module may import its own layer and the ones below it, never above:

    msgindex.errors, msgindex.times       what every layer raises; times as people type them
    msgindex.storage                      file formats, shards, the store: no Spark, no Kafka
    msgindex.jvm                          Maven staging and java/javac for jars pip does not ship
    msgindex.kafka                        the local broker, admin helpers, load generation
    msgindex.spark                        session, the sink, the data source
    msgindex.cli, pyspark_msgindex        entry points

Every import counts, also those inside functions and ``if TYPE_CHECKING:`` blocks: a lazy import
is still a dependency. The same graph must have no cycles between modules, and nothing in the
library imports the runnable jobs (``streaming_jobs/``) or the tests.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE_ROOT = Path(__file__).resolve().parents[1] / "connector"

# layer of a module = the first entry whose prefix matches; its rank must not be below an import's
LAYERS: list[tuple[str, int]] = [
    ("msgindex.errors", 0),
    ("msgindex.times", 0),
    ("msgindex.storage", 1),
    ("msgindex.jvm", 2),
    ("msgindex.kafka", 3),
    ("msgindex.spark", 4),
    ("msgindex.cli", 5),
    ("pyspark_msgindex", 5),
    ("msgindex", 5),  # the package root only re-exports lazily
]
FORBIDDEN_ANYWHERE = ("streaming_jobs", "tests")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SOURCE_ROOT.rglob("*.py"))}


def _imports(module: str, path: Path) -> Iterator[str]:
    """Absolute names of everything `module` imports (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # "from msgindex.storage import shard" imports the module msgindex.storage.shard
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _rank(module: str) -> int | None:
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def _internal_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        module: {name for name in _imports(module, path) if name in modules and name != module}
        for module, path in modules.items()
    }


def test_every_library_module_has_a_layer():
    assert [m for m in _modules() if _rank(m) is None] == []


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{module} (layer {_rank(module)}) imports {target} (layer {_rank(target)})"
        for module, targets in _internal_graph().items()
        for target in sorted(targets)
        if _rank(target) > _rank(module)
    ]
    assert upward == []


@pytest.mark.parametrize("forbidden", FORBIDDEN_ANYWHERE)
def test_the_library_never_imports(forbidden):
    offenders = [
        f"{module} imports {name}"
        for module, path in _modules().items()
        for name in _imports(module, path)
        if name == forbidden or name.startswith(forbidden + ".")
    ]
    assert offenders == []


def test_no_import_cycles():
    graph = _internal_graph()
    # a module importing its own package's __init__ (e.g. msgindex.storage.shard -> msgindex.storage)
    # is not a cycle worth reporting: packages here hold no code that imports their children
    for module in graph:
        graph[module] = {t for t in graph[module] if not module.startswith(t + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert [" -> ".join(cycle) for cycle in cycles] == []
