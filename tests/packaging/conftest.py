"""Fixtures for packaging tests: a store to read, the environment a user's shell gives a Python
it starts, and (built once per test session, it takes minutes) a fresh virtual environment with
msgindex installed from its wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.datasource.conftest import Truth, build_store, generate_records

REPO = Path(__file__).resolve().parents[2]
PROJECT_VENV_BIN = Path(sys.executable).parent
PIP_TIMEOUT_S = 1500


def user_environment(activated_bin: Path | None) -> dict[str, str]:
    """What a user's shell hands a Python it starts: no PYSPARK_*, SPARK_HOME, PYTHONPATH or
    MSGINDEX_* settings, no virtual environment on PATH unless `activated_bin` (its ``bin``) is
    activated. SPARK_LOCAL_IP stays loopback: that is this machine's network, not msgindex."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYSPARK_", "MSGINDEX_", "SPARK_"))
           and name not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    path = [entry for entry in env.get("PATH", "").split(os.pathsep)
            if entry and not (Path(entry) / "activate").is_file()]  # every venv's bin out
    if activated_bin is not None:
        path.insert(0, str(activated_bin))
        env["VIRTUAL_ENV"] = str(activated_bin.parent)
    env["PATH"] = os.pathsep.join(path)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


@pytest.fixture(scope="session")
def packaging_store(tmp_path_factory: pytest.TempPathFactory) -> Truth:
    rows = generate_records(count=600)
    path = tmp_path_factory.mktemp("packaging-store") / "store"
    build_store(path, rows)
    return Truth(path, tuple(rows))


@pytest.fixture(scope="session")
def packaging_object_store(packaging_store: Truth, s3) -> Truth:
    """The same records in an index on the session's S3 server (moto): ``path`` is its URL."""
    url = s3.url("store")
    build_store(url, list(packaging_store.rows), storage_options=s3.options)
    return Truth(url, packaging_store.rows)


def source_copy(target: Path) -> Path:
    """The repository's files (tracked and new, not ignored) copied to `target`: building a
    wheel writes build/ and *.egg-info into the source tree, which must not be this worktree."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="session")
def wheel_and_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the msgindex wheel, a fresh venv with it installed by pip, dependencies and all)."""
    work = tmp_path_factory.mktemp("wheel")
    source = source_copy(work / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"),
                    str(source)], check=True, timeout=PIP_TIMEOUT_S)
    (wheel,) = (work / "dist").glob("msgindex-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT_S)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True,
                   timeout=PIP_TIMEOUT_S, env=user_environment(venv / "bin"), cwd=work)
    return wheel, venv
