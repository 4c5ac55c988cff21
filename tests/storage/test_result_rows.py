"""A point read's rows built in C (``storage/_result_rows.c``, ``VerifiedReads._compiled_few``)
against their oracle, ``VerifiedReads._plain_few``, on the same records as the compiled reader read
them, and every lookup against the model with and without the compiled rows: keys that collide
(within a topic and across topics), keyless records, a message key stored apart from its keys,
extra keys, commit-log offsets and sizes the source did not have, windows, partitions and limits,
batches that saw different topics (their topic tables differ), and texts the C path must decline
(non-ASCII, a backslash)."""

from __future__ import annotations

import dataclasses
import random
import shutil

import pytest

from msgindex.storage import verified_reads
from msgindex.storage.log import batch_format as bf
from msgindex.storage.message import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, MessageRecord, shown_timestamp
from msgindex.storage.store import StoreSettings, open_store
from msgindex.storage.verified_reads import VerifiedReads
from tests.storage.kinds import accept_any_timestamp, patch_few_candidates
from tests.storage.shard_model import COLLIDING_KEYS, ShardModel, model_lookup, table_rows

BASE = 1_700_000_000_000
ASCII_KEYS = ["k1", "k2", "k3", "", "acct:0001234:v2", "x" * 300, "Aa"]  # ("Aa" collides with "BB": see below)
DECLINED_KEYS = ["back\\slash", "ключ"]  # shown otherwise than stored, or not ASCII: the C path declines
TOPIC_SETS = [("orders", "payments"), ("orders",), ("payments", "audit")]
COLLIDING_TOPICS = ("Aa", "BB")  # "Aa#k" and "BB#k" collide: one small batch of them
SETTINGS = StoreSettings(hash_slot_num=4_001, index_num=2_000, segment_bytes=1 << 20, index_interval_bytes=300)

COMPILED = pytest.mark.skipif(verified_reads.compiled_rows is None or bf.compiled_blocks is None,
                              reason="the compiled modules were not built here (no C compiler at install)")


def test_the_compiled_rows_are_built_where_a_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: msgindex installs without its compiled result rows")
    assert verified_reads.compiled_rows is not None, "msgindex.storage._result_rows was not built: `make setup`"


def _record(rng: random.Random, offset: int, topics: tuple[str, ...], declined_share: float,
            keys_from: list[str] = ASCII_KEYS) -> MessageRecord:
    # (a record carries declined keys only: the others' lookups read it only through a collision)
    pool = DECLINED_KEYS if rng.random() < declined_share else keys_from
    keys = tuple(rng.choice(pool) for _ in range(rng.randint(0, 3)))
    key = keys[0] if keys and rng.random() < 0.7 else None
    if key is None and len(keys) > 1 and rng.random() < 0.5:
        key = keys[-1]  # a message key that is not its first index key: stored apart from the keys
    # whole seconds: many rows tie on their timestamp and are ordered by topic, partition and offset;
    # a few stored past the years results show (a store from before the timestamp rule)
    timestamp = rng.choice([BASE + rng.randint(0, 60) * 1000] * 60 + [MAX_TIMESTAMP_MS + 5, MIN_TIMESTAMP_MS - 5])
    return MessageRecord(topic=rng.choice(topics), partition=rng.randint(0, 3), offset=offset,
                         timestamp_ms=timestamp, key=key, keys=keys,
                         commit_log_offset=rng.choice([-1, offset * 100]), size=rng.choice([-1, 123, 7_000]))


@pytest.fixture(scope="module", params=[SETTINGS.segment_bytes, 16 << 10], ids=["one segment", "many segments"])
def filled(tmp_path_factory, request):
    """A local store of ~2,500 records in 12 appends (a few timestamps outside the rule), each
    batch of one of TOPIC_SETS (one small one of COLLIDING_TOPICS), about 3% of records carrying
    keys the C path declines; and its model. (Keys collide in a hash slot only where their Java
    hashes do: COLLIDING_KEYS.) In one log segment, or in many: a key's records then come from
    several segments, each numbering its own topics."""
    rng = random.Random(11)
    model = ShardModel("b")
    root = tmp_path_factory.mktemp("result-rows")
    settings = dataclasses.replace(SETTINGS, segment_bytes=request.param)
    with pytest.MonkeyPatch.context() as monkeypatch, open_store(root, create=True, settings=settings) as store, \
            store.writer("b") as writer:
        accept_any_timestamp(monkeypatch)
        offset = 0
        for batch_number in range(12):
            if batch_number == 5:  # colliding topics, colliding keys: those keys' lookups decline
                batch = [_record(rng, offset + i, COLLIDING_TOPICS, 0, COLLIDING_KEYS) for i in range(30)]
            else:
                topics = TOPIC_SETS[batch_number % len(TOPIC_SETS)]
                batch = [_record(rng, offset + i, topics, 0.03) for i in range(rng.choice([1, 40, 300, 512]))]
            offset += len(batch)
            writer.append(batch)
            model.append(batch)
    segments = len(list(root.glob("broker=b/log/*.log")))
    assert (segments == 1) == (request.param == SETTINGS.segment_bytes), segments
    return root, model


