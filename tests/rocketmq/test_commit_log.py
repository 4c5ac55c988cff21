"""The commit-log reader against bytes RocketMQ's own message store wrote (v1 and v2 magic codes,
IPv4 and IPv6 hosts, every codec, blank end-of-file markers, many small files), and against
damaged copies of them: every damage is a CorruptFileError naming the file and offset."""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from msgindex.errors import CorruptFileError, InvalidOptionError, StoreNotFoundError
from msgindex.storage.hash_index.index_file import FIRST_INDEX
from msgindex.storage.rocketmq import commit_log as cl
from msgindex.storage.rocketmq.broker_store import open_rocketmq
from msgindex.storage.rocketmq.commit_log import CommitLog, RecordKind, parse_properties
from msgindex.storage.rocketmq.message_keys import keys_tokens, message_keys
from tests.rocketmq.conftest import LONG_TOPIC, WRITER_HASH_SLOT_NUM, WRITER_INDEX_NUM


def open_written(root, **kwargs):
    return open_rocketmq(root, hash_slot_num=WRITER_HASH_SLOT_NUM, index_num=WRITER_INDEX_NUM, **kwargs)


def expected_keys(spec) -> tuple[str, ...]:
    tokens = [t for t in spec["properties"].get("KEYS", "").split(" ") if t]
    return tuple(dict.fromkeys(tokens + [spec["properties"]["UNIQ_KEY"]]))


def test_every_message_reads_as_written(written_store):
    log = CommitLog(written_store.root / "commitlog")
    assert len(log.files) >= 5, "the store should roll several commit-log files"
    for spec, written in zip(written_store.specs, written_store.written):
        message = log.read_message(written["offset"], with_body=True)
        assert (message.size, message.store_timestamp, message.queue_offset) == \
            (written["size"], written["storeTimestamp"], written["queueOffset"])
        assert message.topic == spec["topic"] and message.queue_id == spec["queueId"]
        assert message.magic == (cl.MAGIC_V2 if spec["topic"] == LONG_TOPIC else cl.MAGIC_V1)
        assert message.born_host == ("[::1]:10911" if spec["bornV6"] else "127.0.0.1:10911")
        assert message.store_host == ("[::1]:10911" if spec["storeV6"] else "127.0.0.1:10911")
        assert message.decoded_body() == base64.b64decode(spec["bodyB64"])
        assert (cl.compression_of(message.sys_flag) is None) == (spec["compress"] is None)
        assert message.properties == spec["properties"]
        assert message.keys == expected_keys(spec)
    log.close()


def test_iteration_hops_blank_markers_and_stops_at_the_end(written_store):
    with CommitLog(written_store.root / "commitlog") as log:
        records = list(log.iter_offsets(0))
        assert [o for o, k in records if k is RecordKind.MESSAGE] == [w["offset"] for w in written_store.written]
        assert records[-1][1] is RecordKind.END
        # every file but the newest ends in a blank marker
        blanks = [f for f in log.files[:-1]
                  if any(log.kind_at(o) is RecordKind.BLANK for o in [_last_record_end(log, f)])]
        assert len(blanks) == len(log.files) - 1


def _last_record_end(log, file):
    offsets = [o for o, k in log.iter_offsets(file.start, file.end) if k is RecordKind.MESSAGE]
    return offsets[-1] + log.read_message(offsets[-1]).size


def test_small_windows_and_pread_fallback_read_the_same(written_store):
    """Windows far smaller than the records, two open at a time, and records bigger than the
    overlap (read with pread) give the same messages."""
    with CommitLog(written_store.root / "commitlog") as big, \
            CommitLog(written_store.root / "commitlog", window_bytes=4096, open_windows=2, window_overlap=256) as small:
        for written in written_store.written:
            assert small.read_message(written["offset"], with_body=True) == big.read_message(written["offset"], with_body=True)
        assert len(small._windows) <= 2


def test_lookups_are_verified_against_the_store_writer(written_store):
    specs, written = written_store.specs, written_store.written
    with open_written(written_store.root) as store:
        for topic in ("Aa", "BB", LONG_TOPIC):
            for key in ["w1", "w5", "n10", "n15", "UNIQ000020", "nothing"]:
                expected = {w["offset"] for s, w in zip(specs, written)
                            if s["topic"] == topic and key in expected_keys(s)}
                rows = store.lookup(key, topic=topic)
                assert set(rows["commit_log_offset"].to_pylist()) == expected, (topic, key)
                assert rows["commit_log_offset"].to_pylist() == sorted(expected)  # store-time order, no duplicates


