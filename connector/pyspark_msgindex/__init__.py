"""Makes ``spark.read.format("msgindex")`` work with no registration call: Spark imports
top-level ``pyspark_<name>`` modules found on its Python workers' path and registers their
``DefaultSource``.

The source registered this way reads right under either value of Spark's Python data source
pushdown setting (options use the index; ``where`` filters are left to Spark);
``msgindex.spark.enable_pushdown(spark)`` makes ``where`` filters use the index in a session."""

from msgindex.spark.read.datasource import MsgIndexDataSource as DefaultSource

__all__ = ["DefaultSource"]
