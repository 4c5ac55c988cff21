"""The options of ``spark.read.format("msgindex")``, parsed and validated once.

Spark hands a Python data source its options lower-cased and as strings, so every option is
declared here by its lower-case name. Each parse error is an InvalidOptionError that names the
option and the value, and it surfaces when the DataFrame is defined (``load()``), not when a job
runs.

Option reference (names are case-insensitive):

============================  ==========================================================
``path``                      the store root (or, in rocketmq mode, a RocketMQ broker's store root
                              or index directory); required
``mode``                      ``store`` (default): a msgindex store; ``rocketmq``: a RocketMQ
                              broker's store root (the directory holding ``commitlog/`` and
                              ``index/``), every index hit verified against the commit log; or a
                              bare directory of broker IndexFiles, read as raw, unverified entries
``key``                       one key, verbatim (may contain any character, commas included)
``keys``                      several keys as a JSON array of strings: ``["a", "b,c"]``
``field.<name>``               one value of field <name> (``msgindex index --index-field`` /
                              ``--index-header``), verbatim: messages carrying it (several
                              such options: messages carrying any of them); not with key/keys
``topic``                     one topic, or several separated by commas (Kafka topic names
                              cannot contain commas)
``begin`` / ``end``           inclusive time window on the message timestamp: epoch
                              milliseconds (``1700000000000``), ISO-8601 (``2026-11-21T05:00:00Z``,
                              ``...+01:00``; without a zone, ``2026-11-21 05:00``, in the
                              session's time zone, as Spark reads ``where`` literals), or
                              relative to when the DataFrame is loaded (``-1h``, ``now``)
``maxNum``                    at most this many rows from a key lookup (over all shards)
``brokers``                   comma-separated shard (broker) names to read
``partitions``                comma-separated Kafka partition numbers
``fetchValues``               ``true``: add each found message's Kafka ``value`` and ``headers``
                              (rocketmq mode: the body, decompressed, and its ``properties``)
``kafka.bootstrap.servers``   the Kafka cluster that fetchValues reads from (only with it, mode store)
``hashSlotNum`` / ``indexNum``  (rocketmq mode) the sizing the IndexFiles were written with;
                              RocketMQ's defaults 5,000,000 / 20,000,000
``brokerName``                (rocketmq mode, store root) the rows' ``broker``; default: the
                              store directory's name
``storage.<name>``            an object store client option for an ``s3://``, ``gs://`` or
                              ``az://`` path (``storage.endpoint``, ``storage.allow_http``,
                              ``storage.region``, ...; see msgindex.storage.location); the
                              executors read the objects themselves with them (and with the
                              AWS_* / GOOGLE_* / AZURE_* variables of their environment)
============================  ==========================================================

``key``/``keys`` options select messages *indexed under* a key, i.e. the key is among the
message's ``keys`` column (RocketMQ's "query message by key"); a ``where key = ...`` filter is
about the ``key`` column, the message's primary key (see ``pushdown``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, tzinfo

from msgindex.errors import InvalidOptionError
from msgindex.storage.int_limits import INT32_MAX, INT64_MAX
from msgindex.storage.message import text_of_shown
from msgindex.storage.rocketmq.broker_store import is_broker_store
from msgindex.times import TimeInput, as_zone, current_ms, read_time

MODE_STORE = "store"
MODE_ROCKETMQ = "rocketmq"
MODES = (MODE_STORE, MODE_ROCKETMQ)

# RocketMQ's own IndexFile sizing (MessageStoreConfig defaults)
ROCKETMQ_HASH_SLOT_NUM = 5_000_000
ROCKETMQ_INDEX_NUM = 20_000_000

KNOWN_OPTIONS = frozenset({
    "path", "mode", "key", "keys", "topic", "begin", "end", "maxnum", "brokers", "partitions",
    "fetchvalues", "kafka.bootstrap.servers", "hashslotnum", "indexnum", "brokername",
})

STORAGE_OPTION_PREFIX = "storage."
FIELD_OPTION_PREFIX = "field."  # field.<name> = <value>
_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})
SESSION_TIME_ZONE_CONF = "spark.sql.session.timeZone"


def parse_time(option: str, value: str, now_ms: int) -> TimeInput:
    """A ``begin``/``end`` option (``msgindex.times``): relative times are fixed here, against
    `now_ms` (when the DataFrame is loaded); a time without a zone stays a wall-clock time until
    a task reads it in the session's zone (``session_zone``)."""
    given = read_time(option, value)
    if given.kind == "relative":
        return TimeInput("instant", given.resolve(now_ms=now_ms), given.text)
    return given


