"""Field values (storage/fields.py) on both kinds of store: stored beside the keys, found by the
verified lookup like keys, never confused with a key either way, exactly once by offsets, and
the coverage of each field committed with the data and warned about when a lookup exceeds it."""

from __future__ import annotations

import random
import warnings

import pyarrow as pa
import pytest

from msgindex.cli import main
from msgindex.errors import FieldCoverageWarning, InvalidAppendError, InvalidOptionError
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.maintenance.inspect import inspect_path
from msgindex.storage.message import APPEND_SCHEMA, FIELDS_COLUMN, MessageRecord, decode_key_bytes
from msgindex.storage.query import Query
from tests.storage.kinds import patch_few_candidates
from tests.storage.shard_model import TINY

BASE = 1_700_000_000_000
ORDER = FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.order.id')", "single")
SKU = FieldDefinition("sku", "expression", "from_json(CAST(value AS STRING), 'struct<s:array<string>>').s", "array")
TOPICS = ("orders", "refunds")


def _records(rng: random.Random, topic: str, offsets: range) -> list[MessageRecord]:
    """Records whose keys and field values overlap on purpose: a key "o-3" beside field value
    "o-3", keys spelled like field terms and hash strings, repeated and absent values."""
    records = []
    for offset in offsets:
        order = f"o-{rng.randrange(12)}"
        skus = rng.sample(["a", "b", "c", "o-3", "orders#o-1"], rng.randrange(4))
        key = rng.choice([f"k{offset}", "o-3", "order=o-1", f"{topic}\x00order\x00o-1", "\x00order\x00o-2", None])
        keys = () if key is None else (key,)
        fields = ((("order", order),) if rng.random() < 0.8 else ()) + tuple(("sku", s) for s in skus)
        records.append(MessageRecord(topic, offset % 3, offset, BASE + offset, key, keys, fields=fields))
    return records


def _found(table: pa.Table) -> set[tuple[str, int, int]]:
    return {(r["topic"], r["partition"], r["offset"]) for r in table.select(["topic", "partition", "offset"]).to_pylist()}


def _truth(records, name: str, values: set[str], *, topic=None, begin=None, end=None) -> set[tuple[str, int, int]]:
    return {(r.topic, r.partition, r.offset) for r in records
            if any(n == name and v in values for n, v in r.fields)
            and (topic is None or r.topic == topic) and (begin is None or r.timestamp_ms >= begin)
            and (end is None or r.timestamp_ms <= end)}


@pytest.mark.parametrize("few", [0, 10_000], ids=["vectorized", "record-by-record"])
def test_field_values_are_found_verified_and_never_taken_for_keys(stores, monkeypatch, few):
    patch_few_candidates(monkeypatch, few)
    rng = random.Random(22)
    written = []
    with stores.create(settings=TINY) as store:  # tiny hash tables: slots shared by many strings
        for broker, topic in zip(("b0", "b1"), TOPICS):
            with store.writer(broker) as writer:
                for start in range(0, 300, 100):
                    batch = _records(rng, topic, range(start, start + 100))
                    writer.append(batch, fields=[ORDER, SKU])
                    written += batch
    with stores.open() as store, warnings.catch_warnings():
        warnings.simplefilter("error", FieldCoverageWarning)  # every offset is covered: no warning
        for values in ({"o-3"}, {"o-1", "o-7"}, {"nothing"}):
            assert _found(store.lookup(fields={"order": sorted(values)})) == _truth(written, "order", values)
        assert _found(store.lookup(fields={"sku": "o-3"})) == _truth(written, "sku", {"o-3"})
        assert _found(store.lookup(fields={"sku": "orders#o-1"})) == _truth(written, "sku", {"orders#o-1"})
        # exact millisecond windows and topics, names matched case-insensitively
        query = Query.of(fields={"ORDER": ["o-5"]}, topic="refunds", begin_ms=BASE + 57, end_ms=BASE + 211)
        assert _found(store.lookup(query)) == _truth(written, "order", {"o-5"}, topic="refunds", begin=BASE + 57,
                                                     end=BASE + 211)
        # keys and fields in one lookup: a record carrying either
        both = _found(store.lookup(Query.of(["k7"], fields={"order": "o-2"})))
        assert both == _truth(written, "order", {"o-2"}) | {(r.topic, r.partition, r.offset) for r in written
                                                           if "k7" in r.keys}
        # a key never finds a field value, a field value never a key
        for key in ("o-3", "order=o-1", "orders\x00order\x00o-1", "\x00order\x00o-2", "a"):
            assert _found(store.lookup(key)) == {(r.topic, r.partition, r.offset) for r in written if key in r.keys}
        assert _found(store.lookup(fields={"order": "k7"})) == set()
        assert _found(store.lookup(fields={"order": "order=o-1"})) == set()
        # the keys column shows keys only
        rows = store.lookup(fields={"sku": ["a", "b", "c"]})
        shown = {(r["topic"], r["offset"]): tuple(r["keys"]) for r in rows.select(["topic", "offset", "keys"]).to_pylist()}
        assert shown and shown == {(r.topic, r.offset): r.keys for r in written
                                   if any(n == "sku" and v in "abc" for n, v in r.fields)}
        scanned = [tuple(k) for b in store.scan() for k in b.column("keys").to_pylist()]
        assert sorted(scanned) == sorted(r.keys for r in written)
    # every hash entry points at a record carrying a key or field value of its hash
    assert main(["inspect", *stores.cli_args(stores.root())], ) == 0


