"""The one compiled module (everything else is in pyproject.toml): RocketMQ's selectPhyOffset in C
(connector/msgindex/storage/_index_walk.c). Optional: an install without a C compiler still works,
and index_file.py then walks in Python, as Spark executors (which get msgindex as a zip) always do."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("msgindex.storage._index_walk", ["connector/msgindex/storage/_index_walk.c"],
                             optional=True)])
