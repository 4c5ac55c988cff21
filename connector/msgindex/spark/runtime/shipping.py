"""Executors get msgindex from the job, and are checked to see the index.

* ``ship_code(spark)``: a zip of the ``msgindex`` and ``pyspark_msgindex`` packages, built from the
  driver's installed copy (cached by content hash under msgindex's home), added with
  ``addPyFile``. Executors then need only what pyspark's Arrow functions need (numpy, pyarrow,
  pandas): the executor side imports no kafka-python (task_writer.py).
* ``check_executors_see_index(spark, root)``: before the query starts, tasks on the executors look
  for ``<root>/msgindex.json``; the index must be on a shared POSIX filesystem with working
  ``flock``, mounted at the same path on the driver and on every executor. The first executor
  that does not see it fails the job with one line naming its host.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from msgindex.errors import IndexPathError
from msgindex.jvm import msgindex_home
from msgindex.storage.durable import write_atomically

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHIPPED_PACKAGES = ("msgindex", "pyspark_msgindex")
PROBES_PER_CORE = 4  # probe tasks per core: enough that every executor gets some
# Bytecode, and the compiled walk with its source: Python cannot import a compiled module from a zip
# (executors walk in Python, index_file.py), and a driver's build may not suit the executors' hosts.
NOT_SHIPPED_SUFFIXES = (".pyc", ".pyo", ".so", ".c")
MANIFEST = "msgindex.json"  # storage.store.MANIFEST_FILE (not imported: executors run `_probe`)


def _package_files() -> list[tuple[str, Path]]:
    import importlib

    files = []
    for name in SHIPPED_PACKAGES:
        package_dir = Path(importlib.import_module(name).__file__).resolve().parent
        for path in sorted(package_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in NOT_SHIPPED_SUFFIXES:
                files.append((f"{name}/{path.relative_to(package_dir).as_posix()}", path))
    return files


def package_zip() -> Path:
    """The zip of msgindex's packages as installed for this driver (rebuilt when they change)."""
    files = _package_files()
    digest = hashlib.sha1()
    for arcname, path in files:
        digest.update(arcname.encode())
        digest.update(path.read_bytes())
    target = msgindex_home() / "pyfiles" / f"msgindex-{digest.hexdigest()[:16]}.zip"
    if not target.is_file():
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for arcname, path in files:
                archive.write(path, arcname)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, buffer.getvalue())
    return target


def ship_code(spark: SparkSession) -> Path:
    """Make msgindex importable on every executor of `spark` (and return the zip)."""
    path = package_zip()
    spark.sparkContext.addPyFile(str(path))
    return path


def _probe(path: str):
    """An executor's answer: (host, sees the file). Plain stdlib: runs before anything else."""
    import os
    import socket

    def probe(_):
        yield socket.gethostname(), os.environ.get("SPARK_LOCAL_IP", ""), os.path.isfile(path)

    return probe


def _object_probe(root: str, storage_options: dict[str, str] | None):
    """An executor's answer for an object-store index: (host, address, the error opening it or "")."""

    def probe(_):
        import os
        import socket

        try:
            from msgindex.storage.store import open_store

            open_store(root, storage_options=storage_options).close()
            error = ""
        except Exception as failure:  # e.g. obstore not installed there, no credentials, endpoint unreachable
            error = f"{type(failure).__name__}: {str(failure).strip().splitlines()[0] if str(failure).strip() else ''}"
        yield socket.gethostname(), os.environ.get("SPARK_LOCAL_IP", ""), error

    return probe


def check_executors_see_index(spark: SparkSession, root: str | Path,
                              storage_options: dict[str, str] | None = None) -> None:
    """Fail with one line naming the first executor host that does not see `<root>/msgindex.json`
    (on an object store: that cannot open the store, with the reason)."""
    context = spark.sparkContext
    if "://" in str(root):
        tasks = max(context.defaultParallelism, 1) * PROBES_PER_CORE
        answers = context.parallelize(range(tasks), tasks).mapPartitions(_object_probe(str(root), storage_options))
        for host, address, error in answers.collect():
            if error:
                where = f"{host} ({address})" if address else host
                raise IndexPathError(f"--path {root}: the executor on host {where} cannot open the index: {error} "
                                     f"(executors need the obstore package and the store's endpoint and "
                                     f"credentials: AWS_* variables in spark.executorEnv, or --storage-option)")
        return
    tasks = max(context.defaultParallelism, 1) * PROBES_PER_CORE
    manifest = str(Path(root) / MANIFEST)
    answers = context.parallelize(range(tasks), tasks).mapPartitions(_probe(manifest)).collect()
    for host, address, sees in answers:
        if not sees:
            where = f"{host} ({address})" if address else host
            raise IndexPathError(
                f"--path {root}: the executor on host {where} does not see {manifest}; the index must be on a "
                f"shared POSIX filesystem with working flock (NFS v4, EFS, CephFS), mounted at the same path on "
                f"the driver and on every executor"
            )