def test_coverage_is_committed_with_the_data_and_lookups_beyond_it_warn(stores):
    rng = random.Random(7)
    with stores.create() as store, store.writer("b0") as writer:
        before = _records(rng, "orders", range(0, 50))
        writer.append([MessageRecord(r.topic, r.partition, r.offset, r.timestamp_ms, r.key, r.keys) for r in before])
        after = _records(rng, "orders", range(50, 120))
        writer.append(after, fields=[ORDER])
        # a replay of offsets already held is skipped, and does not make the field cover them
        assert writer.append(before, fields=[ORDER]).appended == 0
        # a field keeps its definition: redefined, the append is refused before anything is written
        with pytest.raises(InvalidOptionError, match="field 'order'"):
            writer.append(_records(rng, "orders", range(120, 130)),
                          fields=[FieldDefinition("order", "header", "order-id", "array")])
    with stores.open() as store:
        with pytest.warns(FieldCoverageWarning, match=r"field 'order' does not cover orders-[012] offsets \[0, 4"):
            found = store.lookup(fields={"order": "o-3"})
        assert _found(found) == _truth(after, "order", {"o-3"})  # what it covers, found
        with pytest.warns(FieldCoverageWarning, match="the shard does not index that field"):
            store.lookup(fields={"color": "red"})
        with warnings.catch_warnings():
            warnings.simplefilter("error", FieldCoverageWarning)
            store.lookup(["k1"])  # key lookups never warn
        with store.reader("b0") as reader:
            coverage = reader.field_coverage
        assert [f.name for f in coverage.fields] == ["order"] and coverage.get("ORDER").definition == ORDER
        with pytest.warns(FieldCoverageWarning):  # (the window does not narrow what the field misses)
            assert store.lookup(fields={"order": "o-1"}, begin_ms=BASE + 200).num_rows == 0
        assert store.brokers() == ["b0"]
    # inspect shows each shard's fields: definitions and the offsets each covers
    [shard] = inspect_path(stores.root(), storage_options=stores.options)["shards"]
    assert shard["fields"]["order"]["ranges"]["orders"]["0"] == [[51, 118]]  # after's offsets of orders-0
    assert {k: v for k, v in shard["fields"]["order"].items() if k != "ranges"} == ORDER.to_json()
    with stores.open() as store, store.writer("b0") as writer:  # a new job with a second field
        more = _records(rng, "orders", range(120, 150))
        writer.append(more, fields=[ORDER, SKU])
    with stores.open() as store:
        with pytest.warns(FieldCoverageWarning, match=r"field 'sku' does not cover orders-0 offsets \[0, 49\), \[51, 118\)"):
            # (`after` carried sku values too: indexed, found, though the field does not cover them)
            assert _found(store.lookup(fields={"sku": "c"})) == _truth(after + more, "sku", {"c"})