def _lookups(rng: random.Random, count: int) -> list[dict]:
    keys = ASCII_KEYS + DECLINED_KEYS + ["BB"]
    lookups = [{"keys": [key]} for key in keys]
    for _ in range(count):
        lookups.append({"keys": rng.sample(keys, rng.randint(1, 2)),
                        "topic": rng.choice([None, "orders", "payments", "audit", "Aa", "BB"]),
                        "begin_ms": rng.choice([None, BASE + rng.randint(0, 40) * 1000]),
                        "end_ms": rng.choice([None, BASE + rng.randint(20, 70) * 1000]),
                        "partitions": rng.choice([None, [0], [1, 3]]),
                        "max_results": rng.choice([None, 0, 1, 17])})
    return lookups


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=COMPILED), False], ids=["compiled rows", "rows in Python"])
def test_lookups_answer_like_the_model(filled, compiled, monkeypatch):
    root, model = filled
    patch_few_candidates(monkeypatch, 10**9)  # every lookup record by record: the path these serve
    if not compiled:
        monkeypatch.setattr(verified_reads, "compiled_rows", None)
    with open_store(root) as store:
        for lookup in _lookups(random.Random(3), 150):
            keys = lookup.pop("keys")
            expected = [(shown_timestamp(row[0]), *row[1:]) for row in model_lookup([model], keys, **lookup)]
            assert table_rows(store.lookup(keys, **lookup)) == expected, (keys, lookup)


@COMPILED
def test_compiled_rows_are_plain_few_s(filled, monkeypatch):
    """Every answer of the C path is _plain_few's on the same records, table for table, and it
    declines exactly where _plain_few does. Both answer often enough here, and decline often
    enough, for the comparison to mean something."""
    root, _model = filled
    patch_few_candidates(monkeypatch, 10**9)
    counts = {"answered": 0, "declined": 0, "empty": 0}
    compiled_few = VerifiedReads._compiled_few

    def compared(self, grouped, packed, wanted, begin_ms, end_ms, partitions, max_results):
        got = compiled_few(self, grouped, packed, wanted, begin_ms, end_ms, partitions, max_results)
        raw = packed.raw()
        oracle = None
        if raw.texts_are_keys and not raw.backslash:
            oracle = self._plain_few(grouped.seqs.tolist(), grouped.as_dict(), raw, wanted, begin_ms, end_ms, partitions,
                                     max_results)
        if got is None:
            counts["declined"] += 1
            assert oracle is None
        else:
            counts["answered"] += 1
            counts["empty"] += not got.num_rows
            assert oracle is not None and got.equals(oracle), (got.to_pylist(), oracle and oracle.to_pylist())
        return got

    monkeypatch.setattr(VerifiedReads, "_compiled_few", compared)
    with open_store(root) as store:
        for lookup in _lookups(random.Random(4), 200):
            store.lookup(lookup.pop("keys"), **lookup)
    assert counts["answered"] > 50 and counts["declined"] > 20 and counts["empty"] > 5, counts


@COMPILED
def test_a_batch_the_import_did_not_take_is_freed(filled, monkeypatch):
    """The capsule plain_rows returns frees the rows when nothing imports them (a lookup that
    fails between the two): no leak, no crash, and the next lookup answers."""
    root, model = filled
    patch_few_candidates(monkeypatch, 10**9)
    answers = []
    original = verified_reads.compiled_rows.plain_rows
    monkeypatch.setattr(verified_reads.compiled_rows, "plain_rows",
                        lambda *args: answers.append(original(*args)) or None)  # kept, never imported
    with open_store(root) as store:
        assert table_rows(store.lookup("k2", topic="orders")) == \
            [(shown_timestamp(row[0]), *row[1:]) for row in model_lookup([model], ["k2"], topic="orders")]
    assert answers and answers[0] is not None and answers[0][2] > 0
    answers.clear()  # the capsules go: their rows are freed


@COMPILED
@pytest.mark.parametrize("bounds", [{"max_results": 2**63}, {"max_results": 2**64}, {"partitions": [2**63]},
                                    {"partitions": [-(2**63) - 1, 1]}, {"partitions": []}], ids=str)
def test_bounds_past_int64_answer_as_in_python(filled, bounds, monkeypatch):
    """A limit or partition number no int64 holds selects what Python's comparisons select (no
    limit; no record of that partition), not an OverflowError from the compiled path."""
    root, _model = filled
    patch_few_candidates(monkeypatch, 10**9)
    with open_store(root) as store:
        compiled = table_rows(store.lookup("k1", topic="orders", **bounds))
        monkeypatch.setattr(verified_reads, "compiled_rows", None)
        assert compiled == table_rows(store.lookup("k1", topic="orders", **bounds))
    assert bool(compiled) == (bounds.get("partitions") != [2**63] and bounds.get("partitions") != [])
