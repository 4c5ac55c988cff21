"""Whether the Python that Spark starts for its workers can import msgindex.

Spark runs every Python task, and its scan for ``pyspark_*`` data sources, with the interpreter
named by ``spark.pyspark.python`` / ``PYSPARK_PYTHON`` (the scan: ``PYSPARK_DRIVER_PYTHON`` /
``PYSPARK_PYTHON`` of the environment Spark started in), else ``python3`` from ``PATH``. In an
activated virtual environment that is the environment's Python. A virtual environment's Python
run by its full path without activation (how Jupyter kernels and IDEs often run it) leaves
``python3`` pointing elsewhere: ``format("msgindex")`` then fails with Spark's
DATA_SOURCE_NOT_FOUND, and any msgindex task with ``No module named 'msgindex'``.

msgindex does not change which Python Spark uses (on a cluster the executors' Python lives on
other hosts, where this interpreter's path means nothing). Its driver-side entry points
(``lookup_keys``, ``enable_pushdown``, ``msgindex doctor``) are where msgindex can speak before
Spark does: they check that the workers' Python imports msgindex and otherwise fail before any
job with WorkerPythonError saying what to set. A local session is checked by starting that
Python (no Spark job); a cluster or Spark Connect session by one small Spark job whose function
needs nothing of msgindex to run, once per session. (``format("msgindex")`` alone runs no
msgindex code in this process: Spark's DATA_SOURCE_NOT_FOUND comes first; ``msgindex doctor``
explains it.)
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgindex.errors import WorkerPythonError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHECK_TIMEOUT_S = 60
PROBE_TASKS = 2
_PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('msgindex') else 3)"
# The remote probe is compiled here under a module name no worker can import, so that Spark's
# cloudpickle ships the function by value: it runs on a worker without msgindex and says so.
_REMOTE_PROBE = """
def probe(batches):
    import socket, sys
    import pyarrow as pa
    for _ in batches:
        pass
    try:
        import msgindex
        version, detail = msgindex.__version__, msgindex.__file__
    except ImportError as error:
        version, detail = None, f"{type(error).__name__}: {error}"
    yield pa.RecordBatch.from_pylist([{"host": socket.gethostname(), "python": sys.executable,
                                       "msgindex": version, "detail": detail}])
"""
_PROBE_SCHEMA = "host string, python string, msgindex string, detail string"
_checked_sessions: dict[int, str] = {}


@dataclass(frozen=True)
class WorkerPython:
    """What one Spark Python worker reported: where it ran, its interpreter, msgindex's version
    there (None: it cannot import msgindex) and where msgindex came from (or the import error)."""

    host: str
    python: str
    msgindex: str | None
    detail: str


def check_worker_python(spark: SparkSession) -> None:
    """Raise WorkerPythonError when this session's Python workers cannot import msgindex."""
    problem = worker_python_problem(spark)
    if problem:
        raise WorkerPythonError(problem)


def is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def worker_python_problem(spark: SparkSession) -> str:
    """'' when the session's Python workers import msgindex, else what is wrong and what to do."""
    if not is_connect(spark) and spark.sparkContext.master.startswith("local"):
        context = spark.sparkContext
        problem = interpreter_problem(context.pythonExec, os.environ.get("PYTHONPATH", ""))
        if not problem:
            return ""
        return (f"Spark starts its Python workers with {context.pythonExec!r}, which {problem}; msgindex is "
                f"installed for {sys.executable}. Activate that environment before starting Python, or set "
                f"PYSPARK_PYTHON={sys.executable} (e.g. os.environ['PYSPARK_PYTHON'] = sys.executable) "
                f"before the SparkSession is created (msgindex doctor checks a setup).")
    key = id(spark)
    if key not in _checked_sessions:
        _checked_sessions[key] = _remote_problem(spark)
    return _checked_sessions[key]


def probe_workers(spark: SparkSession, tasks: int = PROBE_TASKS) -> list[WorkerPython]:
    """What `tasks` Spark Python workers of this session say about themselves (a Spark job)."""
    namespace = {"__name__": "msgindex_worker_probe"}
    exec(compile(_REMOTE_PROBE, "<msgindex worker probe>", "exec"), namespace)
    rows = spark.range(0, tasks, 1, tasks).mapInArrow(namespace["probe"], _PROBE_SCHEMA).collect()
    return sorted({WorkerPython(r.host, r.python, r.msgindex, r.detail) for r in rows}, key=lambda w: (w.host, w.python))


def _remote_problem(spark: SparkSession) -> str:
    where = "the Spark Connect server's" if is_connect(spark) else "the executors'"
    try:
        workers = probe_workers(spark)
    except Exception as error:  # the job itself failed: say the first line Spark gave
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        cause = next((line for line in lines if "Error" in line), lines[0] if lines else type(error).__name__)
        return f"{where} Python workers could not run a probe of msgindex's: {cause}"
    missing = [worker for worker in workers if worker.msgindex is None]
    if not missing:
        return ""
    worker = missing[0]
    return (f"{where} Python workers cannot import msgindex: {worker.python} on {worker.host} ({worker.detail}); "
            f"install msgindex for that Python, or point spark.pyspark.python / PYSPARK_PYTHON (where Spark "
            f"starts) at a Python that has it")


@functools.lru_cache(maxsize=8)
def interpreter_problem(python: str, pythonpath: str) -> str:
    """'' when the interpreter `python` (a path, or a name looked up on PATH) imports msgindex,
    else what is wrong (asked once per interpreter and PYTHONPATH)."""
    if python == sys.executable:
        return ""
    try:
        probe = subprocess.run([python, "-c", _PROBE], capture_output=True, timeout=CHECK_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return "is not found on PATH"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"could not be run ({error})"
    return "" if probe.returncode == 0 else "cannot import msgindex"
