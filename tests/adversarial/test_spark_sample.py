"""A sample of the file attacks read through ``spark.read.format("msgindex")`` (the session
fixture's SparkSession): a key lookup and a time-window scan per damage, each the right answer or
a job failure whose one line (``cli.failure.explain``) is a msgindex error naming the file."""

from __future__ import annotations

import shutil

import pytest

from msgindex.cli.failure import explain
from tests.adversarial import file_attacks
from tests.adversarial.tally import RIGHT, TALLY, WRONG, Outcome
from tests.storage.shard_model import model_lookup, model_scan

# one damage of each kind of outcome: errors of data files, right answers around derived files
SAMPLE = ["hash_index_sealed:zero", "hash_index_active:scribble", "log_oldest:delete", "log_active:truncate",
          "checkpoint:delete", "manifest:scribble", "shard_dir:delete", "time_index:scribble", "summary:zero",
          "hash_run:scribble", "offset_index_active:truncate"]
KEY = "shared1"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return file_attacks.build_pristine(tmp_path_factory.mktemp("spark-attacks") / "pristine")


def spark_rows(frame) -> list[tuple]:
    """Rows as (broker, seq): what identifies a message in the store."""
    return sorted((row["broker"], row["seq"]) for row in frame.select("broker", "seq").collect())


def model_ids(rows: list[tuple]) -> list[tuple]:
    return sorted((row[1], row[5]) for row in rows)


@pytest.mark.parametrize("attack", SAMPLE)
def test_spark_reads_a_damaged_store(spark, pristine, tmp_path, attack):
    kind_name, damage_name = attack.split(":")
    kind = next(k for k in file_attacks.KINDS if k.name == kind_name)
    store = file_attacks.damage.copy_of(pristine, tmp_path / "store")
    victim = kind.locate(store)
    file_attacks.DAMAGES[damage_name](victim)
    named = str(victim.relative_to(store.root))
    models = list(store.models.values())
    begin, end = file_attacks.WINDOW
    reads = {
        "spark_key": (lambda: spark.read.format("msgindex").option("key", KEY).load(str(store.root)),
                      model_lookup(models, [KEY])),
        "spark_window": (lambda: spark.read.format("msgindex").option("begin", str(begin)).option("end", str(end))
                         .load(str(store.root)), model_scan(models, begin_ms=begin, end_ms=end)),
    }
    outcomes = []
    for reader, (frame, expected) in reads.items():
        try:
            got = spark_rows(frame())
        except Exception as error:  # noqa: BLE001 - judged below
            failure = explain(error)
            ok = failure.raised_by_msgindex and named in failure.line
            outcomes.append(Outcome(f"spark {attack} {reader}", "spark: msgindex error" if ok else WRONG,
                                    failure.line))
            continue
        outcomes.append(Outcome(f"spark {attack} {reader}", RIGHT if got == model_ids(expected) else WRONG,
                                "" if got == model_ids(expected) else f"{len(got)} rows, {len(expected)} expected"))
    TALLY.add(outcomes)
    shutil.rmtree(store.root, ignore_errors=True)
    assert not [o for o in outcomes if o.wrong], [f"{o.attack}: {o.detail}" for o in outcomes if o.wrong]
