"""The indexing pipeline: Kafka -> Structured Streaming -> per-broker shards, exactly once.

Driver side: ``job`` (the query of ``msgindex index``), ``sink`` (``foreachBatch``: plans a
micro-batch, reports it), ``connect_job`` (the same over Spark Connect), and what the job keeps
beside the shards: ``ownership`` (one job per index), ``partition_brokers`` (a partition's shard,
fixed once), ``progress`` (the batch log), ``spark_checkpoint`` (offsets read back).

Executor side: ``task_writer`` (one task appends its own rows), ``shard_owner`` (the shard
writers a Python worker keeps open), ``commits`` (what a task reports), ``quarantine`` (records
set aside, exactly once).

Input shapes: ``kafka_source`` (Spark's ``kafka`` source settings), ``kafka_records`` (records:
keys and headers), ``metadata_events`` (RocketMQ-style dispatch events), ``timestamp_rule`` and
``unreadable_records`` (what is set aside, and records Spark cannot read).
"""
