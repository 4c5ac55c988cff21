"""A full disk under the indexing job: `msgindex index` (a subprocess) stops with one line saying
the disk is full and naming the file, and once space is back the job resumes exactly (every
record of the topic indexed once).

The index lives on the storage tests' small tmpfs (root only; skipped, saying so, where mounting
is not allowed). Spark's own streaming checkpoint stays off it: a full disk there is
Hadoop's error, not msgindex's.
"""

from __future__ import annotations

import uuid

import pytest

from msgindex.kafka.admin import OutgoingRecord, create_topics, produce
from tests.pipeline.support import assert_index_equals, ground_truth, job_args, run_job_in_process
from tests.pipeline.test_cli_failures import assert_one_line, run_cli
from tests.small_disk import fill_disk

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

LEFT_BYTES = 96 << 10  # free space left before the second run: less than one index file of SMALL_STORE (~416 KB)


def _records(first: int, count: int) -> list[OutgoingRecord]:
    return [OutgoingRecord(f"k{n}", b"v", keys=(f"order-{n}",)) for n in range(first, first + count)]


def test_a_full_disk_stops_the_job_with_one_line_and_it_resumes_exactly(kafka_bootstrap, spark, tmp_path, small_disk):
    topic = f"full-{uuid.uuid4().hex[:12]}"
    create_topics(kafka_bootstrap, {topic: 1})
    produce(kafka_bootstrap, topic, _records(0, 2_000))
    index = small_disk / "index"
    args = job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                    "--checkpoint", str(tmp_path / "spark-checkpoint"), "--max-offsets-per-trigger", "5000")
    assert sum(s.appended for s in run_job_in_process(args)) == 2_000

    produce(kafka_bootstrap, topic, _records(2_000, 20_000))  # two keys each: a new index file is due
    filler = fill_disk(small_disk, LEFT_BYTES)
    done, _ = run_cli(args)
    line = assert_one_line(done, "disk full writing", f"{index}/", "free some space")
    assert "Traceback" not in done.stderr and "crashed" not in line

    filler.unlink()  # space is back: the job resumes where the shards' checkpoints are
    run_job_in_process(args)
    assert_index_equals(index, ground_truth(kafka_bootstrap, [topic]), topics=[topic])
