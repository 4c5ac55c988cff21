"""The compiled modules (everything else is in pyproject.toml), each optional: an install without a C
compiler (or without zlib's header) still works, and msgindex then runs the Python code each one
mirrors, as Spark executors (which get msgindex as a zip) always do.

* storage/hash_index/_index_walk.c: RocketMQ's selectPhyOffset (index_file.py).
* storage/log/_blocks.c: the metadata log's blocks checked and decompressed with the GIL released
  (batch_format.py); it opens the system's LZ4 library when imported (and is not used without one).
* storage/_result_rows.c: a point read's result rows verified, ordered and built as an Arrow batch
  (verified_reads.py, ``_plain_few``).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("msgindex.storage.hash_index._index_walk", ["connector/msgindex/storage/hash_index/_index_walk.c"],
              optional=True),
    Extension("msgindex.storage.log._blocks", ["connector/msgindex/storage/log/_blocks.c"], libraries=["z"],
              optional=True),
    Extension("msgindex.storage._result_rows", ["connector/msgindex/storage/_result_rows.c"], optional=True),
])
