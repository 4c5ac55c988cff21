"""The ranges of the fixed-width signed integers that the file formats msgindex reads and writes
store (RocketMQ's and Kafka's are Java ints and longs; msgindex's own follow them)."""

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
