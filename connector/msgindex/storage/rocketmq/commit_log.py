"""RocketMQ's commit log, read in place: the broker's message files, by physical offset.

Files: ``<store root>/commitlog/<20-digit start offset>``, each exactly ``mappedFileSizeCommitLog``
bytes (default 1 GiB; the broker preallocates every file, and refuses to load one of another
size). A file's name is the commit-log offset of its first byte, so file i + 1 starts where file i
ends. Messages never span two files: a message that would not fit (with 8 bytes to spare) is
replaced by a blank end-of-file marker ``[i32 bytes left in the file][i32 BLANK_MAGIC]`` and goes
to the next file. Past the last message of the newest file the bytes are zero (TOTALSIZE and
MAGIC read 0): that is the end of the log.

One stored message, big-endian (``MessageExtEncoder`` writes it, ``CommitLog.
checkMessageAndReturnSize`` reads it)::

    offset  size      field
    0       4         TOTALSIZE          i32  bytes of the whole record
    4       4         MAGICCODE          i32  MAGIC_V1 (1-byte topic length) or MAGIC_V2 (2-byte)
    8       4         BODYCRC            i32  CRC32(stored body) & 0x7FFFFFFF
    12      4         QUEUEID            i32
    16      4         FLAG               i32  the producer's flag (user data)
    20      8         QUEUEOFFSET        i64  position in the consume queue
    28      8         PHYSICALOFFSET     i64  this record's own commit-log offset
    36      4         SYSFLAG            i32  see SYSFLAG_* below
    40      8         BORNTIMESTAMP      i64  ms, the producer's clock
    48      8 | 20    BORNHOST           4-byte IPv4 or 16-byte IPv6 address, i32 port
    +       8         STORETIMESTAMP     i64  ms, the broker's clock, taken under its put lock
    +       8 | 20    STOREHOST          as BORNHOST
    +       4         RECONSUMETIMES     i32
    +       8         PREPAREDTXOFFSET   i64
    +       4         BODYLEN            i32, then the body (compressed when SYSFLAG says so)
    +       1 | 2     TOPICLEN           v1: signed byte, v2: i16; then the UTF-8 topic
    +       2         PROPERTIESLEN      i16; then the properties

Properties: UTF-8 ``name \\x01 value \\x02`` pairs, every pair (the last one too) ending in
``\\x02``. Java's decoder (``string2messageProperties``) skips a pair whose name or value is
empty and lets a later pair of the same name win; ``parse_properties`` does the same and refuses
what the broker cannot have written (not UTF-8, no final ``\\x02``, a pair without ``\\x01``).

Reading maps one window of a file at a time (``WINDOW_BYTES``, never past the file's size as
checked before mapping: a page past the end of a file is SIGBUS) and keeps a few windows in an
LRU, so neither a whole 1 GiB file nor every file stays mapped. A torn, truncated or otherwise
invalid record is a CorruptFileError naming the file and offset, never a row.
"""

from __future__ import annotations

import bisect
import ipaddress
import mmap
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import pyarrow as pa

from msgindex.errors import CorruptFileError, InvalidOptionError, StoreNotFoundError
from msgindex.storage.rocketmq.message_keys import KEYS_PROPERTY, UNIQ_KEY_PROPERTY, keys_tokens, message_keys

COMMIT_LOG_DIR = "commitlog"
FILE_NAME_DIGITS = 20

MAGIC_V1 = -626843481  # 0xDAA320A7 as a Java int: topic length in 1 byte
MAGIC_V2 = -626843477  # 0xDAA320AB: topic length in 2 bytes (topics longer than 127)
BLANK_MAGIC = -875286124  # 0xCBD43194: the rest of the file is empty
BLANK_MARKER_SIZE = 8  # [i32 bytes left][i32 BLANK_MAGIC]

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_TRANSACTION_MASK = 0x3 << 2
SYSFLAG_BORN_HOST_V6 = 0x1 << 4
SYSFLAG_STORE_HOST_V6 = 0x1 << 5
SYSFLAG_COMPRESSION_SHIFT = 8
SYSFLAG_COMPRESSION_MASK = 0x7 << SYSFLAG_COMPRESSION_SHIFT

