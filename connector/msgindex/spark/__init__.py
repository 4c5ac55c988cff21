"""msgindex on Spark: the ``msgindex`` data source, bulk key lookups, the indexing pipeline.

    from msgindex.spark import enable_pushdown, lookup_keys

Names are imported lazily: executors import submodules of this package, and the package itself
should not pull in what they do not use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "enable_pushdown": "msgindex.spark.read.datasource",
    "lookup_keys": "msgindex.spark.read.bulk_lookup",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'msgindex.spark' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
