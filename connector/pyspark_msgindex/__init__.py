"""Makes ``spark.read.format("msgindex")`` work with no registration call: Spark imports
top-level ``pyspark_<name>`` modules and registers their ``DefaultSource``."""

from msgindex.spark.datasource import MsgIndexDataSource as DefaultSource

__all__ = ["DefaultSource"]
