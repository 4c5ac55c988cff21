"""End-to-end indexing throughput of the real (shuffle-free) pipeline vs two baselines, same run.

    python bench/bench_pipeline.py [--records 600000] [--bootstrap-servers HOST:PORT]
                                   [--cluster-workers N]      (a local standalone cluster, N 1-core workers)

Produces the records once (Zipf keys, some KEYS/UNIQ_KEY headers, JSON payloads of ~200 bytes with
an order id and 1-3 line items, a trace-id header on each: loadgen.keyed_records(json_fields=True);
a local broker is started when no --bootstrap-servers is given), warms Spark up, then reads the same topic with fresh
checkpoints, each run measured from query start (everything already produced) to query end
(everything committed), available-now, same micro-batch size, interleaved:

  noop      the same Kafka source and the same metadata projection (key, headers, shard column)
            into Spark's "noop" sink: reading Kafka + building the metadata, nothing stored;
  parquet   the same projection into Spark's Parquet file sink (writeStream.format("parquet")):
            what a Spark engineer builds in twenty lines to find messages later;
  arrow     the pipeline's own plan (foreachBatch, shard and slice columns, coalesce, mapInArrow)
            with a task function that only counts its rows: the floor of any Python-side sink
            (rows to Arrow in the JVM, to the Python workers, per-batch jobs); not a goal baseline;
  pipeline  the real job (msgindex.spark.pipeline.job.index_kafka): shards appended and committed.

and with fields (issue 22; skipped with --no-fields): two JSON fields and a header (FIELD_FLAGS:
an order id by get_json_object, the line items' skus by from_json, the trace-id header):

  parquet-fields   the same projection plus the fields' extracted values as columns, into the
                   Parquet file sink: the competitor of a field index;
  pipeline-fields  the real job with those --index-field / --index-header flags.

and, on an object store (moto's S3 server in its own process on loopback, started here; skipped
with --no-object-store), where everything lives in one bucket, Spark's checkpoints included
(``s3a://``, Hadoop's connector, as the job defaults to for an ``s3://`` index):

  parquet-s3   the Parquet file sink writing into the bucket (the competitor there);
  pipeline-s3  the real job with --path s3://bench/...: chunk PUTs + put-if-absent commits.

Prints records/s of each (median of --repeat runs), the ratios (pipeline/noop, goal >= 0.9;
pipeline/parquet, goal >= 1.0; pipeline-fields/pipeline, goal >= 0.75; pipeline-fields/parquet-fields;
pipeline-s3/pipeline, goal >= 0.8; pipeline-s3/parquet-s3), the
object store's requests per micro-batch, and where the pipeline's time goes.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from moto_s3 import add_object_store_flag

TOPIC_PARTITIONS = 3


def field_flags() -> list[str]:
    """The field runs' flags: two JSON fields of loadgen's payloads and its trace-id header."""
    from msgindex.kafka.loadgen import ITEMS_SCHEMA, ORDER_ID_PATH, TRACE_HEADER

    return ["--index-field", f"order=get_json_object(CAST(value AS STRING), '{ORDER_ID_PATH}')",
            "--index-field", f"sku=from_json(CAST(value AS STRING), '{ITEMS_SCHEMA}').items.sku",
            "--index-header", f"trace={TRACE_HEADER}"]


def _options(bootstrap: str, topic: str, path: Path | str, per_trigger: int, master: str | None, conf: dict,
             fields: bool = False):
    from msgindex.cli import index as index_job

    args = ["--bootstrap-servers", bootstrap, "--subscribe", topic, "--path", str(path), "--available-now",
            "--max-offsets-per-trigger", str(per_trigger), "--quiet-spark", *(field_flags() if fields else [])]
    if master:
        args += ["--master", master]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return index_job.options_from_args(index_job.build_parser().parse_args(args))


def _count_rows(batches):
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _planner(spark, options, scratch: Path):
    """The pipeline's batch planner (its partition -> shard map kept in a local `scratch` store:
    the baselines below store nothing of msgindex's)."""
    from msgindex.spark.pipeline.sink import BatchWriter, SinkConfig
    from msgindex.storage.store import open_store

    open_store(scratch, create=True).close()
    return BatchWriter(SinkConfig(str(scratch), "records", str(scratch / "_quarantine")),
                       source=options.kafka_source(), parallelism=spark.sparkContext.defaultParallelism)


