"""Object-store paths Spark opens itself through Hadoop (its streaming checkpoint on ``s3a://``,
``gs://``, ``abfss://``): one line for the connectors' errors, and a check that takes seconds.

Hadoop's connectors say what is wrong, but deep in a Py4J stack trace, and S3A retries an
endpoint that refuses connections for about three minutes before it says so (measured: 188 s
with Hadoop 3.5.0's defaults on a loaded 2-core machine). `check_hadoop_path` asks once, without
retries, before a query starts; `hadoop_error_line` turns any connector error (from the check, or
from a running query, via the CLI's ``failure.py``) into a line naming the path and what to fix.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from msgindex.errors import ConnectorJarsError, ObjectStoreError
from msgindex.spark.runtime.session import HADOOP_CONNECTORS, hadoop_connector, url_scheme

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Hadoop's own wording (Configuration.getClass, FileSystem.getFileSystemClass) and S3A's
# (S3AUtils.translateException: "<operation> on <path>: <SDK exception>")
_CLASS_NOT_FOUND = re.compile(r"ClassNotFoundException: Class (?P<cls>[\w.$]+) not found")
_NO_FILESYSTEM = re.compile(r'No FileSystem for scheme "(?P<scheme>[^"]+)"')
_NO_BUCKET_IN_URL = re.compile(r"path=(?P<url>s3a:/[^/\s][^\s]*?)\.?\s.*?bucket is null/empty", re.DOTALL)
_S3A_PATH = re.compile(r"(?:`|\bon )(?P<url>s3a://[^\s`':]+)")
_NO_SUCH_BUCKET = re.compile(r"NoSuchBucket|UnknownStoreException")
_DENIED = re.compile(r"AccessDeniedException|Status Code: 403|\b(?:InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied)\b")
_UNKNOWN_HOST = re.compile(r"UnknownHostException: (?P<host>[\w.-]+)\s*$", re.MULTILINE)
_REFUSED = re.compile(r"[Cc]onnect to (?P<where>\S+?)(?: \[[^\]]*\])? failed: Connection refused|"
                      r"ConnectException: Connection refused")
_ENDPOINT_SETTINGS = "AWS_ENDPOINT_URL / spark.hadoop.fs.s3a.endpoint"

# One attempt, no retries, short connection timeout: for the check only (a running query keeps
# the connector's retries, which ride out a store's brief unavailability).
QUICK_CHECK = {"fs.s3a.attempts.maximum": "1", "fs.s3a.retry.limit": "1", "fs.s3a.retry.interval": "100ms",
               "fs.s3a.connection.establish.timeout": "10s"}


def hadoop_error_line(text: str) -> str | None:
    """One line naming the path and what to fix for an error of a Hadoop object-store connector
    in `text` (an exception's whole text, Java causes included); None for any other error."""
    missing = _CLASS_NOT_FOUND.search(text)
    if missing:
        package = missing.group("cls").rpartition(".")[0]
        for connector in HADOOP_CONNECTORS:
            if connector.filesystem_class.rpartition(".")[0] == package:
                scheme = connector.schemes[-1]
                return (f"Spark cannot open {scheme}:// paths: {connector.name} is not on its classpath "
                        f"({missing.group('cls')} not found); msgindex's session adds it for the {scheme}:// paths "
                        f"it is given, spark-submit needs --jars \"$(msgindex kafka jars --object-store {scheme})\"")
    no_filesystem = _NO_FILESYSTEM.search(text)
    if no_filesystem:
        scheme = no_filesystem.group("scheme")
        if scheme == "s3":
            return ("Spark has no filesystem for s3:// paths (Hadoop's S3 connector takes s3a://): write the "
                    "checkpoint as s3a://bucket/path")
        return f"Spark has no filesystem for {scheme}:// paths: give a path Spark's Hadoop can open"
    no_bucket = _NO_BUCKET_IN_URL.search(text)
    if no_bucket:
        return f"{no_bucket.group('url')}: no bucket in the URL (write s3a://bucket/path)"
    where = _S3A_PATH.search(text)
    if where is None:
        return None
    url = where.group("url")
    bucket = url[len("s3a://"):].split("/", 1)[0]
    if _NO_SUCH_BUCKET.search(text):
        return f"{url}: bucket {bucket!r} does not exist at the S3 endpoint ({_ENDPOINT_SETTINGS}): create it or fix the URL"
    if _DENIED.search(text):
        return (f"{url}: the S3 endpoint refused the credentials, or their permissions on bucket {bucket!r} (403): "
                f"check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (or spark.hadoop.fs.s3a.*)")
    unknown = _UNKNOWN_HOST.findall(text)
    if unknown:
        return f"{url}: the S3 endpoint's host {unknown[-1]!r} does not resolve: check {_ENDPOINT_SETTINGS}"
    refused = _REFUSED.search(text)
    if refused:
        at = f" at {refused.group('where')}" if refused.group("where") else ""
        return f"{url}: nothing answers{at} (connection refused): check {_ENDPOINT_SETTINGS}"
    return None


def check_hadoop_path(spark: SparkSession, url: str) -> None:
    """Make sure Spark's Hadoop can use `url` (a checkpoint on an object store) before a query
    relies on it: its connector is on the classpath, the endpoint answers, the credentials are
    accepted, the bucket exists; else ObjectStoreError (or ConnectorJarsError) with one line
    naming `url` and what to fix. One request, no retries: seconds, where the connector's own
    retries take minutes. Local and HDFS paths, and Spark Connect sessions (no JVM here), are
    left to Spark."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or url_scheme(url) in ("", "file"):
        return
    from py4j.protocol import Py4JJavaError

    hadoop = jvm.org.apache.hadoop
    conf = hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    for key, value in QUICK_CHECK.items():
        conf.set(key, value)
    path = hadoop.fs.Path(url)
    try:
        filesystem = hadoop.fs.FileSystem.newInstance(path.toUri(), conf)  # not the cached one Spark uses
        try:
            filesystem.exists(path)
        finally:
            filesystem.close()
    except Py4JJavaError as failed:
        text = f"{failed}\n{failed.java_exception.toString()}"
        line = hadoop_error_line(text)
        if line is None:
            raise
        kind = ConnectorJarsError if _CLASS_NOT_FOUND.search(text) and hadoop_connector(url) else ObjectStoreError
        raise kind(line) from None
