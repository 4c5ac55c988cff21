"""Where Spark runs msgindex: the session and the cluster around it.

``session`` (THE SparkSession builder: jars, settings), ``shipping`` (msgindex shipped to
executors as a zip; executors checked to see the index), ``worker_python`` (the interpreter Spark
starts its Python workers with), ``standalone`` (a standalone cluster on this machine),
``connect_server`` (a local Spark Connect server).
"""