NAME_VALUE_SEPARATOR = b"\x01"
PROPERTY_SEPARATOR = b"\x02"

# The fixed head: TOTALSIZE .. BORNTIMESTAMP.
HEAD_SIZE = 48
HEAD_STRUCT = struct.Struct(">iiiiiqqiq")
HEAD_DTYPE = np.dtype([
    ("total_size", ">i4"), ("magic", ">i4"), ("body_crc", ">i4"), ("queue_id", ">i4"),
    ("flag", ">i4"), ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"),
    ("born_timestamp", ">i8"),
])
assert HEAD_STRUCT.size == HEAD_DTYPE.itemsize == HEAD_SIZE
SYS_FLAG_POSITION = 36
SYS_FLAG_STRUCT = struct.Struct(">i")
PREFIX_STRUCT = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE: what every record (and a blank) starts with
IPV4_HOST_SIZE, IPV6_HOST_SIZE = 8, 20  # address + i32 port
PORT_STRUCT = struct.Struct(">i")
TOTAL_SIZE_STRUCT = PORT_STRUCT  # both are one big-endian i32
STORE_TIMESTAMP_STRUCT = struct.Struct(">q")
TAIL_STRUCT = struct.Struct(">iqi")  # RECONSUMETIMES, PREPAREDTXOFFSET, BODYLEN
TOPIC_LENGTH_STRUCTS = {MAGIC_V1: struct.Struct(">b"), MAGIC_V2: struct.Struct(">h")}
PROPERTIES_LENGTH_STRUCT = struct.Struct(">h")
# The fixed part up to BODYLEN in one unpack, per (born host IPv6, store host IPv6).
FIXED_STRUCTS = {
    (born_v6, store_v6): struct.Struct(
        f">{HEAD_STRUCT.format[1:]}{IPV6_HOST_SIZE if born_v6 else IPV4_HOST_SIZE}s"
        f"{STORE_TIMESTAMP_STRUCT.format[1:]}{IPV6_HOST_SIZE if store_v6 else IPV4_HOST_SIZE}s{TAIL_STRUCT.format[1:]}"
    )
    for born_v6 in (False, True) for store_v6 in (False, True)
}
assert HEAD_DTYPE.fields["sys_flag"][1] == SYS_FLAG_POSITION
assert FIXED_STRUCTS[False, False].size == HEAD_SIZE + 2 * IPV4_HOST_SIZE + STORE_TIMESTAMP_STRUCT.size + TAIL_STRUCT.size
# the smallest record: IPv4 hosts, v1, empty body, topic and properties
MIN_MESSAGE_SIZE = (HEAD_SIZE + IPV4_HOST_SIZE + STORE_TIMESTAMP_STRUCT.size + IPV4_HOST_SIZE
                    + TAIL_STRUCT.size + 1 + PROPERTIES_LENGTH_STRUCT.size)
assert MIN_MESSAGE_SIZE == 91  # FACTS: with IPv4 hosts and v1, size = 91 + body + topic + properties

WINDOW_BYTES = 64 << 20  # bytes of a file mapped at once
# A window maps this much beyond its stride, so that a record starting in it is (nearly always)
# wholly inside: RocketMQ's maxMessageSize defaults to 4 MiB. Larger records are read with pread.
WINDOW_OVERLAP = (4 << 20) + (64 << 10)
OPEN_WINDOWS = 8


class CompressionType(Enum):
    """Body compression named by SYSFLAG bits 8-10 (RocketMQ's ``CompressionType``; 0 is ZLIB
    for messages of versions without the bits)."""

    LZ4 = 1
    ZSTD = 2
    ZLIB = 3


