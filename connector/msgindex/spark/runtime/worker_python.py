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
(``lookup_keys``, ``enable_pushdown``) check, for a local master only, that the workers' Python
imports msgindex, and otherwise fail before any job with WorkerPythonError saying what to set.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from msgindex.errors import WorkerPythonError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHECK_TIMEOUT_S = 60
_PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('msgindex') else 3)"


def check_worker_python(spark: SparkSession) -> None:
    """Raise WorkerPythonError when this local session's Python workers cannot import msgindex.
    Nothing is checked over Spark Connect (the server's workers) or for a cluster master."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return
    context = spark.sparkContext
    if not context.master.startswith("local"):
        return
    problem = _worker_problem(context.pythonExec, os.environ.get("PYTHONPATH", ""))
    if problem:
        raise WorkerPythonError(
            f"Spark starts its Python workers with {context.pythonExec!r}, which {problem}; msgindex is "
            f"installed for {sys.executable}. Activate that environment before starting Python, or set "
            f"PYSPARK_PYTHON={sys.executable} (e.g. os.environ['PYSPARK_PYTHON'] = sys.executable) "
            f"before the SparkSession is created."
        )


@functools.lru_cache(maxsize=8)
def _worker_problem(python: str, pythonpath: str) -> str:
    """'' when `python` imports msgindex, else what is wrong (once per interpreter and path)."""
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