def test_arrow_appends_carry_fields_and_bad_ones_are_refused(stores):
    def table(fields: list) -> pa.Table:
        n = len(fields)
        columns = {"topic": ["t"] * n, "partition": [0] * n, "offset": list(range(n)),
                   "timestamp_ms": [BASE + i for i in range(n)], "key": [None] * n, "keys": [[]] * n,
                   "commit_log_offset": [-1] * n, "size": [-1] * n}
        schema = pa.schema([*APPEND_SCHEMA, FIELDS_COLUMN])
        return pa.table({**columns, "fields": fields}, schema=schema)

    pairs = [[{"name": "order", "value": "o-1"}, {"name": "sku", "value": "x"}], None, [],
             [{"name": "order", "value": "o-1"}]]
    with stores.create() as store, store.writer("b0") as writer:
        writer.append(table(pairs), fields=[ORDER, SKU])
        for bad, message in ([{"name": "order", "value": ""}], "a field value is empty"), \
                ([{"name": "or\x00der", "value": "v"}], "holds no NUL"):
            with pytest.raises(InvalidAppendError, match=f"record 0 of the batch.*{message}"):
                writer.append(table([bad]).set_column(2, "offset", pa.array([9])), fields=[ORDER])
    with stores.open() as store:
        assert sorted(store.lookup(fields={"order": "o-1"}).column("offset").to_pylist()) == [0, 3]
        assert store.lookup(fields={"sku": "x"}).column("offset").to_pylist() == [0]
        assert store.scan().__next__().num_rows == 4


def test_appends_that_could_never_be_found_as_written_are_refused(stores):
    """Found by an attack run: a value under another spelling of a declared field (lookups ask
    for the declared one: never found), two definitions of one field in one append (one replaced
    the other silently), two values of a single-valued field (its column showed one): each is
    refused before anything is written, naming the record and the field, from Python records and
    from Arrow alike."""
    def record(offset: int, fields: tuple) -> MessageRecord:
        return MessageRecord("t", 0, offset, BASE + offset, f"k{offset}", (f"k{offset}",), fields=fields)

    header_order = FieldDefinition("ORDER", "header", "order-id", "array")
    as_arrow = pa.table({**{name: [value] for name, value in zip(
        ["topic", "partition", "offset", "timestamp_ms", "key", "keys", "commit_log_offset", "size"],
        ["t", 0, 2, BASE + 2, None, [], -1, -1])}, "fields": [[{"name": "order", "value": "a"},
                                                               {"name": "order", "value": "b"}]]},
        schema=pa.schema([*APPEND_SCHEMA, FIELDS_COLUMN]))
    with stores.create() as store, store.writer("b0") as writer:
        with pytest.raises(InvalidAppendError, match=r"record 1 \(t-0 offset 1\) carries field 'Order', which the "
                                                     r"append declares as 'order'"):
            writer.append([record(0, (("order", "a"),)), record(1, (("Order", "b"),))], fields=[ORDER])
        with pytest.raises(InvalidOptionError, match="fields 'order' and 'ORDER' differ only in case"):
            writer.append([record(0, (("order", "a"),))], fields=[ORDER, header_order])
        with pytest.raises(InvalidAppendError, match=r"record 0 \(t-0 offset 0\) carries two values of field 'order'"):
            writer.append([record(0, (("order", "a"), ("order", "b")))], fields=[ORDER])
        with pytest.raises(InvalidAppendError, match=r"record 0 \(t-0 offset 2\) carries two values of field 'order'"):
            writer.append(as_arrow, fields=[ORDER])
        with pytest.raises(InvalidAppendError, match="a fields item must be a \\(name, value\\) pair"):
            writer.append([record(0, ("order", "a"))], fields=[ORDER])  # (not pairs: the append's own check)
        writer.append([record(0, (("sku", "a"), ("sku", "b")))], fields=[SKU])  # an array field holds several
    with stores.open() as store:
        assert store.lookup(fields={"sku": "b"}).column("offset").to_pylist() == [0]
        assert store.scan().__next__().num_rows == 1  # nothing of the refused appends


def _shown_fields(record: MessageRecord) -> tuple[str | None, list[str] | None]:
    """(order, sku) as rows show a record's fields (the scalar oracle of batch_format.field_columns)."""
    orders = [value for name, value in record.fields if name == "order"]
    skus = [value for name, value in record.fields if name == "sku"]
    return (orders[0] if orders else None), (skus or None)