def compression_of(sys_flag: int, *, where: str = "message") -> CompressionType | None:
    """How a stored body is compressed, or None when it is not."""
    if not sys_flag & SYSFLAG_COMPRESSED:
        return None
    value = (sys_flag & SYSFLAG_COMPRESSION_MASK) >> SYSFLAG_COMPRESSION_SHIFT
    if value == 0:
        return CompressionType.ZLIB
    try:
        return CompressionType(value)
    except ValueError:
        raise CorruptFileError(f"{where}: sysFlag {sys_flag:#x} names unknown compression type {value}") from None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as the commit log holds it. ``body`` is the stored (possibly compressed) body,
    None when it was not read; ``properties`` is the parsed name -> value map."""

    commit_log_offset: int
    size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    sys_flag: int
    born_timestamp: int
    born_host_bytes: bytes
    store_timestamp: int
    store_host_bytes: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    topic: str
    properties: dict[str, str]
    keys: tuple[str, ...]  # every distinct key the message is indexed under (``message_keys``)
    first_key: str | None  # the first KEYS token: its own key by RocketMQ convention (``setKeys(k)``)
    body: bytes | None = None

    @property
    def born_host(self) -> str:
        return format_host(self.born_host_bytes)

    @property
    def store_host(self) -> str:
        return format_host(self.store_host_bytes)

    def decoded_body(self, path: Path | str = "commit log") -> bytes | None:
        """The body as the producer sent it (decompressed when SYSFLAG says so)."""
        if self.body is None:
            return None
        return decompress_body(self.body, self.sys_flag, where=f"{path}: message at offset {self.commit_log_offset}")


def decompress_body(stored: bytes, sys_flag: int, *, where: str) -> bytes:
    """`stored` decompressed as SYSFLAG says (LZ4 and ZSTD are frame formats, ZLIB a zlib stream,
    as RocketMQ's compressors write them); a body that does not decompress is a CorruptFileError."""
    kind = compression_of(sys_flag, where=where)
    if kind is None:
        return stored
    try:
        if kind is CompressionType.ZLIB:
            return zlib.decompress(stored)
        with pa.CompressedInputStream(pa.BufferReader(stored), kind.name.lower()) as stream:
            return stream.read()
    except (zlib.error, OSError, pa.ArrowException) as error:
        raise CorruptFileError(f"{where}: {kind.name} body does not decompress ({error})") from None


def parse_properties(block: bytes, *, where: str) -> dict[str, str]:
    """The properties block of a message as a name -> value map (Java's pair rules, see the module
    docstring). Refuses, with a CorruptFileError naming `where`, a block the broker cannot have
    written: one that is not UTF-8, does not end with ``\\x02`` or holds a pair without ``\\x01``."""
    if not block:
        return {}
    if not block.endswith(PROPERTY_SEPARATOR):
        raise CorruptFileError(f"{where}: properties block does not end with \\x02 (torn or not a properties block)")
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptFileError(f"{where}: properties block is not UTF-8 ({error.reason} at byte {error.start})") from None
    properties: dict[str, str] = {}
    for pair in text[:-1].split("\x02"):
        name, separator, value = pair.partition("\x01")
        if not separator:
            if pair:
                raise CorruptFileError(f"{where}: property {pair[:40]!r} has no \\x01 between name and value")
            continue
        if name and value:  # Java skips a pair whose name or value is empty
            properties[name] = value
    return properties


def format_host(raw: bytes) -> str:
    """A BORNHOST/STOREHOST field as ``address:port`` (``[v6]:port`` for IPv6)."""
    address = ipaddress.ip_address(raw[:-4])
    port = PORT_STRUCT.unpack_from(raw, len(raw) - 4)[0]
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def commit_log_file_name(start_offset: int) -> str:
    """RocketMQ's name of the file that starts at `start_offset`: 20 zero-padded digits."""
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class CommitLogFile:
    """One commit-log file: where it starts in the log and how many bytes it has."""

    path: Path
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


class RecordKind(Enum):
    """What the bytes at an offset are."""

    MESSAGE = "message"
    BLANK = "blank"  # the blank end-of-file marker: the next message is in the next file
    END = "end"  # zeros: past the last message of the log


class CommitLog:
    """A broker's ``commitlog/`` directory, read by physical offset (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, *, window_bytes: int = WINDOW_BYTES,
                 open_windows: int = OPEN_WINDOWS, window_overlap: int = WINDOW_OVERLAP) -> None:
        self.directory = Path(directory)
        if window_bytes % mmap.ALLOCATIONGRANULARITY or window_bytes <= 0 or open_windows < 1 or window_overlap < 0:
            raise InvalidOptionError(
                f"CommitLog: window_bytes {window_bytes} must be a positive multiple of "
                f"{mmap.ALLOCATIONGRANULARITY}, open_windows {open_windows} >= 1, window_overlap {window_overlap} >= 0"
            )
        self.window_bytes = window_bytes
        self.open_windows = open_windows
        self.window_overlap = window_overlap
        # keyed by ((file start, file size), window start)
        self._windows: OrderedDict[tuple[tuple[int, int], int], memoryview] = OrderedDict()
        self._maps: dict[tuple[tuple[int, int], int], mmap.mmap] = {}
        self._version: int | None = None
        self.files: list[CommitLogFile] = []
        self._starts: list[int] = []
        self.refresh()

    def refresh(self) -> None:
        """List the files again if the directory changed (a running broker adds files and its
        retention deletes the oldest); windows of files that are gone are unmapped."""
        try:
            version = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            raise StoreNotFoundError(f"{self.directory}: no such commit-log directory") from None
        if version == self._version:
            return
        self.files = _list_files(self.directory)
        self._starts = [f.start for f in self.files]
        self._version = version
        present = {(f.start, f.size) for f in self.files}
        for key in [key for key in self._windows if key[0] not in present]:
            self._release(key)

    # ----------------------------------------------------------------- geometry
    @property
    def min_offset(self) -> int:
        """Offset of the oldest byte still on disk (older files are deleted by retention)."""
        return self.files[0].start if self.files else 0

    @property
    def end_offset(self) -> int:
        """One past the last byte of the newest file (not of the last message)."""
        return self.files[-1].end if self.files else 0

    def file_at(self, offset: int) -> CommitLogFile:
        """The file holding `offset`; a CorruptFileError when no file does."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset >= self.files[i].end:
            raise CorruptFileError(
                f"{self.directory}: commit-log offset {offset} is in no file (the files cover "
                f"[{self.min_offset}, {self.end_offset}))"
            )
        return self.files[i]

    def next_file_start(self, offset: int) -> int | None:
        """Start of the file after the one holding `offset`, None for the newest file."""
        i = bisect.bisect_right(self._starts, offset)
        return self.files[i].start if i < len(self.files) else None

    # ----------------------------------------------------------------- reading
    def kind_at(self, offset: int) -> RecordKind:
        """Message, blank marker or end of log at `offset` (a record boundary)."""
        file = self.file_at(offset)
        position = offset - file.start
        if file.size - position < BLANK_MARKER_SIZE:
            raise CorruptFileError(
                f"{file.path}: offset {offset} (position {position}) leaves {file.size - position} "
                f"bytes, too few for a record header (truncated file?)"
            )
        total, magic = PREFIX_STRUCT.unpack(self._read(file, position, BLANK_MARKER_SIZE))
        if magic in (MAGIC_V1, MAGIC_V2):
            return RecordKind.MESSAGE
        if magic == BLANK_MAGIC:
            if total != file.size - position:
                raise CorruptFileError(
                    f"{file.path}: blank end-of-file marker at offset {offset} says {total} bytes "
                    f"are left, the file has {file.size - position}"
                )
            return RecordKind.BLANK
        if total == 0 and magic == 0:
            return RecordKind.END
        raise CorruptFileError(
            f"{file.path}: wrong magic code {magic & 0xFFFFFFFF:#010x} at offset {offset} "
            f"(position {position}): not the start of a message"
        )

    def read_message(self, offset: int, *, with_body: bool = False) -> StoredMessage:
        """The message stored at `offset`, validated; a CorruptFileError naming file and offset
        when the bytes there are not one whole, consistent message."""
        file = self.file_at(offset)
        position = offset - file.start
        if file.size - position >= BLANK_MARKER_SIZE:
            total, magic = PREFIX_STRUCT.unpack(self._read(file, position, BLANK_MARKER_SIZE))
            if magic in TOPIC_LENGTH_STRUCTS and MIN_MESSAGE_SIZE <= total <= file.size - position:
                # the usual case, checked without a second read; anything else is explained below
                return decode_message(self._read(file, position, total), offset, with_body=with_body,
                                      where=f"{file.path}: message at offset {offset}")
        kind = self.kind_at(offset)
        if kind is not RecordKind.MESSAGE:
            what = "the blank end-of-file marker" if kind is RecordKind.BLANK else "zeros (past the last message)"
            raise CorruptFileError(f"{file.path}: message at offset {offset}: found {what}, not a message")
        total = self._message_size(file, offset)
        return decode_message(self._read(file, position, total), offset, with_body=with_body,
                              where=f"{file.path}: message at offset {offset}")

    def _message_size(self, file: CommitLogFile, offset: int) -> int:
        """TOTALSIZE of the message at `offset`, checked to lie inside `file`."""
        position = offset - file.start
        (total,) = TOTAL_SIZE_STRUCT.unpack(self._read(file, position, 4))
        if total < MIN_MESSAGE_SIZE or position + total > file.size:
            raise CorruptFileError(
                f"{file.path}: message at offset {offset}: TOTALSIZE {total} is impossible here "
                f"(the file has {file.size - position} bytes from this offset): torn or truncated"
            )
        return total

    def iter_offsets(self, start: int, end: int | None = None) -> Iterator[tuple[int, RecordKind]]:
        """(offset, kind) of the records from `start` (a record boundary) up to `end` (or the end
        of the log), hopping blank markers to the next file; stops after an END."""
        offset = max(start, self.min_offset)
        while self.files and (end is None or offset < end):
            kind = self.kind_at(offset)
            if kind is RecordKind.END:
                yield offset, kind
                return
            if kind is RecordKind.BLANK:
                following = self.next_file_start(offset)
                if following is None:
                    return
                offset = following
                continue
            yield offset, kind
            offset += self._message_size(self.file_at(offset), offset)
            if offset == self.end_offset:  # the newest file is full to its last byte
                return

    def _read(self, file: CommitLogFile, position: int, length: int) -> memoryview | bytes:
        """`length` bytes at `position` of `file` (the caller checked they are inside the file)."""
        stride = self.window_bytes
        window_start = position - position % stride
        if position + length <= window_start + stride + self.window_overlap:
            view = self._window(file, window_start)
            if position + length - window_start <= len(view):
                return view[position - window_start : position - window_start + length]
        with open(file.path, "rb") as handle:  # a record larger than the overlap: rare
            data = os.pread(handle.fileno(), length, position)
        if len(data) != length:
            raise CorruptFileError(f"{file.path}: file shrank while reading {length} bytes at position {position}")
        return data

    def _window(self, file: CommitLogFile, window_start: int) -> memoryview:
        key = ((file.start, file.size), window_start)
        view = self._windows.get(key)
        if view is not None:
            self._windows.move_to_end(key)
            return view
        try:
            handle = open(file.path, "rb")
        except FileNotFoundError:
            raise CorruptFileError(f"{file.path}: the commit-log file is gone (deleted by the broker's retention?)") from None
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if size < file.size:
                raise CorruptFileError(f"{file.path}: file is {size} bytes now, {file.size} when listed (truncated?)")
            length = min(self.window_bytes + self.window_overlap, file.size - window_start)
            mapped = mmap.mmap(handle.fileno(), length, access=mmap.ACCESS_READ, offset=window_start)
        view = memoryview(mapped)
        self._maps[key] = mapped
        self._windows[key] = view
        while len(self._windows) > self.open_windows:
            self._release(next(iter(self._windows)))
        return view

    def _release(self, key: tuple[tuple[int, int], int]) -> None:
        view = self._windows.pop(key)
        view.release()
        try:
            self._maps.pop(key).close()
        except BufferError:
            pass  # a caller still holds a slice of it: unmapped when that is dropped

    def close(self) -> None:
        """Unmap every window."""
        for key in list(self._windows):
            self._release(key)

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CommitLog({str(self.directory)!r}, {len(self.files)} files)"


def decode_message(record: bytes | bytearray | memoryview, offset: int, *, with_body: bool = False,
                   where: str = "") -> StoredMessage:
    """Decode one whole record (`record` holds exactly TOTALSIZE bytes) stored at `offset`."""
    where = where or f"message at offset {offset}"
    record = bytes(record)  # one small copy: slicing and unpacking bytes is faster than a mapped view
    total = len(record)
    if total < HEAD_SIZE:
        raise CorruptFileError(f"{where}: {total} bytes, too few for a message")
    (sys_flag,) = SYS_FLAG_STRUCT.unpack_from(record, SYS_FLAG_POSITION)
    fixed_struct = FIXED_STRUCTS[bool(sys_flag & SYSFLAG_BORN_HOST_V6), bool(sys_flag & SYSFLAG_STORE_HOST_V6)]
    (size, magic, body_crc, queue_id, flag, queue_offset, physical, _, born_ts, born_host, store_ts,
     store_host, reconsume, prepared, body_len) = fixed_struct.unpack_from(record, 0)
    topic_struct = TOPIC_LENGTH_STRUCTS.get(magic)
    if topic_struct is None:
        raise CorruptFileError(f"{where}: wrong magic code {magic & 0xFFFFFFFF:#010x}")
    if size != total:
        raise CorruptFileError(f"{where}: TOTALSIZE {size}, but {total} bytes given")
    if physical != offset:
        raise CorruptFileError(f"{where}: the record says it is at offset {physical} (misplaced or corrupt)")
    fixed = fixed_struct.size + topic_struct.size + PROPERTIES_LENGTH_STRUCT.size
    if total < fixed:
        raise CorruptFileError(f"{where}: TOTALSIZE {total} is smaller than the fixed fields ({fixed} bytes)")
    if body_len < 0 or fixed + body_len > total:
        raise CorruptFileError(f"{where}: BODYLEN {body_len} does not fit TOTALSIZE {total}")
    position = fixed_struct.size
    body = record[position : position + body_len] if with_body else None
    position += body_len
    (topic_len,) = topic_struct.unpack_from(record, position)
    position += topic_struct.size
    if topic_len <= 0 or fixed + body_len + topic_len > total:
        raise CorruptFileError(f"{where}: topic length {topic_len} does not fit TOTALSIZE {total}")
    try:
        topic = record[position : position + topic_len].decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFileError(f"{where}: topic is not UTF-8") from None
    position += topic_len
    (properties_len,) = PROPERTIES_LENGTH_STRUCT.unpack_from(record, position)
    position += PROPERTIES_LENGTH_STRUCT.size
    if properties_len < 0 or position + properties_len != total:
        raise CorruptFileError(
            f"{where}: field lengths (body {body_len}, topic {topic_len}, properties "
            f"{properties_len}) do not add up to TOTALSIZE {total}"
        )
    properties = parse_properties(record[position:], where=where)
    keys_value = properties.get(KEYS_PROPERTY)
    tokens = keys_tokens(keys_value)
    return StoredMessage(
        commit_log_offset=offset, size=total, magic=magic, body_crc=body_crc, queue_id=queue_id,
        flag=flag, queue_offset=queue_offset, sys_flag=sys_flag, born_timestamp=born_ts,
        born_host_bytes=born_host, store_timestamp=store_ts, store_host_bytes=store_host,
        reconsume_times=reconsume, prepared_transaction_offset=prepared, topic=topic,
        properties=properties, body=body, first_key=tokens[0] if tokens else None,
        keys=message_keys(None, (keys_value,), (properties.get(UNIQ_KEY_PROPERTY),)),
    )


def _list_files(directory: Path) -> list[CommitLogFile]:
    """The commit-log files of `directory`, oldest first; every file must have the size of the
    others and start where the one before it ends (what the broker itself checks on load)."""
    if not directory.is_dir():
        raise StoreNotFoundError(f"{directory}: no such commit-log directory")
    files = []
    for entry in os.scandir(directory):
        name = entry.name
        if len(name) == FILE_NAME_DIGITS and name.isdigit() and name.isascii() and entry.is_file():
            files.append(CommitLogFile(Path(entry.path), int(name), entry.stat().st_size))
    files.sort(key=lambda f: f.start)
    for before, after in zip(files, files[1:]):
        if before.size != after.size:
            shorter = before if before.size < after.size else after
            raise CorruptFileError(
                f"{shorter.path}: {shorter.size} bytes, while {(after if shorter is before else before).path} "
                f"has {max(before.size, after.size)}: every commit-log file has the same size (truncated?)"
            )
        if before.end != after.start:
            raise CorruptFileError(
                f"{after.path}: starts at {after.start}, but {before.path} ends at {before.end} "
                f"(a commit-log file is missing or misnamed)"
            )
    for file in files:
        if file.size < BLANK_MARKER_SIZE:
            raise CorruptFileError(f"{file.path}: {file.size} bytes, too small for a commit-log file")
    return files