def test_scalar_oracle_agrees_with_the_vectorized_lookup(written_store):
    """The oracle walks each file with RocketMQ's own selectPhyOffset (no cap, no early stop) and
    reads every hit; the lookup must find exactly the hits that verify."""
    with open_written(written_store.root) as store:
        for topic, key in [("Aa", "w1"), ("BB", "w1"), (LONG_TOPIC, "w0"), ("Aa", "n33")]:
            hits = {phy for index in store.index_files()
                    for phy in index.select_phy_offsets(f"{topic}#{key}", 1 << 30, 0, (1 << 63) - 1)}
            verified = {phy for phy in hits
                        if (m := store.commit_log.read_message(phy)).topic == topic and key in m.keys}
            assert set(store.lookup(key, topic=topic)["commit_log_offset"].to_pylist()) == verified
            if key == "w1":  # "Aa#w1" and "BB#w1" collide: the raw hits hold the other topic too
                assert hits - verified


def test_windows_are_exact_to_the_millisecond(written_store):
    specs, written = written_store.specs, written_store.written
    stamps = sorted({w["storeTimestamp"] for w in written})
    with open_written(written_store.root) as store:
        for begin, end in [(stamps[10], stamps[40]), (stamps[10] + 1, stamps[40] - 1),
                           (stamps[0], stamps[0]), (stamps[-5] + 1, stamps[-1])]:
            for topic, key in [("Aa", "w1"), ("BB", "w2"), (LONG_TOPIC, "w5")]:
                expected = {w["offset"] for s, w in zip(specs, written) if s["topic"] == topic
                            and key in expected_keys(s) and begin <= w["storeTimestamp"] <= end}
                got = store.lookup(key, topic=topic, begin_ms=begin, end_ms=end)
                assert set(got["commit_log_offset"].to_pylist()) == expected
            scanned = [o for b in store.scan(begin_ms=begin, end_ms=end) for o in b["commit_log_offset"].to_pylist()]
            assert scanned == [w["offset"] for w in written if begin <= w["storeTimestamp"] <= end]


def test_first_entry_of_a_file_that_inherited_its_begin_time(written_store):
    """After a pause, a new index file's first entry is stored as a diff against the previous
    file's end but read against its own begin: its index time is later than the message's store
    time. A window ending at that store time must still find it."""
    with open_written(written_store.root) as store:
        late = []
        for index in store.index_files():
            entries = index.entry_array()
            if index.entry_count and entries["time_diff"][FIRST_INDEX] > 0:
                late.append((index, int(entries["phy_offset"][FIRST_INDEX])))
        assert late, "the writer's pauses should produce such files"
        for index, phy in late:
            message = store.commit_log.read_message(phy)
            assert index.begin_timestamp + int(index.entry_array()["time_diff"][FIRST_INDEX]) * 1000 > message.store_timestamp
            key = message.keys[0]
            got = store.lookup(key, topic=message.topic, begin_ms=message.store_timestamp, end_ms=message.store_timestamp)
            assert got["commit_log_offset"].to_pylist() == [phy]


def test_fetch_values_and_rows(written_store):
    spec, written = written_store.specs[8], written_store.written[8]
    with open_written(written_store.root, broker_name="b1") as store:
        rows = store.lookup(spec["properties"]["UNIQ_KEY"], topic=spec["topic"], fetch_values=True).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert row["broker"] == "b1" and row["verified"] and row["size"] == written["size"]
    assert row["value"] == base64.b64decode(spec["bodyB64"])
    assert dict(row["properties"]) == spec["properties"]
    assert row["key"] == spec["properties"]["KEYS"].split(" ")[0]
    with open_written(written_store.root) as store:
        assert store.broker_name == "store-w"  # the store directory's name


# ----------------------------------------------------------------------------- damage
def _message_file_position(root, offset):
    with CommitLog(root / "commitlog") as log:
        file = log.file_at(offset)
        return file.path, offset - file.start


def _patch(path, position, data: bytes):
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def test_truncated_commit_log_file_is_named(written_store, tmp_path):
    root = written_store.copy(tmp_path)
    newest = sorted((root / "commitlog").iterdir())[-1]
    os.truncate(newest, 1000)
    with pytest.raises(CorruptFileError, match=f"{newest.name}: 1000 bytes.*same size"):
        open_written(root)


def test_torn_message_past_the_end_of_a_single_file(written_store, tmp_path):
    root = written_store.copy(tmp_path)
    files = sorted((root / "commitlog").iterdir())
    for extra in files[1:]:
        extra.unlink()
    offset = written_store.written[3]["offset"]
    path, position = _message_file_position(root, offset)
    os.truncate(path, position + 50)  # the file now ends inside the message
    with CommitLog(root / "commitlog") as log:
        with pytest.raises(CorruptFileError, match=f"{path}.*offset {offset}.*torn or truncated"):
            log.read_message(offset)
        with pytest.raises(CorruptFileError, match=f"offset {offset}"):
            list(log.iter_offsets(0))


