"""The storage engine: RocketMQ-format hash index files, a Kafka-style metadata log with sparse
offset/time indexes, crash-safe per-broker shards and the store over them. Knows nothing of Spark
or Kafka."""
