"""The storage engine: RocketMQ-format hash index files, a Kafka-style metadata log with sparse
offset/time indexes, crash-safe per-broker shards and the store over them. Knows nothing of Spark
or Kafka.

Where things are: ``hash_index/`` (RocketMQ's IndexFile and what readers derive from it), ``log/``
(the metadata log: batches, segments, sparse indexes), ``objects/`` (the store on S3, GCS and
Azure), ``rocketmq/`` (a RocketMQ broker's own store, read), ``maintenance/`` (inspect, repair,
upgrade, disk usage). Here: the shard (``shard``: its writer and reader; ``checkpoint``, ``verified_reads``,
``hot_keys``, ``fields``; ``verify``, the checks readers, inspect and repair share), the store
over shards (``store``, ``query``, ``retention``, ``backfill``) and the files they share
(``durable``, ``file_lock``, ``mapped_file``, ``manifest``)."""
