"""One line for a failure, however deep in Spark it happened.

An error raised inside a Spark task or a ``foreachBatch`` function reaches the driver wrapped in a
Py4J / pyspark exception whose text is the remote Python traceback plus Spark's own query dump:
70 to 200+ lines in which msgindex's message is one line. The CLI prints only the line that
matters: msgindex's own error when one is inside (``msgindex.errors.<Class>: <message>``, the last
one: the innermost), else the innermost Java cause (``Caused by: ...``), else the exception's first
line. The whole text goes to a log file whose path the line names (and to stderr with
``--verbose``). Errors of Hadoop's object-store connectors (Spark's checkpoint on ``s3a://``,
``gs://``, ``abfss://``) get a line of their own that names the path and what to fix: the
connector missing from Spark's classpath, a bucket that does not exist, credentials the store
refuses, an endpoint that does not resolve or answer (``msgindex.spark.runtime.hadoop_paths``).
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from msgindex.errors import MsgIndexError

# "msgindex.errors.ShardLockedError: <message>" as Python prints an exception's last line
_MSGINDEX_LINE = re.compile(r"^msgindex\.errors\.(?P<kind>\w+): (?P<message>.+?)\s*$", re.MULTILINE)
_JAVA_CAUSE = re.compile(r"^Caused by: (?P<cause>\S+?): (?P<message>.+?)\s*$", re.MULTILINE)
_SPARK_NOISE = re.compile(r"\s*SQLSTATE: \w+")


@dataclass(frozen=True)
class Failure:
    """What the CLI says about an error: one line, and whether msgindex itself raised it (a usage
    or data problem the user can act on: exit 2) or something else failed (exit 1)."""

    line: str
    raised_by_msgindex: bool


def explain(error: BaseException) -> Failure:
    """The one line that matters in `error` (see the module docstring)."""
    if isinstance(error, MsgIndexError):
        return Failure(_first_line(str(error)), True)
    text = _full_text(error)
    found = list(_MSGINDEX_LINE.finditer(text))
    if found:
        return Failure(_SPARK_NOISE.sub("", found[-1].group("message")), True)
    from msgindex.spark.runtime.hadoop_paths import hadoop_error_line

    line = hadoop_error_line(text)
    if line:
        return Failure(line, True)
    causes = list(_JAVA_CAUSE.finditer(text))
    if causes:
        innermost = causes[-1]
        return Failure(f"{innermost.group('cause').rpartition('.')[2]}: {innermost.group('message')}", False)
    return Failure(f"{type(error).__name__}: {_first_line(str(error))}", False)


def write_log(command: str, error: BaseException, directory: Path) -> Path | None:
    """Write `error`'s whole text (Python traceback and any remote one) to a new file in
    `directory`; its path, or None when it cannot be written (the line alone is still shown)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 1_000_000:06d}.log"
        path.write_text(_full_text(error), encoding="utf-8")
        return path
    except OSError:
        return None


def _full_text(error: BaseException) -> str:
    """The Python traceback of `error` and its chain, then the text Spark attached (Py4J keeps
    the JVM's stack trace in ``java_exception``; pyspark's captured errors in their message)."""
    parts = ["".join(traceback.format_exception(error))]
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            parts.append(str(java.toString()))
        except Exception:  # the JVM may be gone already: the Python side is still worth logging
            pass
    return "\n".join(parts)


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else "(no message)"