def session_zone() -> tzinfo:
    """The Spark session's time zone, inside a task: Spark hands every task the session's SQL
    settings as local properties (``spark.sql.session.timeZone`` when it was set); unset, Spark
    uses the JVM's default zone, which is the machine's (``TZ``, else /etc/localtime)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    zone = context.getLocalProperty(SESSION_TIME_ZONE_CONF) if context is not None else None
    return as_zone(zone) if zone else machine_zone()


def machine_zone() -> tzinfo:
    """This machine's zone as the JVM finds it: ``TZ``, else /etc/localtime, else UTC."""
    import os
    from zoneinfo import ZoneInfo

    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        return as_zone(name)
    try:
        with open("/etc/localtime", "rb") as tzfile:
            return ZoneInfo.from_file(tzfile)
    except (OSError, ValueError):
        return UTC


def parse_keys(option: str, value: str) -> tuple[str, ...]:
    """The ``keys`` option: a JSON array of strings (JSON, because keys may contain commas)."""
    try:
        keys = json.loads(value)
    except json.JSONDecodeError:
        keys = None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InvalidOptionError(
            f"option '{option}' = {value!r} is not a JSON array of strings, e.g. "
            f'["order-1", "order-2"] (for a single key use the option \'key\')'
        )
    return tuple(keys)


# str(b"...") as DataFrameReader.option makes of a bytes value (it passes str(value) on)
_BYTES_REPR = re.compile(r"""^b(['"]).*\1$""", re.DOTALL)


def parse_key(option: str, value: str) -> str:
    """The ``key`` option: a key as rows show it (``message.text_of_shown``: key bytes that are
    not UTF-8 as ``\\xNN``). Python bytes reach a data source as their repr (``b'...'``, pyspark's
    ``option`` calls str() on the value): refused, saying how to give the key."""
    if _BYTES_REPR.match(value):
        raise InvalidOptionError(
            f"option '{option}' = {value!r} looks like Python bytes that DataFrameReader.option turned into "
            f"text (str(bytes)); give the key as rows show it, non-UTF-8 bytes as \\xNN escapes (e.g. "
            f"\\xff for the byte 0xff), or look bytes up with msgindex.open(...).lookup(b'...'); a key that "
            f"really is this text goes through option 'keys' (a JSON array)")
    return text_of_shown(value)


