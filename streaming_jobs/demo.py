"""The demo as a script (the same as `msgindex demo`): a local Kafka broker, a workload, the
indexing pipeline, then lookups."""

import sys

from msgindex.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
