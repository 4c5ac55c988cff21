"""The read path: ``spark.read.format("msgindex")`` and what answers through it.

``datasource`` (the Python data source), ``options`` (its options, parsed once), ``pushdown``
(which ``where`` filters the index answers exactly), ``rocketmq_reader`` (a RocketMQ broker's own
files), ``bulk_lookup`` (``lookup_keys``: a DataFrame of keys against the index),
``kafka_values`` (``fetchValues``: payloads from Kafka by offset).
"""