def _arrow_floor(spark, options, scratch: Path) -> tuple[float, int]:
    """The pipeline's plan with a task function that only counts (see the module docstring)."""
    from msgindex.spark.pipeline.job import kafka_stream

    planner = _planner(spark, options, scratch)
    counted = []

    def count_only(df, batch_id):
        counted.extend(row.rows for row in planner.plan(df).mapInArrow(_count_rows, "rows long").collect())

    started = time.perf_counter()
    query = (kafka_stream(spark, options).writeStream.foreachBatch(count_only)
             .option("checkpointLocation", options.checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - started, sum(counted)


def _baseline(spark, options, sink_format: str, scratch: Path) -> tuple[float, int]:
    """Seconds and rows of the same source and projection (with the fields of `options` as
    columns) into one of Spark's own sinks (the Parquet files go to <--path>/parquet, through
    Hadoop's connector on an object store)."""
    from msgindex.spark.pipeline.field_values import analysed_definitions
    from msgindex.spark.pipeline.job import kafka_stream
    from msgindex.spark.pipeline.kafka_records import project_records
    from msgindex.spark.runtime.session import hadoop_url

    planner = _planner(spark, options, scratch)
    fields = analysed_definitions(kafka_stream(spark, options), options.fields)
    projected = project_records(kafka_stream(spark, options), planner.shard_column(), fields)
    writer = projected.writeStream.format(sink_format).option("checkpointLocation", options.checkpoint)
    if sink_format == "parquet":
        writer = writer.option("path", f"{hadoop_url(options.path) if options.on_object_store else options.path}/parquet")
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    return seconds, sum(p["numInputRows"] for p in query.recentProgress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_pipeline.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant (the median is reported)")
    parser.add_argument("--cluster-workers", type=int, default=0,
                        help="run on a local Spark standalone cluster of N 1-core workers (default: local[2])")
    parser.add_argument("--no-fields", dest="fields", action="store_false",
                        help="skip the runs with two JSON fields and a header (parquet-fields, pipeline-fields)")
    add_object_store_flag(parser, "the runs into an S3 bucket")
    args = parser.parse_args(argv)

    from msgindex.kafka.admin import create_topics
    from msgindex.kafka.broker import LocalBroker, free_port
    from msgindex.kafka.loadgen import keyed_records, produce
    from msgindex.spark.pipeline.field_values import describe_counts, merged_counts
    from msgindex.spark.pipeline.job import index_kafka
    from msgindex.spark.runtime.session import build_spark_session, hadoop_url
    from msgindex.spark.runtime.standalone import LocalStandaloneCluster

    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    broker = cluster = servers = None
    bootstrap = args.bootstrap_servers
    master, conf = None, {}
    try:
        if not bootstrap:
            broker = LocalBroker(work / "kafka", port=free_port(), controller_port=free_port())
            bootstrap = broker.start(timeout=300)
        if args.cluster_workers:
            hosts = tuple(f"127.0.0.{n + 1}" for n in range(args.cluster_workers))
            cluster = LocalStandaloneCluster(work / "cluster", worker_hosts=hosts).start()
            master = cluster.master_url
            conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    "spark.executor.memory": "512m", "spark.pyspark.python": sys.executable}
        names = ["noop", "parquet", "arrow", "pipeline"] + (["parquet-fields", "pipeline-fields"] if args.fields else [])
        store_urls: list[str] = []
        if args.object_store:
            from moto_s3 import Servers

            servers = Servers()
            servers.create_bucket("bench")
            servers.export_env()  # the job, Spark's s3a connector and the executors read AWS_*
            names += ["parquet-s3", "pipeline-s3"]
            store_urls = ["s3://bench/"]
        topic = f"bench-{int(time.time())}"
        create_topics(bootstrap, {topic: TOPIC_PARTITIONS})
        started = time.perf_counter()
        produce(bootstrap, keyed_records([topic], args.records, seed=3, json_fields=True))
        print(f"produced {args.records:,} records in {time.perf_counter() - started:.1f} s", flush=True)
        # the first session's jars are the process's: Hadoop's S3 connector staged now if wanted
        spark = build_spark_session(app_name="bench-pipeline", master=master, extra_conf=conf,
                                    hadoop_urls=[hadoop_url(url) for url in store_urls], store_urls=store_urls)
        where = f"{master} ({args.cluster_workers} x 1-core executors)" if master else spark.sparkContext.master
        # warm-up: the JVM (noop) and the Python workers with msgindex imported (a pipeline run)
        _baseline(spark, _options(bootstrap, topic, work / "warmup", args.records, master, conf), "noop",
                  work / "warmup-plan")
        index_kafka(_options(bootstrap, topic, work / "warmup-pipeline", args.records, master, conf, args.fields))
        if args.object_store:
            index_kafka(_options(bootstrap, topic, "s3://bench/warmup", args.records, master, conf))

        runs: dict[str, list[float]] = {name: [] for name in names}
        history: dict[str, list] = {}
        for rep in range(args.repeat):  # interleaved, so drifting machine load hits all of them alike
            for name in runs:
                path = f"s3://bench/{name}-{rep}" if name.endswith("-s3") else work / f"{name}-{rep}"
                options = _options(bootstrap, topic, path, args.max_offsets_per_trigger, master, conf,
                                   name.endswith("-fields"))
                scratch = work / f"plan-{name}-{rep}"
                if name.startswith("pipeline"):
                    started = time.perf_counter()
                    history[name] = index_kafka(options)
                    seconds, rows = time.perf_counter() - started, sum(s.records for s in history[name])
                elif name == "arrow":
                    seconds, rows = _arrow_floor(spark, options, scratch)
                else:
                    seconds, rows = _baseline(spark, options, name.removesuffix("-s3").removesuffix("-fields"), scratch)
                assert rows == args.records, f"{name} saw {rows} rows, not {args.records}"
                runs[name].append(seconds)
                print(f"run {rep + 1}/{args.repeat} {name:15s} {rows:,} rows in {seconds:6.1f} s = "
                      f"{rows / seconds:9,.0f} records/s", flush=True)

        median = {name: statistics.median(times) for name, times in runs.items()}
        rate = {name: args.records / seconds for name, seconds in median.items()}
        print(f"\n{where}: median of {args.repeat} runs, {args.records:,} records, "
              f"{args.max_offsets_per_trigger:,} per micro-batch:")
        for name in runs:
            print(f"  {name:15s} {median[name]:6.1f} s = {rate[name]:9,.0f} records/s")
        print(f"ratio pipeline/noop = {rate['pipeline'] / rate['noop']:.2f} (goal >= 0.9); "
              f"pipeline/parquet = {rate['pipeline'] / rate['parquet']:.2f} (goal >= 1.0); "
              f"arrow floor/noop = {rate['arrow'] / rate['noop']:.2f}; pipeline/arrow floor = "
              f"{rate['pipeline'] / rate['arrow']:.2f}")
        if args.fields:
            stats = history["pipeline-fields"]
            counts = json.loads(functools.reduce(merged_counts, (json.dumps(s.field_counts) for s in stats), "") or "{}")
            print(f"fields: pipeline-fields/pipeline = {rate['pipeline-fields'] / rate['pipeline']:.2f} (goal >= 0.75); "
                  f"pipeline-fields/parquet-fields = {rate['pipeline-fields'] / rate['parquet-fields']:.2f}; "
                  f"parquet-fields/parquet = {rate['parquet-fields'] / rate['parquet']:.2f}; "
                  f"values indexed (last run){describe_counts(counts).removeprefix(' | fields')}")
            for name in ("pipeline", "pipeline-fields"):
                print(f"  {name} (last run): {sum(s.write_seconds for s in history[name]):.1f} s in the tasks' "
                      f"appends, {sum(s.seconds for s in history[name]):.1f} s inside foreachBatch, "
                      f"{sum(s.keys_indexed for s in history[name]):,} index entries")
        if args.object_store:
            requests = [s.requests for s in history["pipeline-s3"]]
            print(f"object store: pipeline-s3/pipeline = {rate['pipeline-s3'] / rate['pipeline']:.2f} (goal >= 0.8); "
                  f"pipeline-s3/parquet-s3 = {rate['pipeline-s3'] / rate['parquet-s3']:.2f}; "
                  f"parquet-s3/parquet = {rate['parquet-s3'] / rate['parquet']:.2f}; requests the appends sent per "
                  f"micro-batch (last run): {requests} (Spark's checkpoint through s3a not counted)")
            for name in ("pipeline", "pipeline-s3"):
                inside = sum(s.seconds for s in history[name])
                print(f"  {name} (last run): {sum(s.write_seconds for s in history[name]):.1f} s in the tasks' appends, "
                      f"{inside:.1f} s inside foreachBatch ({', '.join(f'{s.seconds:.1f}' for s in history[name])} s), "
                      f"{runs[name][-1] - inside:.1f} s outside it (the job's start, Spark's checkpoint and offsets)")
        write = sum(s.write_seconds for s in history["pipeline"])
        batches = sum(s.seconds for s in history["pipeline"])
        print(f"where the time goes (last pipeline run): {len(history['pipeline'])} micro-batches, {batches:.1f} s inside "
              f"foreachBatch; the tasks' shard appends (encode, hash index, fsync, commit) took {write:.1f} s summed "
              f"over tasks; Kafka read + projection alone ~{median['noop']:.1f} s (noop); + rows to Arrow, to the "
              f"Python workers and per-batch Python jobs ~{median['arrow'] - median['noop']:+.1f} s (arrow - noop); "
              f"+ the appends, the job's start (index claim, code shipping) and lag reports "
              f"~{median['pipeline'] - median['arrow']:+.1f} s (pipeline - arrow)")
    finally:
        if cluster is not None:
            cluster.stop()
        if servers is not None:
            servers.stop()
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