@pytest.mark.parametrize("few", [0, 10_000], ids=["vectorized", "record-by-record"])
def test_rows_show_the_fields_asked_as_columns(stores, monkeypatch, few):
    patch_few_candidates(monkeypatch, few)
    rng = random.Random(7)
    early = _records(rng, "orders", range(0, 50))
    later = _records(rng, "orders", range(50, 250))
    with stores.create(settings=TINY) as store, store.writer("b0") as writer:
        writer.append([MessageRecord(r.topic, r.partition, r.offset, r.timestamp_ms, r.key, r.keys) for r in early])
        writer.append(later, fields=[ORDER, SKU])
    expected = {r.offset: (None, None) for r in early} | {r.offset: _shown_fields(r) for r in later}
    columns = [("order", "single"), ("SKU", "array"), ("absent", "array")]  # names as asked, any case

    def shown(table) -> dict[int, tuple]:
        assert table.schema.names[-3:] == ["order", "SKU", "absent"]
        assert table.column("absent").null_count == table.num_rows
        return {r["offset"]: (r["order"], r["SKU"]) for r in table.select(["offset", "order", "SKU"]).to_pylist()}

    with stores.open() as store, warnings.catch_warnings():
        warnings.simplefilter("ignore", FieldCoverageWarning)
        scanned = pa.Table.from_batches(list(store.scan(Query.of(field_columns=columns))))
        assert shown(scanned) == expected
        for query in (Query.of(fields={"sku": ["a", "o-3"]}, field_columns=columns),
                      Query.of(["o-3", "k9"], field_columns=columns)):
            found = store.lookup(query)
            assert found.num_rows and shown(found) == {offset: expected[offset] for offset in found["offset"].to_pylist()}
        nothing = store.lookup(Query.of(["no-such-key"], field_columns=columns))
        assert nothing.num_rows == 0


def test_field_values_beside_keys_that_are_not_utf8(stores):
    """A batch's index strings are Arrow strings when its field terms' hash strings are UTF-8,
    and Python strs when a key holds lone surrogates (undecodable key bytes): both found."""
    odd = decode_key_bytes(b"k\xff")
    records = [MessageRecord("orders", 0, n, BASE + n, odd if n % 2 else f"k{n}", (odd,) if n % 2 else (f"k{n}",),
                             fields=(("order", f"o-{n % 3}"),)) for n in range(12)]
    with stores.create() as store, store.writer("b0") as writer:
        writer.append(records[:6], fields=[ORDER])  # one with the odd key
        writer.append([r for r in records[6:] if r.offset % 2 == 0], fields=[ORDER])  # UTF-8 only
    with stores.open() as store:
        for value in ("o-0", "o-1", "o-2"):
            found = _found(store.lookup(fields={"order": value}))
            wanted = {r for r in records[:6] + [r for r in records[6:] if r.offset % 2 == 0]
                      if r.fields[0][1] == value}
            assert found == {(r.topic, r.partition, r.offset) for r in wanted}
        assert sorted(store.lookup(b"k\xff").column("offset").to_pylist()) == [1, 3, 5]


def test_settled_offsets_close_gaps_and_fields_cover_only_those_holding_no_record(stores):
    """``settled`` (the pipeline's completed micro-batches: completed_batches.py) commits offsets
    no slice of rows holds: a transaction's commit marker at the end of a batch, aborted records.
    A field declared by the append covers the settled offsets the shard did not hold (no record
    of it is there), never records committed without the field."""
    from msgindex.storage.source_ranges import SourceRanges

    def record(offset: int, order: str | None = None) -> MessageRecord:
        return MessageRecord("orders", 0, offset, BASE + offset, f"k{offset}", (f"k{offset}",),
                             fields=() if order is None else (("order", order),))

    with stores.create() as store, store.writer("b0") as writer:
        writer.append([record(0), record(1), record(2)])  # offset 3: a commit marker, in no slice
        writer.append([record(4, "o-1"), record(5, "o-2")], fields=[ORDER],
                      settled=SourceRanges({("orders", 0): ((0, 4),)}))
        # all rows of a replay held, the settled offsets are still committed (an append of no new record)
        assert writer.append([record(7, "o-1")], fields=[ORDER], settled=SourceRanges({("orders", 0): ((4, 7),)})).appended == 1
    with stores.open() as store, store.reader("b0") as reader:
        assert reader.committed_ranges.ranges == {("orders", 0): ((0, 8),)}
        with pytest.warns(FieldCoverageWarning, match=r"field 'order' does not cover orders-0 offsets \[0, 3\) \(committed"):
            assert _found(store.lookup(fields={"order": "o-1"})) == {("orders", 0, 4), ("orders", 0, 7)}