@pytest.mark.parametrize("damage, message", [
    ("magic", "wrong magic code 0x12345678 at offset"),
    ("total", "TOTALSIZE 1000000 is impossible"),
    ("physical", "the record says it is at offset 7"),
    ("properties_end", "does not end with"),
    ("properties_utf8", "not UTF-8"),
    ("body_length", "BODYLEN"),
])
def test_damaged_message_is_a_clear_error(written_store, tmp_path, damage, message):
    root = written_store.copy(tmp_path)
    index = 7
    spec, written = written_store.specs[index], written_store.written[index]
    offset, size = written["offset"], written["size"]
    path, position = _message_file_position(root, offset)
    if damage == "magic":
        _patch(path, position + 4, struct.pack(">I", 0x12345678))
    elif damage == "total":
        _patch(path, position, struct.pack(">i", 1_000_000))
    elif damage == "physical":
        _patch(path, position + 28, struct.pack(">q", 7))
    elif damage == "properties_end":
        _patch(path, position + size - 1, b"x")
    elif damage == "properties_utf8":
        _patch(path, position + size - 3, b"\xff")
    elif damage == "body_length":
        body_position = 48 + (20 if spec["bornV6"] else 8) + 8 + (20 if spec["storeV6"] else 8) + 12
        _patch(path, position + body_position, struct.pack(">i", size))
    with open_written(root) as store:
        with pytest.raises(CorruptFileError, match=message) as raised:
            store.commit_log.read_message(offset)
        assert str(path) in str(raised.value) and str(offset) in str(raised.value)
        # a lookup that meets the damaged message fails the same way: never a wrong row
        with pytest.raises(CorruptFileError, match=message):
            store.lookup(spec["properties"]["UNIQ_KEY"], topic=spec["topic"])
    done = subprocess.run(
        [str(Path(sys.executable).with_name("msgindex")), "lookup", str(root), "--mode", "rocketmq", "--key",
         spec["properties"]["UNIQ_KEY"], "--topic", spec["topic"], "--hash-slot-num", str(WRITER_HASH_SLOT_NUM),
         "--index-num", str(WRITER_INDEX_NUM)], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and str(offset) in done.stderr


def test_offsets_that_are_not_messages(written_store):
    with CommitLog(written_store.root / "commitlog") as log:
        with pytest.raises(CorruptFileError, match="is in no file"):
            log.read_message(log.end_offset + 10)
        blank = _last_record_end(log, log.files[0])
        with pytest.raises(CorruptFileError, match="blank end-of-file marker, not a message"):
            log.read_message(blank)
        end = [o for o, k in log.iter_offsets(0) if k is RecordKind.END][0]
        with pytest.raises(CorruptFileError, match="past the last message"):
            log.read_message(end)


def test_not_a_store_and_wrong_sizing(written_store, tmp_path):
    with pytest.raises(StoreNotFoundError, match="not a RocketMQ broker store root"):
        open_rocketmq(tmp_path)
    with pytest.raises(InvalidOptionError, match="hashSlotNum' = 5000000.*broker used"):
        open_rocketmq(written_store.root).lookup("w1", topic="Aa")


# ----------------------------------------------------------------------------- rules
def test_properties_follow_javas_decoder():
    where = "m"
    assert parse_properties(b"", where=where) == {}
    assert parse_properties(b"KEYS\x01a b\x02XKEYS\x01c\x02", where=where) == {"KEYS": "a b", "XKEYS": "c"}
    # Java skips pairs with an empty name or value, and a later pair of the same name wins
    assert parse_properties(b"\x01v\x02TAGS\x01\x02n\x01one\x02n\x01two\x02", where=where) == {"n": "two"}
    assert parse_properties("k\x01ключ\x01x\x02".encode(), where=where) == {"k": "ключ\x01x"}
    with pytest.raises(CorruptFileError, match="has no \\\\x01"):
        parse_properties(b"KEYS\x02", where=where)


def test_the_key_rule():
    assert keys_tokens(" a  b\tc \u3000d a ") == ["a", "b\tc", "\u3000d", "a"]
    assert keys_tokens(None) == [] and keys_tokens("") == []
    assert message_keys(None, [" a  b a"], ["U1"]) == ("a", "b", "U1")
    assert message_keys("p", ["a p"], [None, ""]) == ("p", "a")


def test_many_keys_in_one_call_equal_one_by_one(written_store):
    """More keys than SCALAR_WALK_MAX_KEYS take the numpy paths (vectorized hashing, lock-step
    chain walk); the result must be the union of the one-key (scalar) lookups."""
    from msgindex.storage.rocketmq.broker_store import SCALAR_WALK_MAX_KEYS

    keys = [f"w{i}" for i in range(13)] + [f"n{i}" for i in range(0, 300, 7)]
    assert len(keys) > SCALAR_WALK_MAX_KEYS
    with open_written(written_store.root) as store:
        for topic in ("Aa", "BB", LONG_TOPIC):
            one_by_one = set()
            for key in keys:
                one_by_one.update(store.lookup(key, topic=topic)["commit_log_offset"].to_pylist())
            together = store.lookup(keys, topic=topic)["commit_log_offset"].to_pylist()
            assert len(together) == len(set(together)) and set(together) == one_by_one
