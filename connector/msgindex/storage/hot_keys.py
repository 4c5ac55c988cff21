"""Hot-key copies: derived files that answer a hot key's records without reading the whole log.

A key carried by a tenth of the records (a tenant id, a default key) has its records in nearly
every block of the log: the hash index finds them exactly, but reading them back means
decompressing the whole log (~1 s for 10M records). A columnar file sorted by key reads only that
key's rows, and so does this: for each committed *stretch* of the log, [start, end) with
``STRETCH_RECORDS`` records, the writer copies the rows of every key carried by at least
``MIN_SHARE`` of the stretch's records (in any topics) into one file, each such key's *group*
already rendered (ROW_SCHEMA but the broker, which the shard gives) and in RESULT_ORDER, as a
zstd-compressed Arrow IPC stream. A group holds every record of the stretch that carries its key,
in every topic: a lookup of the key in some topics filters the group by topic. A lookup of a hot
key then takes its rows of each covered stretch from the group (a checksum and one decompression)
and reads only the rest of the log.

Copies are derived and never required: a lookup uses one only when it is intact (checksums) and
its fingerprint, the checksums of the log blocks holding its stretch, is the log's; otherwise the
answer comes from the log, as if the copy did not exist. Deleting every copy changes no answer,
only its speed. A copy only ever covers committed records, which never change; readers ignore a
copy once retention cut into its stretch (the log answers for the rest of it) and retention
deletes it once the whole stretch is below the log's start.

Files live in the shard's ``hotkeys/`` directory, one per stretch, named ``<start>-<end>.hotkeys``
(20-digit seqs); the stretches of a shard follow one another from the first one built.

The stretch still being filled is copied too, in *pieces* of ``PIECE_RECORDS`` as each fills:
the records past the last copy are the newest, which an investigator asks for most, and a hot
key's rows there would otherwise come from the log (up to a stretch of them, nearly half of a
500k-record store). When its stretch fills, the stretch's copy is written and then its pieces
are deleted; a reader prefers the longer copy of two that start together and skips any copy
inside one it uses (``inside_another``), so a writer stopped between the two steps changes no
answer, and a reader that listed a piece since replaced answers from the log (``unreadable``).
Each record is copied at most twice.

Layout (little-endian: msgindex's own format)::

    header     64 B      HEADER_STRUCT: magic, version, group count, start and end seq, the log's
                         fingerprint, the directory's length and CRC-32, the header's CRC-32
    directory  variable  per group, sorted by key: GROUP_STRUCT (position and length of its stream
                         in the file, rows, CRC-32 of the stream, key length), then the key as the
                         log stores it (``encode_text``)
    streams    variable  per group, an Arrow IPC stream of STORED_SCHEMA (zstd buffers; a version-1
                         copy: of COPY_SCHEMA itself)

A group's rows are stored as they are shown (COPY_SCHEMA) but for three columns that zstd cannot
shrink as shown (a hot key's rows repeat one key, and their timestamps rise): STORED_SCHEMA's

    key              the row's key, dictionary-encoded
    keys_lead        whether the row's keys start with its key (the usual message: key == keys[0])
    keys_rest        its keys past that one (all of them when not keys_lead): the extra keys
    timestamp_step   ms since the row before (the first row: ms since the epoch); rows are in
                     RESULT_ORDER, timestamp first, so every step but the first is >= 0

(``stored`` and ``shown`` turn one into the other; the rest is as shown.) Version 1 stored COPY_SCHEMA
as is: 17-18 bytes a row on bench_vs_parquet's workloads, where version 2 takes 7-8.

A stretch holding a timestamp outside the timestamp rule (stores from before the rule) gets a copy
with no groups: rows are ordered by their stored millisecond, which such rows do not show.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError
from msgindex.storage.durable import is_temporary, write_atomically
from msgindex.storage.hash_index.java_hash import byte_string_hashes
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import ranges_owner
from msgindex.storage.log.metadata_log import MetadataLog, in_order
from msgindex.storage.message import (
    FIELD_TERM_MARKER,
    MAX_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS,
    ROW_SCHEMA,
    arrow_text,
    encode_text,
    text_of_shown,
)
from msgindex.storage.result_order import OrderColumns, Part, result_order, topic_ranks

logger = logging.getLogger(__name__)

DIRECTORY = "hotkeys"  # in the shard directory
SUFFIX = ".hotkeys"
MAGIC = b"MIHOTKEY"
VERSION = 2
READ_VERSIONS = (1, 2)
HEADER_SIZE = 64
# magic, version, groups, start_seq, end_seq, log_fingerprint, directory_length, directory_crc | header_crc | spare
_HEADER_FIELDS_BEFORE_CRC = "<8sIIqqIII"
HEADER_STRUCT = struct.Struct(_HEADER_FIELDS_BEFORE_CRC + "I16x")
HEADER_CRC_OFFSET = struct.calcsize(_HEADER_FIELDS_BEFORE_CRC)  # header_crc covers every byte before it
# position, length, rows, stream_crc, key_length (then the key's bytes)
GROUP_STRUCT = struct.Struct("<QIIII")
# What a group stores of each row: ROW_SCHEMA without the broker (the shard's), topics as a
# dictionary (a hot key lives in a few topics).
COPY_SCHEMA = pa.schema([field.with_type(pa.dictionary(pa.int32(), pa.string())) if field.name == "topic" else field
                         for field in ROW_SCHEMA if field.name != "broker"])
STORED_SCHEMA = pa.schema([
    *(COPY_SCHEMA.field(name) for name in ("topic", "partition", "offset")),
    pa.field("key", pa.dictionary(pa.int32(), pa.string()), nullable=True),
    pa.field("keys_lead", pa.bool_(), nullable=False),
    COPY_SCHEMA.field("keys").with_name("keys_rest"),
    pa.field("timestamp_step", pa.int64(), nullable=False),
    *(COPY_SCHEMA.field(name) for name in ("commit_log_offset", "size", "seq")),
])
COMPRESSION = "zstd"  # 10M records, the hot key's 1.79M rows: 12.9 B/row, read back in ~55 ms (LZ4: 24 B, 31 ms)

# Policy (measured on bench_vs_parquet's 10M records: BENCHMARKS.md). A stretch is short enough
# that the log's uncopied tail stays small beside the copies, long enough that a group's fixed
# cost (~50 us) is nothing beside its rows.
STRETCH_RECORDS = 1 << 18
# The uncopied tail stays under this (module docstring). On a piece MIN_ROWS is 1.6% of its
# records: a key between 1% and 1.6% waits for its stretch's copy.
PIECE_RECORDS = 1 << 16
MIN_SHARE = 0.01  # a (topic, key) on >= 1% of a stretch's records is hot: reading its blocks is reading them all
MIN_ROWS = 1024  # ... and on at least this many (fewer are found in a few ms from their blocks)
MAX_SHARE = 0.5  # copies hold at most this share of a stretch's records (the byte budget), hottest first
_BUCKET_MASK = (1 << 20) - 1  # hash buckets counting key entries before the exact grouping
_OPENED_COPIES = 1024  # parsed copies a process remembers (by file identity)

assert HEADER_STRUCT.size == HEADER_SIZE and GROUP_STRUCT.size == 24


def copy_path(directory: Path, start_seq: int, end_seq: int) -> Path:
    """Where the copy of the stretch [start_seq, end_seq) lives in the `directory` of copies."""
    return Path(directory) / f"{start_seq:020d}-{end_seq:020d}{SUFFIX}"


def parse_copy_name(name: str) -> tuple[int, int] | None:
    """(start_seq, end_seq) of a copy's file name, None for any other name."""
    stem, dot, suffix = name.partition(".")
    start, dash, end = stem.partition("-")
    if f"{dot}{suffix}" != SUFFIX or not dash or len(start) != 20 or len(end) != 20:
        return None
    if not (start.isdigit() and end.isdigit()) or int(start) >= int(end):
        return None
    return int(start), int(end)


