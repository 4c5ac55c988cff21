"""The indexing job as a script, for spark-submit (the same job as `msgindex index`):

    spark-submit --master spark://HOST:7077 --jars "$(msgindex kafka jars)" streaming_jobs/index_job.py \\
        --bootstrap-servers HOST:9092 --subscribe orders,payments --path /shared/index

msgindex must be installed in the driver's Python; the job ships it to the executors itself
(they need only pyspark's Arrow dependencies). Everything lives in the library
(``msgindex.cli.index`` parses the flags, ``msgindex.spark.pipeline.job`` runs the query).
"""

import sys

from msgindex.cli.index import main

if __name__ == "__main__":
    sys.exit(main())
