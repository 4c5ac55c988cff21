"""A RocketMQ broker's own store, read in place: its commit log (``commit_log``), its IndexFiles
(``index_files``) and the verified key lookups and time scans over both (``broker_store``).
Storage layer: no Spark, no Kafka."""