def stretches(directory: Path) -> list[tuple[int, int, Path]]:
    """(start, end, path) of every copy file in `directory`, by start, the longest first among
    copies that start together (a stretch's copy before its first piece's)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        bounds = parse_copy_name(path.name)
        if bounds is not None:
            found.append((*bounds, path))
    return sorted(found, key=lambda copy: (copy[0], -copy[1]))


def inside_another(start: int, end: int, used_start: int, used_end: int) -> bool:
    """True when the copy [start, end) lies inside [used_start, used_end), a longer copy in use:
    a piece its stretch's copy replaced (module docstring)."""
    return used_start <= start and end <= used_end and (start, end) != (used_start, used_end)


@dataclass(frozen=True)
class Group:
    """One hot key of a copy: where its rows' stream is, how many rows, its checksum."""

    key: bytes  # encode_text, as the log stores it
    position: int
    length: int
    rows: int
    crc: int


class HotKeyCopy:
    """One copy file's header and directory, checked (see the module docstring); its groups'
    rows are read on demand (``rows``)."""

    def __init__(self, path: Path, start_seq: int, end_seq: int, log_fingerprint: int,
                 groups: dict[bytes, Group], version: int = VERSION) -> None:
        self.path = path
        self.version = version
        self.start_seq = start_seq
        self.end_seq = end_seq
        self.log_fingerprint = log_fingerprint
        self.groups = groups

    @classmethod
    def open(cls, path: Path) -> HotKeyCopy:
        """The copy at `path`; CorruptFileError when it is torn, damaged or not a copy."""
        path = Path(path)
        try:
            stat = os.stat(path)
            identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if identity in _OPENED and _OPENED[identity].path == path:
                _OPENED.move_to_end(identity)
                return _OPENED[identity]
            with open(path, "rb") as f:
                head = f.read(HEADER_SIZE)
                copy = cls._parse(path, head, f, stat.st_size)
        except IsADirectoryError as error:
            raise CorruptFileError(f"{path}: a directory where a hot-key copy should be") from error
        except OSError as error:
            raise CorruptFileError(f"{path}: hot-key copy cannot be read ({error.strerror or error})") from error
        _OPENED[identity] = copy
        while len(_OPENED) > _OPENED_COPIES:
            _OPENED.popitem(last=False)
        return copy

    @classmethod
    def _parse(cls, path: Path, head: bytes, f, size: int) -> HotKeyCopy:
        if len(head) != HEADER_SIZE:
            raise CorruptFileError(f"{path}: hot-key copy is {size} bytes, shorter than its {HEADER_SIZE}-byte header")
        magic, version, group_count, start, end, fingerprint, directory_length, directory_crc, header_crc = (
            HEADER_STRUCT.unpack(head))
        if magic != MAGIC or version not in READ_VERSIONS:
            raise CorruptFileError(f"{path}: not a hot-key copy of version {' or '.join(map(str, READ_VERSIONS))} "
                                   f"(magic {magic!r}, version {version})")
        if zlib.crc32(head[:HEADER_CRC_OFFSET]) != header_crc:
            raise CorruptFileError(f"{path}: hot-key copy header fails its checksum")
        if (start, end) != parse_copy_name(path.name):
            raise CorruptFileError(f"{path}: hot-key copy holds the stretch [{start}, {end}), not the one its name says")
        directory = f.read(directory_length)
        if len(directory) != directory_length or zlib.crc32(directory) != directory_crc:
            raise CorruptFileError(f"{path}: hot-key copy directory is torn or fails its checksum")
        groups: dict[bytes, Group] = {}
        at = 0
        streams_from = HEADER_SIZE + directory_length
        for _ in range(group_count):
            if at + GROUP_STRUCT.size > directory_length:
                raise CorruptFileError(f"{path}: hot-key copy directory lists fewer than its {group_count} groups")
            position, length, rows, crc, key_length = GROUP_STRUCT.unpack_from(directory, at)
            at += GROUP_STRUCT.size
            key = directory[at : at + key_length]
            at += key_length
            if position < streams_from or position + length > size:
                raise CorruptFileError(f"{path}: hot-key copy group at {position} (+{length}) lies outside the file")
            groups[key] = Group(key, position, length, rows, crc)
        if at != directory_length:
            raise CorruptFileError(f"{path}: hot-key copy directory holds {directory_length - at} bytes past its groups")
        return cls(path, start, end, fingerprint, groups, version)

    def fits(self, log: MetadataLog) -> bool:
        """True when the log's blocks holding this copy's stretch are the ones it was copied from."""
        return _fingerprint(log.block_crcs(self.start_seq, self.end_seq)) == self.log_fingerprint

    def rows(self, group: Group) -> pa.Table:
        """The group's rows (COPY_SCHEMA, in RESULT_ORDER), checksum verified."""
        try:
            with open(self.path, "rb") as f:
                data = os.pread(f.fileno(), group.length, group.position)
        except OSError as error:
            raise CorruptFileError(f"{self.path}: hot-key copy cannot be read ({error.strerror or error})") from error
        if len(data) != group.length or zlib.crc32(data) != group.crc:
            raise CorruptFileError(f"{self.path}: hot-key copy group at {group.position} fails its checksum")
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        except (pa.ArrowException, ValueError) as error:
            raise CorruptFileError(f"{self.path}: hot-key copy group at {group.position} is not an Arrow stream "
                                   f"({error})") from error
        if table.schema != (COPY_SCHEMA if self.version == 1 else STORED_SCHEMA) or table.num_rows != group.rows:
            raise CorruptFileError(f"{self.path}: hot-key copy group at {group.position} holds {table.num_rows} rows "
                                   f"of another shape than the {group.rows} its directory lists")
        if self.version == 1:
            return table
        try:
            return shown(table)
        except (pa.ArrowException, ValueError) as error:  # (only a rewrite with matching checksums gets here)
            raise CorruptFileError(f"{self.path}: hot-key copy group at {group.position} does not decode ({error})") \
                from error


