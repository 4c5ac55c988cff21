"""Runs RocketMQ's real IndexFile (rocketmq-store from Maven Central) through the Java harness in
``java/rocketmq/``: one JVM launch executes a whole script of calls (see the harness's javadoc)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from msgindex.errors import MsgIndexError
from msgindex.jvm import compile_java, java_command, stage_jars

ROCKETMQ_STORE = "org.apache.rocketmq:rocketmq-store:5.5.1"
HARNESS_SOURCES = Path(__file__).parent / "java" / "rocketmq"
HARNESS_MAIN = "RocketMqIndexHarness"
BENCH_BASE_TS = 1_700_000_000_000  # must match the harness's BENCH_BASE_TS


def harness_classpath() -> list[Path]:
    """Staged rocketmq-store jars plus the compiled harness (first call may take minutes)."""
    jars = stage_jars("rocketmq-store", [ROCKETMQ_STORE])
    classes = compile_java("rocketmq-index-harness", HARNESS_SOURCES, jars)
    return [classes, *jars]


def encode_key(key: str) -> str:
    """A key as the harness reads it: hex of its UTF-16 code units ("-" for the empty key)."""
    return key.encode("utf-16-be", "surrogatepass").hex() or "-"


class Script:
    """Harness commands, collected in order and run in one JVM by ``run``."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _add(self, *fields: object) -> None:
        self.lines.append("\t".join(str(f) for f in fields))

    def create(self, path: Path, slots: int, num: int, end_phy: int = 0, end_ts: int = 0) -> None:
        self._add("create", path, slots, num, end_phy, end_ts)

    def open(self, path: Path, slots: int, num: int) -> None:
        self._add("open", path, slots, num)

    def put(self, key: str, phy: int, ts: int) -> None:
        self._add("put", encode_key(key), phy, ts)

    def query(self, key: str, max_num: int, begin: int, end: int) -> None:
        self._add("query", encode_key(key), max_num, begin, end)

    def close(self) -> None:
        self._add("close")

    def bench_put(self, key_file: Path, slots: int, num: int, folder: Path, warmup: int, rounds: int) -> None:
        self._add("bench_put", key_file, slots, num, folder, warmup, rounds)

    def bench_query(self, path: Path, key_file: Path, slots: int, num: int, max_num: int, begin: int, end: int) -> None:
        self._add("bench_query", path, slots, num, key_file, max_num, begin, end)

    def run(self, *, heap: str = "256m", timeout: float = 600) -> list[str]:
        """Execute the script in a fresh JVM; the harness's output lines, in order."""
        with tempfile.TemporaryDirectory(prefix="rocketmq-harness-") as tmp:
            script, output = Path(tmp) / "script.tsv", Path(tmp) / "output.txt"
            script.write_text("\n".join(self.lines) + "\n", encoding="utf-8")
            # user.home points into the temp dir: RocketMQ's logging writes under ~/logs.
            argv = java_command(harness_classpath(), HARNESS_MAIN, str(script), str(output), heap=heap)
            argv.insert(1, f"-Duser.home={tmp}")
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise MsgIndexError(f"RocketMQ harness failed ({done.returncode}):\n{done.stderr[-3000:]}")
            return output.read_text(encoding="utf-8").splitlines()


def parse_query(line: str) -> list[int]:
    """The offsets of a harness ``query`` output line."""
    assert line.startswith("query "), line
    body = line[len("query "):]
    return [int(x) for x in body.split(",")] if body else []
