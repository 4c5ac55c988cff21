"""Run by ``tests/checkpoint`` in a Python of its own. ``plain``: the way a user sets up their own
job, a plain ``SparkSession.builder`` with ``spark.jars`` from the staged lists and the settings
of ``object_store_conf`` (from the ``AWS_*`` variables of its environment); ``msgindex``: the
session the indexing job runs in (``build_spark_session(hadoop_urls=[CHECKPOINT, ...])``).
Prints one JSON object on its last line.

    python plain_s3a_session.py plain|msgindex BOOTSTRAP TOPIC CHECKPOINT [NAME=URL ...]

Spark's Kafka source, Trigger.AvailableNow, checkpoint at CHECKPOINT: each micro-batch's id and
the (partition, offset) of every record it got. Then, in the same session, for each bad URL:
`check_hadoop_path`'s error and seconds taken, and (NAME not starting with "slow") the line the
CLI prints for a query started on it. ``endpoint-BUCKET=URL`` sets that bucket's S3 endpoint.
"""

from __future__ import annotations

import json
import sys
import time


def session(way: str, checkpoints: list[str], extra: dict[str, str]):
    if way == "msgindex":
        from msgindex.spark.runtime.session import build_spark_session

        return build_spark_session("msgindex-s3a", "local[2]", extra, hadoop_urls=checkpoints)
    from pyspark.sql import SparkSession

    from msgindex.spark.runtime.session import kafka_connector_jars, object_store_conf, object_store_jars

    jars = [*kafka_connector_jars(), *object_store_jars(checkpoints)]
    builder = (SparkSession.builder.master("local[2]").appName("plain-s3a")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.jars", ",".join(map(str, jars))))
    for key, value in {**object_store_conf(checkpoints, user_conf=extra), **extra}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def run(way: str, bootstrap: str, topic: str, checkpoint: str, cases: dict[str, str]) -> dict:
    extra = {f"spark.hadoop.fs.s3a.bucket.{name[len('endpoint-'):]}.endpoint": url
             for name, url in cases.items() if name.startswith("endpoint-")}
    bad = {name: url for name, url in cases.items() if not name.startswith("endpoint-")}
    spark = session(way, [checkpoint, *bad.values()], extra)
    batches: list = []

    def keep(frame, batch_id):
        batches.append([batch_id, sorted([row.partition, row.offset] for row in frame.select("partition", "offset")
                                         .collect())])

    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(keep).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(600)
    conf = {key: value for key, value in spark.sparkContext.getConf().getAll()
            if key.startswith(("spark.hadoop.fs.s3a.", "spark.executorEnv.AWS_", "spark.jars",
                               "spark.driver.extraClassPath"))}
    out = {"batches": batches, "conf": conf, "error": str(query.exception()) if query.exception() else None,
           "bad": {name: try_bad(spark, name, url) for name, url in bad.items()}}
    spark.stop()
    return out


def try_bad(spark, name: str, url: str) -> dict:
    from msgindex.cli.failure import explain
    from msgindex.spark.runtime.hadoop_paths import check_hadoop_path

    began = time.monotonic()
    try:
        check_hadoop_path(spark, url)
        result = {"check": None}
    except Exception as error:
        result = {"check": f"{type(error).__name__}: {error}"}
    result["check_s"] = round(time.monotonic() - began, 1)
    if not name.startswith("slow"):
        try:
            spark.readStream.format("rate").load().writeStream.format("noop") \
                .option("checkpointLocation", url).start().stop()
            result["query"] = None
        except Exception as error:
            failure = explain(error)
            result.update(query=failure.line, query_exit=2 if failure.raised_by_msgindex else 1,
                          query_lines=len(str(error).splitlines()))
    return result


def main(argv: list[str]) -> int:
    print(json.dumps(run(*argv[:4], dict(arg.split("=", 1) for arg in argv[4:]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
