# The msgindex indexing job in a container (used by docker-compose.yml's `indexer` service).
# Python for the package, a JRE 17 for Spark, Maven to stage Spark's Kafka connector and spark-avro jars and
# Hadoop's S3A connector from Maven Central at build time (so the container starts without
# downloading anything).
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven procps \
 && rm -rf /var/lib/apt/lists/*

ENV MSGINDEX_HOME=/opt/msgindex \
    PYTHONUNBUFFERED=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY connector ./connector
COPY streaming_jobs ./streaming_jobs
# Kafka's connector and spark-avro, and Hadoop's S3A connector (hadoop-aws + the AWS SDK bundle) for the s3a://
# checkpoint; Maven's cache goes (the staged copies stay in MSGINDEX_HOME).
RUN pip install --no-cache-dir . \
 && python -c "from msgindex.spark.runtime.session import kafka_connector_jars, object_store_jars; \
print(kafka_connector_jars(), object_store_jars(['s3a://bucket/checkpoint']))" \
 && rm -rf /root/.m2

WORKDIR /data
ENTRYPOINT ["msgindex"]
CMD ["--help"]
