"""Interop with Kafka's real OffsetIndex / TimeIndex (kafka-storage 4.3.1 from Maven Central).

Every scenario is prepared first, then ONE JVM runs all of Kafka's side (tests/interop/java/kafka
harness): Kafka writes index files msgindex must read, and reads the files msgindex wrote.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from msgindex.errors import CorruptFileError, IndexFullError, InvalidAppendError, ToolMissingError
from msgindex.jvm import compile_java, java_command, stage_jars
from msgindex.storage.log.metadata_log import MetadataLog
from msgindex.storage.log.sparse_index import OffsetIndex, TimeIndex
from msgindex.storage.message import MessageRecord

KAFKA_STORAGE = ["org.apache.kafka:kafka-storage:4.3.1"]
HARNESS = Path(__file__).parent / "java" / "kafka"
MAX_INDEX = 10 * 1024 * 1024


@dataclass
class Scenario:
    """Commands for the harness, and what each answer is called."""

    directory: Path
    commands: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def add(self, name: str, *words: object) -> None:
        self.names.append(name)
        self.commands.append(" ".join(map(str, words)))

    def path(self, name: str) -> Path:
        return self.directory / name


def _increasing_pairs(count: int, seed: int, start: int, first_step: tuple[int, int],
                     second_step: tuple[int, int]) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    first, second, pairs = start, 0, []
    for _ in range(count):
        first += rng.randint(*first_step)
        second += rng.randint(*second_step)
        pairs.append((first, second))
    return pairs


def _offset_entries(count: int, seed: int) -> list[tuple[int, int]]:
    """(relative offset, position), both strictly increasing."""
    return _increasing_pairs(count, seed, 0, (1, 40), (1, 5000))


def _time_entries(count: int, seed: int) -> list[tuple[int, int]]:
    """(timestamp strictly increasing, relative offset non-decreasing)."""
    return _increasing_pairs(count, seed, 1_700_000_000_000, (1, 3000), (0, 30))


def _offset_targets(base: int, entries: list[tuple[int, int]]) -> list[int]:
    keys = [base + r for r, _ in entries]
    return sorted({0, base - 1, base, keys[0], keys[0] + 1, keys[len(keys) // 2], keys[-1] - 1, keys[-1],
                   keys[-1] + 1, keys[-1] + 10**6, *random.Random(5).choices(range(base, keys[-1] + 50), k=60)})


def _time_targets(entries: list[tuple[int, int]]) -> list[int]:
    keys = [t for t, _ in entries]
    return sorted({0, keys[0] - 1, keys[0], keys[0] + 1, keys[len(keys) // 2], keys[-1], keys[-1] + 1,
                   *random.Random(6).choices(range(keys[0] - 10, keys[-1] + 10), k=60)})


def _parse_read(answer: str) -> tuple[int, list[tuple[int, int]], dict[int, tuple[int, int]]]:
    assert answer.startswith("OK entries="), answer
    entries_part, entry_part, lookup_part = answer[3:].split(" ")
    count = int(entries_part.split("=")[1])
    entry_list = entry_part.split("=")[1]
    entries = [tuple(int(x) for x in e.split(":")) for e in entry_list.split(",")] if entry_list else []
    lookups = {}
    for item in filter(None, lookup_part.split("=")[1].split(",")):
        target, key, value = (int(x) for x in item.split(":"))
        lookups[target] = (key, value)
    return count, entries, lookups


def _write_msgindex_offset(path: Path, base: int, entries: list[tuple[int, int]], max_bytes: int = MAX_INDEX) -> None:
    index = OffsetIndex.open(path, base, max_bytes, writable=True)
    for relative, position in entries:
        index.append(base + relative, position)
    index.close()


def _write_msgindex_time(path: Path, base: int, entries: list[tuple[int, int]], max_bytes: int = MAX_INDEX) -> None:
    index = TimeIndex.open(path, base, max_bytes, writable=True)
    for timestamp, relative in entries:
        index.maybe_append(timestamp, base + relative)
    index.close()


def _flat(entries: list[tuple[int, int]], base: int, relative_field: int) -> list[int]:
    words = []
    for entry in entries:
        entry = list(entry)
        entry[relative_field] += base
        words.extend(entry)
    return words


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    """(scenario, answers by name, prepared data): everything Kafka's classes did, in one JVM."""
    try:
        classpath = stage_jars("kafka-storage", KAFKA_STORAGE)
        classes = compile_java("kafka-sparse-index", HARNESS, classpath)
    except ToolMissingError as e:
        pytest.skip(f"no JDK/Maven to run Kafka's classes: {e}")
    s = Scenario(tmp_path_factory.mktemp("kafka-interop"))
    data = {}

    # msgindex writes (trimmed on close), Kafka reads: 5000 entries exercise the warm section.
    for name, base, count in [("ours_offset_big", 1000, 5000), ("ours_offset_small", 0, 7),
                              ("ours_offset_one", 42, 1)]:
        entries = _offset_entries(count, seed=count)
        _write_msgindex_offset(s.path(name), base, entries)
        data[name] = (base, entries)
        s.add(name, "READ_OFFSET", s.path(name), base, *_offset_targets(base, entries))
    for name, base, count in [("ours_time_big", 7, 3000), ("ours_time_small", 0, 3)]:
        entries = _time_entries(count, seed=count)
        _write_msgindex_time(s.path(name), base, entries)
        data[name] = (base, entries)
        s.add(name, "READ_TIME", s.path(name), base, *_time_targets(entries))

    # A real segment's indexes, written by the metadata log (non-monotonic timestamps).
    rng = random.Random(3)
    log_dir = s.path("log")
    # Small batches (100 records) and segments, so that there are many batches and several segments.
    with MetadataLog.open(log_dir, segment_bytes=30_000, index_interval_bytes=300, writable=True,
                          batch_records=100) as log:
        log.append([MessageRecord("orders", i % 4, i, 1_700_000_000_000 + i * 10 + rng.randint(-900, 900),
                                  f"k{i}", (f"k{i}",)) for i in range(12000)])
        segments = log.segments()
        # Kafka's rule: an offset entry maps a batch's LAST seq to the batch's start position
        data["batch_ends"] = {
            info.base_seq: {int(p): int(b + c - 1) for p, b, c in zip(
                *(getattr(log.segment(info.base_seq).batches(), name) for name in ("positions", "base_seqs", "counts")))}
            for info in segments}
    data["segments"] = segments
    for info in segments:
        stem = info.path.with_suffix("")
        s.add(f"seg_offset_{info.base_seq}", "READ_OFFSET", stem.with_suffix(".index"), info.base_seq,
              info.base_seq, info.base_seq + 1, (info.base_seq + info.next_seq) // 2, info.next_seq - 1)
        s.add(f"seg_time_{info.base_seq}", "READ_TIME", stem.with_suffix(".timeindex"), info.base_seq,
              info.min_timestamp, info.min_timestamp + 5000, info.max_timestamp, info.max_timestamp + 1)

    # Kafka writes, msgindex reads: trimmed (closed) and untrimmed (as a killed broker leaves it).
    for name, trim in [("kafka_offset_trimmed", 1), ("kafka_offset_untrimmed", 0)]:
        base, entries = 500, _offset_entries(3000, seed=11)
        data[name] = (base, entries)
        s.add(name + "_write", "WRITE_OFFSET", s.path(name), base, 64 * 1024, trim, *_flat(entries, base, 0))
        s.add(name, "READ_OFFSET", s.path(name), base, *_offset_targets(base, entries))
    for name, trim in [("kafka_time_trimmed", 1), ("kafka_time_untrimmed", 0)]:
        base, entries = 9, _time_entries(2500, seed=12)
        data[name] = (base, entries)
        s.add(name + "_write", "WRITE_TIME", s.path(name), base, 64 * 1024, trim, *_flat(entries, base, 1))
        s.add(name, "READ_TIME", s.path(name), base, *_time_targets(entries))

    # Byte-identical files for the same calls; preallocation rounds down the same way.
    s.add("same_offset_write", "WRITE_OFFSET", s.path("kafka_same_offset"), 3, 8 * 100 + 5, 1,
          *_flat(_offset_entries(60, seed=13), 3, 0))
    s.add("same_time_write", "WRITE_TIME", s.path("kafka_same_time"), 3, 12 * 100 + 7, 1,
          *_flat([(1, 0), (1, 2), (5, 2), (9, 4), (9, 4), (12, 9)], 3, 1))
    s.add("prealloc_write", "WRITE_OFFSET", s.path("kafka_prealloc"), 0, 8 * 10 + 5, 0, 1, 10)

    # The same violations are refused by both.
    s.add("bad_offset_order", "WRITE_OFFSET", s.path("kafka_bad_offset"), 0, 800, 1, 5, 10, 5, 20)
    s.add("bad_time_order", "WRITE_TIME", s.path("kafka_bad_time"), 0, 1200, 1, 100, 1, 99, 2)
    s.add("bad_time_offset", "WRITE_TIME", s.path("kafka_bad_time_offset"), 0, 1200, 1, 100, 5, 101, 4)
    s.add("time_full", "WRITE_TIME", s.path("kafka_time_full"), 0, 12 * 5, 1, *_flat(
        [(10 * i + 1, i) for i in range(5)], 0, 1))

    argv = java_command(classpath + [classes], "SparseIndexHarness", heap="128m")
    done = subprocess.run(argv, input="\n".join(s.commands) + "\n", capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = done.stdout.strip().splitlines()
    assert len(answers) == len(s.names), done.stdout[-2000:] + done.stderr[-2000:]
    return s, dict(zip(s.names, answers)), data


def _msgindex_offset_answers(index: OffsetIndex, targets: list[int]) -> tuple[list[tuple[int, int]], dict]:
    return [index.entry(n) for n in range(index.entries)], {t: index.lookup(t) for t in targets}


def _msgindex_time_answers(index: TimeIndex, targets: list[int]) -> tuple[list[tuple[int, int]], dict]:
    return [index.entry(n) for n in range(index.entries)], {t: index.lookup(t) for t in targets}


@pytest.mark.parametrize("name", ["ours_offset_big", "ours_offset_small", "ours_offset_one"])
def test_kafka_reads_msgindex_offset_index(kafka, name):
    s, answers, data = kafka
    base, entries = data[name]
    count, kafka_entries, kafka_lookups = _parse_read(answers[name])
    index = OffsetIndex.open(s.path(name), base, MAX_INDEX, writable=False)
    ours_entries, ours_lookups = _msgindex_offset_answers(index, list(kafka_lookups))
    assert count == len(entries) == index.entries
    assert kafka_entries == ours_entries == [(base + r, p) for r, p in entries]
    assert kafka_lookups == ours_lookups
    assert s.path(name).stat().st_size == 8 * len(entries)  # trimmed on close, as Kafka does


@pytest.mark.parametrize("name", ["ours_time_big", "ours_time_small"])
def test_kafka_reads_msgindex_time_index(kafka, name):
    s, answers, data = kafka
    base, entries = data[name]
    count, kafka_entries, kafka_lookups = _parse_read(answers[name])
    index = TimeIndex.open(s.path(name), base, MAX_INDEX, writable=False)
    ours_entries, ours_lookups = _msgindex_time_answers(index, list(kafka_lookups))
    assert count == len(entries)
    assert kafka_entries == ours_entries == [(t, base + r) for t, r in entries]
    assert kafka_lookups == ours_lookups
    assert (-1, base) in kafka_lookups.values()  # below the first entry: (NO_TIMESTAMP, base)


def test_kafka_reads_metadata_log_segment_indexes(kafka):
    s, answers, data = kafka
    segments = data["segments"]
    assert len(segments) >= 2
    for info in segments:
        stem = info.path.with_suffix("")
        for kind, cls in (("offset", OffsetIndex), ("time", TimeIndex)):
            count, kafka_entries, kafka_lookups = _parse_read(answers[f"seg_{kind}_{info.base_seq}"])
            index = cls.open(stem.with_suffix(".index" if kind == "offset" else ".timeindex"),
                             info.base_seq, MAX_INDEX, writable=False)
            assert count == index.entries > 0
            assert kafka_entries == [index.entry(n) for n in range(index.entries)]
            assert kafka_lookups == {t: index.lookup(t) for t in kafka_lookups}
            if kind == "offset":  # every entry points at a batch, keyed by that batch's last seq
                assert all(data["batch_ends"][info.base_seq][position] == seq for seq, position in kafka_entries)
        # The sealed segment's time index ends with its max timestamp (Kafka's roll entry).
        if not info.active:
            assert kafka_entries[-1][0] == info.max_timestamp


@pytest.mark.parametrize("kind", ["offset", "time"])
def test_msgindex_reads_kafka_trimmed_index(kafka, kind):
    s, answers, data = kafka
    name = f"kafka_{kind}_trimmed"
    base, entries = data[name]
    assert answers[name + "_write"] == "OK"
    count, kafka_entries, kafka_lookups = _parse_read(answers[name])
    cls = OffsetIndex if kind == "offset" else TimeIndex
    index = cls.open(s.path(name), base, 64 * 1024, writable=False)
    index.sanity_check()
    assert index.entries == count == len(entries)
    assert [index.entry(n) for n in range(index.entries)] == kafka_entries
    assert {t: index.lookup(t) for t in kafka_lookups} == kafka_lookups


@pytest.mark.parametrize("kind", ["offset", "time"])
def test_msgindex_reads_kafka_untrimmed_index_with_known_entry_count(kafka, kind):
    s, answers, data = kafka
    name = f"kafka_{kind}_untrimmed"
    base, entries = data[name]
    cls = OffsetIndex if kind == "offset" else TimeIndex
    assert s.path(name).stat().st_size == 64 * 1024 // cls.ENTRY.size * cls.ENTRY.size
    # Kafka's "length / entry size" rule counts the zero tail; msgindex's stricter check refuses it...
    with pytest.raises(CorruptFileError, match=name):
        cls.open(s.path(name), base, 64 * 1024, writable=False).sanity_check()
    # ...and with the committed count (what a checkpoint records) reads exactly Kafka's entries.
    index = cls.open(s.path(name), base, 64 * 1024, writable=False, entries=len(entries))
    index.sanity_check()
    trimmed = cls.open(s.path(f"kafka_{kind}_trimmed"), base, 64 * 1024, writable=False)
    assert [index.entry(n) for n in range(index.entries)] == [trimmed.entry(n) for n in range(trimmed.entries)]


def test_same_calls_give_byte_identical_files(kafka, tmp_path):
    s, answers, _ = kafka
    assert answers["same_offset_write"] == answers["same_time_write"] == answers["prealloc_write"] == "OK"
    _write_msgindex_offset(tmp_path / "o", 3, _offset_entries(60, seed=13), 8 * 100 + 5)
    assert (tmp_path / "o").read_bytes() == s.path("kafka_same_offset").read_bytes()
    index = TimeIndex.open(tmp_path / "t", 3, 12 * 100 + 7, writable=True)
    for timestamp, relative in [(1, 0), (1, 2), (5, 2), (9, 4), (9, 4), (12, 9)]:
        index.maybe_append(timestamp, 3 + relative)
    index.close()
    assert (tmp_path / "t").read_bytes() == s.path("kafka_same_time").read_bytes()
    assert len((tmp_path / "t").read_bytes()) == 4 * 12  # equal timestamps are not appended, by either
    prealloc = OffsetIndex.open(tmp_path / "p", 0, 8 * 10 + 5, writable=True)
    prealloc.append(1, 10)
    prealloc.flush()
    prealloc.close_handler()
    assert (tmp_path / "p").read_bytes() == s.path("kafka_prealloc").read_bytes()
    assert len((tmp_path / "p").read_bytes()) == 80


def test_both_refuse_the_same_appends(kafka, tmp_path):
    _, answers, _ = kafka
    assert answers["bad_offset_order"] == "ERR InvalidOffsetException"
    offsets = OffsetIndex.open(tmp_path / "o", 0, 800, writable=True)
    offsets.append(5, 10)
    with pytest.raises(InvalidAppendError, match="not larger"):
        offsets.append(5, 20)
    assert answers["bad_time_order"] == "ERR IllegalStateException"
    assert answers["bad_time_offset"] == "ERR InvalidOffsetException"
    times = TimeIndex.open(tmp_path / "t", 0, 1200, writable=True)
    times.maybe_append(100, 1)
    with pytest.raises(InvalidAppendError, match="timestamp 99"):
        times.maybe_append(99, 2)
    with pytest.raises(InvalidAppendError, match="sequence 0"):
        times.maybe_append(101, 0)
    # A 5-entry time index is full at 4 entries (one slot is kept for the roll entry).
    assert answers["time_full"] == "ERR IllegalArgumentException"
    full = TimeIndex.open(tmp_path / "f", 0, 12 * 5, writable=True)
    for i in range(4):
        full.maybe_append(10 * i + 1, i)
    with pytest.raises(IndexFullError):
        full.maybe_append(41, 4)
    full.maybe_append(41, 4, skip_full_check=True)
    assert full.entries == 5