_OPENED: OrderedDict[tuple[int, int, int, int], HotKeyCopy] = OrderedDict()


class CopiedRows:
    """What hot-key copies hold of one lookup: the groups of its wanted keys, read and checked,
    stretch by stretch. Wanted keys are numbered (one number per (topic, key) pair of the lookup)."""

    def __init__(self, copies: list[tuple[HotKeyCopy, list[tuple[pa.Table, list[int]]]]], wanted_count: int,
                 log_start_seq: int, wanted_keys: int) -> None:
        """`copies`: each usable copy (by stretch) with its groups' rows and the numbers each
        serves; `wanted_keys`: how many distinct keys the lookup has (several: a record carrying
        two is still one row)."""
        self._copies = copies
        self._low = log_start_seq
        self._several_keys = wanted_keys > 1
        self.starts = np.array([copy.start_seq for copy, _ in copies], dtype=np.int64)
        self.ends = np.array([copy.end_seq for copy, _ in copies], dtype=np.int64)
        self.served = np.zeros((len(copies), wanted_count), dtype=bool)  # stretch x wanted number
        for at, (_copy, tables) in enumerate(copies):
            for _table, numbers in tables:
                self.served[at, numbers] = True
        self._seen = np.zeros(0, np.int64)

    def covered_below(self, wanted_count: int) -> np.ndarray:
        """Per wanted number, the seq below which copies hold all that key's rows (the log's
        start when none): its hash entries below it need not be read at all. Stretches follow
        one another, so a key's coverage is the run of stretches from the first that serve it."""
        ends = np.full(wanted_count, self._low, dtype=np.int64)
        going = np.ones(wanted_count, dtype=bool)
        for at in range(len(self._copies)):
            going &= self.served[at, :wanted_count] & (self.starts[at] <= ends)
            if not going.any():
                break
            ends[going] = self.ends[at]
        return ends

    def parts(self, broker: str, shown_topics: list[str], begin_ms: int | None, end_ms: int | None,
              partitions: np.ndarray | None) -> list[Part]:
        """The rows in the window (ms, inclusive), partitions and the wanted keys' topics
        (`shown_topics`, per wanted number), each record once."""
        parts, seen = [], []
        for _copy, tables in self._copies:
            stretch_seen: np.ndarray | None = None
            for table, numbers in tables:
                keep = topic_mask(table, {shown_topics[n] for n in numbers})
                keep = np.ones(table.num_rows, dtype=bool) if keep is None else keep
                seqs = table.column("seq").to_numpy()  # all retained: readers skip copies retention cut into
                stamps = stamps_ms(table)
                if begin_ms is not None:
                    keep &= stamps >= begin_ms
                if end_ms is not None:
                    keep &= stamps <= end_ms
                if partitions is not None:
                    keep &= np.isin(table.column("partition").to_numpy(), partitions)
                if self._several_keys:
                    if stretch_seen is not None:
                        keep &= ~np.isin(seqs, stretch_seen)
                    stretch_seen = seqs[keep] if stretch_seen is None else np.union1d(stretch_seen, seqs[keep])
                part = part_of(table, broker, keep, stamps)
                if part is not None:
                    parts.append(part)
            if stretch_seen is not None:
                seen.append(np.sort(stretch_seen))
        self._seen = np.concatenate(seen) if seen else np.zeros(0, np.int64)
        return parts

    def left_for_log(self, seqs: np.ndarray, who: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates (seq, wanted number) the copies do not answer (after ``parts``)."""
        if not len(self._copies) or not len(seqs):
            return seqs, who
        stretch = np.searchsorted(self.starts, seqs, side="right") - 1
        inside = (stretch >= 0) & (seqs < self.ends[np.maximum(stretch, 0)])
        done = inside & self.served[np.maximum(stretch, 0), who]
        if len(self._seen):  # a record of an unserved wanted key that a group returned
            done |= np.isin(seqs, self._seen)
        return seqs[~done], who[~done]


def read_copies(copies: list[HotKeyCopy], fits: Callable[[HotKeyCopy], bool], key_numbers: dict[bytes, list[int]],
                wanted_count: int, log_start_seq: int, wanted_keys: int) -> CopiedRows:
    """The groups of `copies` (by stretch, not overlapping) holding wanted keys (`key_numbers`:
    each key's numbers; keys no copy holds may be left out), read and checked; a copy that does
    not `fits` the log or fails a check is left out (logged: the log answers for its stretch).
    `wanted_keys`: how many distinct keys the lookup has."""
    tasks = []
    for copy in copies:
        groups = [(copy.groups[key], numbers) for key, numbers in key_numbers.items() if key in copy.groups]
        if groups and fits(copy):
            tasks.append((copy, groups))

    def read(task: tuple[HotKeyCopy, list[tuple[Group, list[int]]]]) -> tuple | None:
        copy, groups = task
        try:
            return copy, [(copy.rows(group), numbers) for group, numbers in groups]
        except CorruptFileError as error:
            unreadable(copy.path, error)
            return None

    # decompression runs outside the GIL: the log's reading threads read many copies at once
    usable = [read_copy for read_copy in in_order(read, tasks) if read_copy is not None]
    return CopiedRows(usable, wanted_count, log_start_seq, wanted_keys)


def unreadable(path: Path, error: CorruptFileError) -> None:
    """Tell of a copy a reader listed and cannot read (the log answers for its stretch): a warning,
    unless it is gone (a piece its stretch's copy replaced, or retention's, since the listing)."""
    if path.exists():
        logger.warning("%s: answering from the log", error)
    else:
        logger.info("%s: gone since it was listed; answering from the log", path)


def part_of(table: pa.Table, broker: str, keep: np.ndarray | None, stamps: np.ndarray) -> Part | None:
    """A group's rows (`keep` of them, when given) as a lookup's part, the broker added
    (`stamps`: the group's ``stamps_ms``)."""
    if keep is not None:
        if not keep.any():
            return None
        if not keep.all():
            table, stamps = table.filter(pa.array(keep)), stamps[keep]
    count = table.num_rows
    if not count:
        return None
    topic = table.column("topic").combine_chunks()
    columns = [pa.repeat(pa.scalar(arrow_text(broker), pa.string()), count), topic.dictionary.take(topic.indices),
               *table.columns[1:]]
    order = OrderColumns(table.column("seq").to_numpy(), tuple(encode_text(text_of_shown(shown))
                                                                for shown in topic.dictionary.to_pylist()),
                         topic.indices.to_numpy().astype(np.int64), table.column("partition").to_numpy(),
                         table.column("offset").to_numpy(), stamps)
    return Part(pa.Table.from_arrays(columns, schema=ROW_SCHEMA), order)


def topic_mask(table: pa.Table, shown_topics: set[str]) -> np.ndarray | None:
    """Which rows of a group are in `shown_topics` (topics as results show them); None: all."""
    topic = table.column("topic").combine_chunks()
    inside = np.array([shown in shown_topics for shown in topic.dictionary.to_pylist()], dtype=bool)
    return None if inside.all() else inside[topic.indices.to_numpy()]


def stamps_ms(table: pa.Table) -> np.ndarray:
    """A group's timestamps in ms (copies hold only timestamps the rule shows as stored)."""
    return table.column("timestamp").cast(pa.int64()).to_numpy() // 1000


# --- writing ------------------------------------------------------------------------------------
def seal_committed(directory: Path, log: MetadataLog, log_start_seq: int, record_count: int) -> list[Path]:
    """Write the copies the committed records call for and do not have (the writer, after a
    commit): a stretch for every STRETCH_RECORDS committed past the last stretch's copy (from
    the log's start for the first), then deleting its pieces; a piece for every PIECE_RECORDS
    committed past that; and a copy for each gap between copies (one that `msgindex repair`
    removed as damaged). Pieces inside a stretch's copy that a stopped writer left are deleted."""
    made = []
    cursor = log_start_seq
    pieces: list[tuple[int, int, Path]] = []  # of the stretch being filled, after the last whole one
    used = (log_start_seq, log_start_seq)

    def followed_by(copy: tuple[int, int, Path]) -> list[tuple[int, int, Path]]:
        return [*pieces, copy] if copy[1] - copy[0] < STRETCH_RECORDS else []

    for start, end, path in stretches(directory):
        if end <= log_start_seq:
            continue  # (retention's: remove_copies deletes it)
        # a copy retention cut into still sets the grid: the next stretch starts where it ends
        if inside_another(start, end, *used):
            _remove(path)
            continue
        if start > cursor:
            made.append(_write(directory, log, cursor, start))
            pieces = followed_by((cursor, start, made[-1]))
        pieces = followed_by((start, end, path))
        cursor, used = end, (start, end)
    stretch_start = pieces[0][0] if pieces else cursor
    while record_count - stretch_start >= STRETCH_RECORDS:
        made.append(_write(directory, log, stretch_start, stretch_start + STRETCH_RECORDS))
        for _start, _end, path in pieces:
            _remove(path)
        pieces, stretch_start = [], stretch_start + STRETCH_RECORDS
    cursor = max(stretch_start, pieces[-1][1] if pieces else stretch_start)
    while record_count - cursor >= PIECE_RECORDS:
        made.append(_write(directory, log, cursor, cursor + PIECE_RECORDS))
        cursor += PIECE_RECORDS
    return made


def _remove(path: Path) -> None:
    """Delete a replaced piece; anything else under its name (a directory) is left to `msgindex
    repair`, and readers skip it inside the copy that replaced it."""
    if path.is_file():
        path.unlink(missing_ok=True)


def _write(directory: Path, log: MetadataLog, start_seq: int, end_seq: int) -> Path:
    directory.mkdir(exist_ok=True)
    path = copy_path(directory, start_seq, end_seq)
    write_atomically(path, build(log, start_seq, end_seq))
    return path


def build(log: MetadataLog, start_seq: int, end_seq: int, *, min_share: float | None = None,
          min_rows: int | None = None, max_share: float | None = None) -> bytes:
    """The copy of the stretch [start_seq, end_seq) of `log` (committed records), as file bytes."""
    records = log.gather(np.arange(start_seq, end_seq, dtype=np.int64))
    in_rule = bool(len(records)) and int(records.timestamp_ms.min()) >= MIN_TIMESTAMP_MS and (
        int(records.timestamp_ms.max()) <= MAX_TIMESTAMP_MS)
    groups = _hot_groups(records, MIN_SHARE if min_share is None else min_share,
                         MIN_ROWS if min_rows is None else min_rows,
                         MAX_SHARE if max_share is None else max_share) if in_rule else []
    return encode(start_seq, end_seq, _fingerprint(log.block_crcs(start_seq, end_seq)), groups)


def _hot_groups(records: bf.DecodedRows, min_share: float, min_rows: int, max_share: float,
                only: set[bytes] | None = None) -> list[tuple[bytes, pa.Table]]:
    """(key, rows in RESULT_ORDER) of the hot keys of `records` (of the keys `only`, hot or
    not, when given), by key."""
    count = len(records)
    threshold = max(min_rows, min_share * count)
    flat = pc.list_flatten(records.keys)
    if only is not None:
        among = pc.is_in(flat, pa.array(sorted(only), flat.type)).to_numpy(zero_copy_only=False)
    else:
        # A key's entries are at most its hash bucket's: only entries in buckets with enough of
        # them can be a hot key's, and only those are grouped exactly (dictionary-encoding every
        # entry of a stretch cost ~110 ms of the ~270 ms a copy took to build).
        buckets = byte_string_hashes(flat) & _BUCKET_MASK
        among = np.bincount(buckets, minlength=_BUCKET_MASK + 1)[buckets] >= threshold
        if among.any():  # field terms (message.field_term) are never copied: field lookups read the log
            among &= ~pc.equal(pc.binary_slice(flat, 0, 1), pa.scalar(FIELD_TERM_MARKER, flat.type)).to_numpy(
                zero_copy_only=False)
    among = np.flatnonzero(among)
    parents = pc.list_parent_indices(records.keys).to_numpy()[among]
    encoded = pc.dictionary_encode(flat.take(pa.array(among)))
    codes = encoded.indices.to_numpy()
    # a key's entries bound its records (a record may list a key twice): only keys with enough
    # entries are counted exactly, each record once
    entries = np.bincount(codes, minlength=len(encoded.dictionary))
    maybe = list(range(len(encoded.dictionary))) if only is not None else np.flatnonzero(entries >= threshold).tolist()
    rows_of = {at: np.unique(parents[codes == at]).astype(np.int64) for at in maybe}
    hot = maybe if only is not None else sorted(
        (at for at in maybe if len(rows_of[at]) >= threshold), key=lambda at: -len(rows_of[at]))
    if only is None:
        sizes = np.cumsum([len(rows_of[at]) for at in hot])
        hot = [at for at, size in zip(hot, sizes.tolist()) if size <= max_share * count]
    ranks = topic_ranks(records.topics)[records.topic_ids]
    groups = []
    for at in hot:
        rows = rows_of[at]
        order = result_order(records.timestamp_ms[rows], ranks[rows], records.partition[rows], records.offset[rows],
                             records.seqs[rows])
        rendered = pa.Table.from_batches([bf.rows(records, "", rows[order])]).drop_columns(["broker"])
        topic = rendered.column("topic").combine_chunks().dictionary_encode()
        groups.append((encoded.dictionary[at].as_py(), rendered.set_column(0, "topic", topic)))
    groups.sort(key=lambda group: group[0])
    return groups


def stored(table: pa.Table) -> pa.Table:
    """A group's COPY_SCHEMA rows (in RESULT_ORDER) as STORED_SCHEMA (module docstring)."""
    table = table.cast(COPY_SCHEMA)
    key, keys = table.column("key").combine_chunks(), table.column("keys").combine_chunks()
    starts, lengths = keys.offsets.to_numpy()[:-1], pc.list_value_length(keys).to_numpy(zero_copy_only=False)
    values = keys.values
    lead = np.zeros(len(table), dtype=bool)
    has = (lengths > 0) & key.is_valid().to_numpy(zero_copy_only=False)
    if has.any():
        firsts = values.take(pa.array(starts[has]))
        lead[np.flatnonzero(has)] = pc.equal(firsts, key.filter(pa.array(has))).to_numpy(zero_copy_only=False)
    rest_lengths = lengths - lead
    rest_offsets = np.zeros(len(table) + 1, dtype=np.int32)
    np.cumsum(rest_lengths, out=rest_offsets[1:])
    rest_values = values.take(pa.array(bf._ranges(starts + lead, rest_lengths)))
    stamps = stamps_ms(table)
    steps = np.diff(stamps, prepend=np.int64(0))
    columns = {name: table.column(name) for name in ("topic", "partition", "offset")}
    columns.update(key=key.dictionary_encode(), keys_lead=pa.array(lead),
                   keys_rest=pa.ListArray.from_arrays(pa.array(rest_offsets), rest_values,
                                                      type=STORED_SCHEMA.field("keys_rest").type),
                   timestamp_step=pa.array(steps, pa.int64()))
    columns.update({name: table.column(name) for name in ("commit_log_offset", "size", "seq")})
    return pa.table(columns, schema=STORED_SCHEMA)


def shown(table: pa.Table) -> pa.Table:
    """``stored``'s inverse: STORED_SCHEMA rows as COPY_SCHEMA."""
    count = table.num_rows
    key = table.column("key").combine_chunks()
    key = key.dictionary.take(key.indices)
    rest = table.column("keys_rest").combine_chunks()
    lead = table.column("keys_lead").to_numpy(zero_copy_only=False).astype(bool)
    rest_offsets = rest.offsets.to_numpy().astype(np.int64)
    rest_lengths = np.diff(rest_offsets)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(rest_lengths + lead, out=offsets[1:])
    take = np.empty(int(offsets[-1]), dtype=np.int64)
    take[offsets[:-1][lead]] = np.flatnonzero(lead)  # a leading key is the row's key
    owner, within = ranges_owner(rest_lengths)
    take[offsets[owner] + lead[owner] + within] = count + rest_offsets[owner] + within
    values = pa.concat_arrays([key.cast(pa.string()), rest.values.cast(pa.string())]).take(pa.array(take))
    stamps = np.cumsum(table.column("timestamp_step").to_numpy()) * 1000
    columns = [table.column(name) for name in ("topic", "partition", "offset")]
    columns += [key, pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values,
                                               type=COPY_SCHEMA.field("keys").type),
                pa.array(stamps, pa.int64()).cast(COPY_SCHEMA.field("timestamp").type)]
    columns += [table.column(name) for name in ("commit_log_offset", "size", "seq")]
    return pa.Table.from_arrays(columns, schema=COPY_SCHEMA)


def encode(start_seq: int, end_seq: int, log_fingerprint: int, groups: list[tuple[bytes, pa.Table]]) -> bytes:
    """A copy file's bytes (see the module docstring) for `groups`: (key, COPY_SCHEMA rows)."""
    streams = []
    for _key, table in groups:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, STORED_SCHEMA, options=pa.ipc.IpcWriteOptions(compression=COMPRESSION)) as writer:
            writer.write_table(stored(table))
        streams.append(sink.getvalue().to_pybytes())
    directory_length = sum(GROUP_STRUCT.size + len(key) for key, _ in groups)
    position = HEADER_SIZE + directory_length
    directory = bytearray()
    for (key, table), stream in zip(groups, streams, strict=True):
        directory += GROUP_STRUCT.pack(position, len(stream), table.num_rows, zlib.crc32(stream), len(key))
        directory += key
        position += len(stream)
    fields = [MAGIC, VERSION, len(groups), start_seq, end_seq, log_fingerprint, len(directory), zlib.crc32(directory), 0]
    fields[-1] = zlib.crc32(HEADER_STRUCT.pack(*fields)[:HEADER_CRC_OFFSET])
    return HEADER_STRUCT.pack(*fields) + bytes(directory) + b"".join(streams)


def check_copies(directory: Path, log: MetadataLog, log_start_seq: int, record_count: int) -> list[tuple[Path, str]]:
    """(file, what is wrong) for every copy in `directory` a lookup would ignore or that holds
    other rows than the log gives for its keys (deep: each group is made again from the log)."""
    problems = []
    for start, end, path in stretches(directory):
        if start < log_start_seq:
            continue  # retention's leftover, or cut into: readers ignore it, the next writer deletes it once passed
        if end > record_count:
            problems.append((path, f"hot-key copy covers records up to seq {end}, past the {record_count} committed "
                                   f"(lookups ignore it)"))
            continue
        try:
            copy = HotKeyCopy.open(path)
            if not copy.fits(log):
                problems.append((path, "hot-key copy was not made from this log: its block checksums differ (lookups "
                                       "ignore it)"))
                continue
            records = log.gather(np.arange(start, end, dtype=np.int64))
            expected = dict(_hot_groups(records, MIN_SHARE, MIN_ROWS, MAX_SHARE, only=set(copy.groups)))
            for key, group in copy.groups.items():
                if key not in expected or not copy.rows(group).equals(expected[key].cast(COPY_SCHEMA)):
                    problems.append((path, f"hot-key copy group of key {key!r} holds other rows than the log "
                                           f"(lookups would use it while its checksums hold)"))
        except CorruptFileError as error:
            if path.exists():  # (a piece a committing writer replaced since the listing is no problem)
                problems.append((path, f"{error} (lookups ignore it)".removeprefix(f"{path}: ")))
    return problems


def _fingerprint(block_crcs: np.ndarray) -> int:
    return zlib.crc32(block_crcs.astype("<u4").tobytes())


def remove_copies(directory: Path, *, below: int | None = None, beyond: int | None = None) -> int:
    """Delete the copies whose stretch ends at or below seq `below` (retention dropped it), or
    ends past `beyond` (more than is committed: a repaired shard), and interrupted writes of
    copies. Returns how many files went."""
    if not directory.is_dir():
        return 0
    removed = 0
    for path in directory.iterdir():
        bounds = parse_copy_name(path.name)
        doomed = is_temporary(path.name) or (bounds is not None and (
            (below is not None and bounds[1] <= below) or (beyond is not None and bounds[1] > beyond)))
        if doomed and path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
    return removed
