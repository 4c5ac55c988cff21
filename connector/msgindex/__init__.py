"""msgindex: find Kafka messages by key and time window, exactly, in milliseconds.

Layers (each only uses the ones above it):
  msgindex.storage   file formats, shards and the store, and RocketMQ broker stores read in
                     place (``open_rocketmq``); no Spark, no Kafka
  msgindex.kafka     the local KRaft broker and Kafka helpers
  msgindex.spark     SparkSession builder, the indexing pipeline, the `msgindex` data source
  msgindex.cli       the `msgindex` command
  streaming_jobs     thin runnable scripts over msgindex.cli (not part of the library)

Names are imported lazily so that `import msgindex` stays cheap on Spark executors.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "IndexFile": "msgindex.storage.hash_index.index_file",
    "MessageRecord": "msgindex.storage.message",
    "Store": "msgindex.storage.store",
    "open": "msgindex.storage.store",
    "Query": "msgindex.storage.query",
    "open_rocketmq": "msgindex.storage.rocketmq.broker_store",
    "RocketMQBrokerStore": "msgindex.storage.rocketmq.broker_store",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name])
        return getattr(module, "open_store" if name == "open" else name)
    raise AttributeError(f"module 'msgindex' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
