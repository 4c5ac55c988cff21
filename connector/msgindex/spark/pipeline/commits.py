"""What one task of a micro-batch reports back to the driver: one row per shard it wrote (and one
for the quarantine). The schema is declared once, here, as the fields of ``TaskCommit``; the
Arrow schema the executor builds and the DDL string Spark is given both derive from them.

Counts are what the batch contributed, whoever committed it: ``appended`` rows this task wrote,
``already_committed`` rows of this task whose source offsets the shard already held (written by
an earlier attempt of the task, a speculative copy, or an earlier run). Both are the batch's
records; only the first are new. The driver corrects the first with what all attempts of the task
committed (``with_committed``, attempt_counts.py): Spark keeps one attempt's result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from msgindex.spark.pipeline.field_values import merged_counts

if TYPE_CHECKING:
    from pyspark.sql import Row


@dataclass(frozen=True)
class TaskCommit:
    """One shard's (or the quarantine's, ``broker`` None) share of one task of a micro-batch."""

    broker: str | None
    appended: int = 0
    already_committed: int = 0
    keys_indexed: int = 0
    unkeyed: int = 0
    quarantined: int = 0  # malformed events of this task set aside now
    quarantined_before: int = 0  # malformed events of this task found in the quarantine already
    attempt: int = 0  # Spark's attempt number of the task that reported (>0: a retry or speculative copy)
    task: int = 0  # Spark's partition id of the task (the same for all its attempts)
    write_ms: float = 0.0
    deleted_segments: int = 0  # retention run by this task after its append (shard_owner.RetentionPolicy)
    deleted_index_files: int = 0
    deleted_bytes: int = 0
    requests: int = 0  # object stores: requests this task's appends sent (compaction's included)
    field_counts: str = ""  # JSON {field: [values, records without one, not UTF-8]} (field_values.py)

    def plus(self, other: TaskCommit) -> TaskCommit:
        """The counts of both (same shard; the attempt is set once per task, afterwards)."""
        return TaskCommit(self.broker, field_counts=merged_counts(self.field_counts, other.field_counts),
                          **{f.name: getattr(self, f.name) + getattr(other, f.name)
                             for f in dataclasses.fields(self) if f.name not in _NOT_COUNTS})


_NOT_COUNTS = ("broker", "attempt", "task", "field_counts")
_ARROW_TYPES = {"broker": pa.string(), "write_ms": pa.float64(), "field_counts": pa.string()}
COMMIT_ARROW_SCHEMA = pa.schema([
    (f.name, _ARROW_TYPES.get(f.name, pa.int64())) for f in dataclasses.fields(TaskCommit)
])
_DDL_TYPES = {pa.string(): "string", pa.int64(): "bigint", pa.float64(): "double"}
COMMIT_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in COMMIT_ARROW_SCHEMA)


def commits_batch(commits: list[TaskCommit]) -> pa.RecordBatch:
    """The Arrow rows a task yields."""
    columns = {f.name: [getattr(c, f.name) for c in commits] for f in dataclasses.fields(TaskCommit)}
    return pa.RecordBatch.from_pydict(columns, schema=COMMIT_ARROW_SCHEMA)


def commit_of_row(row: TaskCommit | Row | dict) -> TaskCommit:
    """A collected Spark Row (or dict) back to the value type (a TaskCommit is returned as is)."""
    if isinstance(row, TaskCommit):
        return row
    get = row.asDict() if hasattr(row, "asDict") else row
    return TaskCommit(**{f.name: get[f.name] for f in dataclasses.fields(TaskCommit)})


def with_committed(commit: TaskCommit, appended: int, keys_indexed: int) -> TaskCommit:
    """`commit` (one accepted task result for one shard) with what every attempt of its task
    committed to that shard: the rest of its records were committed before."""
    records = commit.appended + commit.already_committed
    return dataclasses.replace(commit, appended=appended, already_committed=records - appended,
                               keys_indexed=keys_indexed)