def parse_fields(given: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    """The ``field.<name>`` options as (name, value) pairs (None: none). Spark hands options
    lower-cased, and field names match case-insensitively (storage/fields.py)."""
    pairs = []
    for option, value in sorted(given.items()):
        if not option.startswith(FIELD_OPTION_PREFIX):
            continue
        name = option[len(FIELD_OPTION_PREFIX):]
        if not name or not value:
            raise InvalidOptionError(f"option {option!r} = {value!r}: give {FIELD_OPTION_PREFIX}<name> = <value>")
        pairs.append((name, text_of_shown(value)))
    return tuple(pairs) or None


def _decimal(text: str) -> int:
    """An integer written in ASCII digits (Python's int() also reads other scripts' digits)."""
    text = text.strip()
    if not text.isascii():
        raise ValueError(text)
    return int(text)


def parse_positive_int(option: str, value: str) -> int:
    """A strictly positive integer option (at most int64's largest)."""
    try:
        number = _decimal(value)
    except ValueError:
        number = 0
    if not 0 < number <= INT64_MAX:
        raise InvalidOptionError(f"option '{option}' = {value!r} is not a positive integer (of at most {INT64_MAX})")
    return number


def parse_bool(option: str, value: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no), case-insensitive."""
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidOptionError(f"option '{option}' = {value!r} is not true or false")


def parse_names(option: str, value: str) -> tuple[str, ...]:
    """A comma-separated list of names (topics, brokers); empty items are an error."""
    names = tuple(part.strip() for part in value.split(","))
    if not names or any(not name for name in names):
        raise InvalidOptionError(f"option '{option}' = {value!r} has an empty name in its list")
    return names


def parse_name(option: str, value: str) -> str:
    """One non-empty name, taken verbatim (surrounding spaces stripped)."""
    name = value.strip()
    if not name:
        raise InvalidOptionError(f"option '{option}' = {value!r} is empty")
    return name


def parse_storage_options(path: str, given: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``storage.<name>`` options (checked against the path: they are for object stores)."""
    from msgindex.storage.location import parse_location

    options = {name[len(STORAGE_OPTION_PREFIX):]: value for name, value in given.items()
               if name.startswith(STORAGE_OPTION_PREFIX)}
    if any(not name for name in options):
        raise InvalidOptionError("option 'storage.' names no storage option (write storage.<name>, e.g. storage.endpoint)")
    try:
        parse_location(path, options or None)
    except InvalidOptionError as bad:
        raise InvalidOptionError(f"option 'path' = {path!r}: {bad}") from None
    return tuple(sorted(options.items()))


def parse_partitions(option: str, value: str) -> tuple[int, ...]:
    """A comma-separated list of Kafka partition numbers (>= 0)."""
    try:
        numbers = tuple(_decimal(part) for part in value.split(","))
    except ValueError:
        numbers = (-1,)
    if any(not 0 <= number <= INT32_MAX for number in numbers):
        raise InvalidOptionError(
            f"option '{option}' = {value!r} is not a comma-separated list of partition numbers"
        )
    return numbers


@dataclass(frozen=True)
class ReadOptions:
    """The validated options of one ``spark.read.format("msgindex")`` (see the module doc)."""

    path: str
    mode: str = MODE_STORE
    keys: tuple[str, ...] | None = None
    topics: tuple[str, ...] | None = None
    begin: TimeInput | None = None  # an instant, or a wall-clock time read in the session's zone
    end: TimeInput | None = None
    max_num: int | None = None
    brokers: tuple[str, ...] | None = None
    partitions: tuple[int, ...] | None = None
    fetch_values: bool = False
    bootstrap_servers: str | None = None
    hash_slot_num: int = ROCKETMQ_HASH_SLOT_NUM
    index_num: int = ROCKETMQ_INDEX_NUM
    broker_name: str | None = None
    broker_store: bool = False  # rocketmq mode: the path is a broker's store root (not bare index files)
    storage_options: tuple[tuple[str, str], ...] = ()  # object stores: storage.<name> options
    fields: tuple[tuple[str, str], ...] | None = None  # field.<name> options: (name, value) pairs

    @property
    def store_options(self) -> dict[str, str] | None:
        """The storage options as msgindex.open takes them (None: none given)."""
        return dict(self.storage_options) or None

    @property
    def begin_ms(self) -> int | None:
        """The window's start as planning can know it: exact, or for a time without a zone the
        earliest instant it can be in any zone (``window_in`` gives the exact one in a task)."""
        return None if self.begin is None else self.begin.planning_bounds()[0]

    @property
    def end_ms(self) -> int | None:
        """The window's end as planning can know it (the latest instant it can be)."""
        return None if self.end is None else self.end.planning_bounds()[1]

    @property
    def window_needs_zone(self) -> bool:
        return any(bound is not None and bound.needs_zone for bound in (self.begin, self.end))

    def window_in(self, zone: tzinfo) -> tuple[int | None, int | None]:
        """The exact (begin_ms, end_ms) with times without a zone read in `zone`."""
        return tuple(None if bound is None else bound.resolve(zone=zone) for bound in (self.begin, self.end))

    @property
    def verified_rocketmq(self) -> bool:
        """True for rocketmq mode on a broker's store root: verified rows, not raw entries."""
        return self.mode == MODE_ROCKETMQ and self.broker_store

    @classmethod
    def parse(cls, options: Mapping[str, str], now_ms: int | None = None) -> ReadOptions:
        """Validate Spark's (lower-cased, string) options; relative times count from `now_ms`
        (default: now)."""
        now_ms = current_ms() if now_ms is None else now_ms
        given = {name.lower(): value for name, value in options.items()}
        unknown = sorted(name for name in set(given) - KNOWN_OPTIONS
                         if not name.startswith((STORAGE_OPTION_PREFIX, FIELD_OPTION_PREFIX)))
        if unknown:
            raise InvalidOptionError(
                f"unknown option '{unknown[0]}' = {given[unknown[0]]!r}; msgindex knows: "
                f"{', '.join(sorted(KNOWN_OPTIONS))}"
            )
        path = given.get("path", "").strip()
        if not path:
            raise InvalidOptionError("option 'path' is missing: use .load(PATH) or .option('path', PATH)")
        mode = given.get("mode", MODE_STORE).strip().lower()
        if mode not in MODES:
            raise InvalidOptionError(f"option 'mode' = {given['mode']!r} is not one of {', '.join(MODES)}")
        if "key" in given and "keys" in given:
            raise InvalidOptionError(
                f"options 'key' = {given['key']!r} and 'keys' = {given['keys']!r} both given; use one"
            )
        keys = (parse_key("key", given["key"]),) if "key" in given else None
        if "keys" in given:
            keys = tuple(text_of_shown(key) for key in parse_keys("keys", given["keys"]))
        parsed = cls(
            path=path,
            mode=mode,
            keys=keys,
            topics=parse_names("topic", given["topic"]) if "topic" in given else None,
            begin=parse_time("begin", given["begin"], now_ms) if "begin" in given else None,
            end=parse_time("end", given["end"], now_ms) if "end" in given else None,
            max_num=parse_positive_int("maxNum", given["maxnum"]) if "maxnum" in given else None,
            brokers=parse_names("brokers", given["brokers"]) if "brokers" in given else None,
            partitions=parse_partitions("partitions", given["partitions"])
            if "partitions" in given else None,
            fetch_values=parse_bool("fetchValues", given["fetchvalues"])
            if "fetchvalues" in given else False,
            bootstrap_servers=given.get("kafka.bootstrap.servers"),
            hash_slot_num=parse_positive_int("hashSlotNum", given["hashslotnum"])
            if "hashslotnum" in given else ROCKETMQ_HASH_SLOT_NUM,
            index_num=parse_positive_int("indexNum", given["indexnum"])
            if "indexnum" in given else ROCKETMQ_INDEX_NUM,
            broker_name=parse_name("brokerName", given["brokername"]) if "brokername" in given else None,
            broker_store=mode == MODE_ROCKETMQ and is_broker_store(path),
            storage_options=parse_storage_options(path, given),
            fields=parse_fields(given),
        )
        parsed._check_combinations(given)
        return parsed

    def _check_combinations(self, given: Mapping[str, str]) -> None:
        if self.begin is not None and self.end is not None and (
                self.begin.ms > self.end.ms if self.begin.kind == self.end.kind else self.begin_ms > self.end_ms):
            raise InvalidOptionError(
                f"option 'begin' = {given['begin']!r} is after option 'end' = {given['end']!r}"
            )
        if self.fetch_values and self.mode == MODE_STORE and not self.bootstrap_servers:
            raise InvalidOptionError(
                "option 'fetchValues' = 'true' needs option 'kafka.bootstrap.servers'"
            )
        # Given without fetchValues it would do nothing: a user who meant values would get rows
        # without them and no word why. (fetchValues = 'false' says so: a notebook's switch.)
        if self.bootstrap_servers is not None and "fetchvalues" not in given:
            raise InvalidOptionError(
                f"option 'kafka.bootstrap.servers' = {self.bootstrap_servers!r} is read only with option "
                f"'fetchValues' = 'true' (which adds each message's value and headers); add it or drop this one")
        if self.bootstrap_servers is not None and self.mode == MODE_ROCKETMQ:
            raise InvalidOptionError(
                f"option 'kafka.bootstrap.servers' = {self.bootstrap_servers!r} is for a msgindex store: in mode "
                f"'rocketmq' fetchValues reads the broker's own commitlog")
        if self.fetch_values and self.mode == MODE_ROCKETMQ and not self.broker_store:
            raise InvalidOptionError(
                f"option 'fetchValues' in mode 'rocketmq' needs a broker's store root (holding "
                f"commitlog/ and index/); {self.path!r} is not one"
            )
        for name in ("hashSlotNum", "indexNum"):
            if name.lower() in given and self.mode == MODE_STORE:
                raise InvalidOptionError(
                    f"option '{name}' = {given[name.lower()]!r} sizes a RocketMQ index file: it needs option "
                    f"'mode' = 'rocketmq' (a msgindex store records its own sizes)")
        if self.broker_name is not None and not self.verified_rocketmq:
            raise InvalidOptionError(
                f"option 'brokerName' = {given['brokername']!r} names the broker of a RocketMQ store "
                f"root: it needs option 'mode' = 'rocketmq' and a path holding commitlog/ and index/"
            )
        if self.fields is not None and (self.keys is not None or self.mode != MODE_STORE):
            raise InvalidOptionError(
                f"option '{FIELD_OPTION_PREFIX}{self.fields[0][0]}' finds messages by a field of a msgindex store: "
                f"not with option 'key'/'keys' (one read asks one thing) nor in mode 'rocketmq'")
        if self.max_num is not None and self.keys is None:
            raise InvalidOptionError(
                f"option 'maxNum' = {given['maxnum']!r} limits key lookups and needs 'key' or "
                f"'keys'; limit a scan with DataFrame.limit()"
            )
        # A store root can verify a key by scanning when no topic (from this option or a pushed
        # filter) gives the hash; raw index entries cannot, and a global maxNum needs the lookup.
        if (self.mode == MODE_ROCKETMQ and self.keys is not None and self.topics is None
                and (not self.broker_store or self.max_num is not None)):
            raise InvalidOptionError(
                "option 'key'/'keys' in mode 'rocketmq' needs option 'topic': RocketMQ hashes "
                "topic + '#' + key"
            )
