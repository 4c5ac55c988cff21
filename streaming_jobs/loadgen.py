"""Produce a realistic workload to Kafka (the load generator of msgindex.kafka.loadgen)."""

import sys

from msgindex.kafka.loadgen import main

if __name__ == "__main__":
    sys.exit(main())
