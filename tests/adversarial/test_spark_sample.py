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


# --- hostile keys (B6): what a row shows finds exactly that row ---------------------------------
HOSTILE_KEYS = [b"\xff", b"\\xff", b"\\x5cxff", b"C:\\dir", b"caf\xc3", b"\\", b"\xff\\x41"]


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    from msgindex.storage.message import MessageRecord, decode_key_bytes
    from msgindex.storage.store import open_store

    root = tmp_path_factory.mktemp("hostile-keys") / "store"
    keys = [decode_key_bytes(raw) for raw in HOSTILE_KEYS]
    with open_store(root, create=True) as store, store.writer("b1") as writer:
        writer.append([MessageRecord("t", 0, n, 1_700_000_000_000 + n, key, (key,)) for n, key in enumerate(keys)])
    return root, keys


@pytest.mark.parametrize("pushdown", [True, False])
def test_a_shown_key_finds_exactly_its_row(spark, hostile_store, pushdown):
    """Rows show each key distinctly (message.arrow_text); ``where key = <shown>`` finds exactly
    that row with pushdown on (the index) and off (Spark filters a full read), and so does the
    ``key`` option; a bytes value given to ``.option`` is an error naming the option."""
    from pyspark.sql.functions import col, lit

    from msgindex.spark.read.datasource import PUSHDOWN_CONF
    from msgindex.storage.message import arrow_text

    root, keys = hostile_store
    session = spark if pushdown else spark.newSession()
    if not pushdown:
        session.conf.set(PUSHDOWN_CONF, "false")
    rows = session.read.format("msgindex").load(str(root)).select("key", "offset").collect()
    shown = {row["offset"]: row["key"] for row in rows}
    assert shown == {n: arrow_text(key) for n, key in enumerate(keys)} and len(set(shown.values())) == len(keys)
    outcomes = []
    for offset, text in shown.items():
        where = session.read.format("msgindex").load(str(root)).where(col("key") == lit(text))
        option = session.read.format("msgindex").option("key", text).load(str(root))
        for reader, frame in (("where", where), ("option", option)):
            got = sorted(row["offset"] for row in frame.select("offset").collect())
            outcomes.append(Outcome(f"keys {reader} pushdown={pushdown} {text!r}",
                                    RIGHT if got == [offset] else WRONG, f"{got} instead of [{offset}]"))
    try:
        session.read.format("msgindex").option("key", HOSTILE_KEYS[0]).load(str(root)).collect()
        outcomes.append(Outcome(f"keys option bytes pushdown={pushdown}", WRONG, "accepted"))
    except Exception as error:  # noqa: BLE001 - judged: a msgindex error naming the option
        failure = explain(error)
        ok = failure.raised_by_msgindex and "option 'key'" in failure.line and "Py4J" not in failure.line
        outcomes.append(Outcome(f"keys option bytes pushdown={pushdown}", "InvalidOptionError" if ok else WRONG,
                                failure.line))
    TALLY.add(outcomes)
    assert not [o for o in outcomes if o.wrong], [f"{o.attack}: {o.detail}" for o in outcomes if o.wrong]
