"""Small Kafka helpers over kafka-python: create topics and wait until they are usable, find the
leader broker of every partition (the pipeline's shard key), read end offsets and topic retention,
check a job's source up front, produce records.

Each helper opens its own short-lived client: callers are tests, CLI commands and jobs that make a
handful of calls, so simplicity beats connection reuse here.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, TopicAlreadyExistsError

from msgindex.errors import BrokerError, InvalidOptionError, KafkaUnreachableError, TopicNotFoundError
from msgindex.storage.message import KEYS_PROPERTY as KEYS_HEADER
from msgindex.storage.message import UNIQ_KEY_PROPERTY as UNIQ_KEY_HEADER

DEFAULT_TIMEOUT_S = 60.0
SOURCE_CHECK_TIMEOUT_S = 15.0  # how long a job waits for Kafka before saying it cannot reach it
CLIENT_ID = "msgindex-admin"
# The messages an index holds are those consumers see: a transaction's records once it commits,
# never an aborted one's (Kafka's consumers default to read_uncommitted, which delivers both).
ISOLATION_LEVEL = "isolation.level"
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
RETENTION_MS = "retention.ms"
# Consumer settings kafka-python cannot take as the Java client does (JAAS, key stores): with any
# of them, kafka-python here would be refused where Spark's Kafka source is not.
JAVA_CLIENT_PREFIXES = ("security.", "sasl.", "ssl.")


@contextlib.contextmanager
def admin_client(bootstrap: str, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[KafkaAdminClient]:
    """A KafkaAdminClient for `bootstrap`, closed on exit; BrokerError when unreachable."""
    try:
        # kafka-python 3 waits for its bootstrap apart from requests (30 s by default): both bounded
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=CLIENT_ID,
                                 request_timeout_ms=int(timeout * 1000), bootstrap_timeout_ms=int(timeout * 1000))
    except KafkaError as error:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {error!r}") from error
    try:
        yield admin
    finally:
        admin.close()


def bootstrap_addresses(bootstrap: str, *, option: str = "--bootstrap-servers") -> list[tuple[str, int]]:
    """``[(host, port), ...]`` of a bootstrap list ``host:port[,host:port...]``; an
    InvalidOptionError naming `option` when an entry is not of that form."""
    addresses = []
    for entry in (part.strip() for part in bootstrap.split(",")):
        host, sep, port = entry.rpartition(":")
        host = host.strip("[]")  # [::1]:9092
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidOptionError(f"{option} {bootstrap!r}: {entry!r} is not HOST:PORT")
        addresses.append((host, int(port)))
    return addresses


def needs_java_client(consumer_options: Mapping[str, str]) -> bool:
    """Whether a source configured with these Kafka consumer settings (the job's
    ``--kafka-option``s) is only reachable with the Java client's security settings."""
    return any(key.startswith(JAVA_CLIENT_PREFIXES) for key in consumer_options)


def check_source(bootstrap: str, *, topics: Iterable[str] | None = None, pattern: str | None = None,
                 timeout: float = SOURCE_CHECK_TIMEOUT_S, consumer_options: Mapping[str, str] | None = None) -> list[str]:
    """Check, within about `timeout` seconds, that Kafka answers at `bootstrap` and that every
    topic in `topics` exists (or that `pattern` matches at least one); the topics found.

    What a streaming job would otherwise find out after minutes of retries, buried in a stack
    trace, is said in one line naming the host, address or topic: KafkaUnreachableError,
    TopicNotFoundError, InvalidOptionError (a malformed bootstrap list). With
    `consumer_options` that need the Java client (``needs_java_client``) only the addresses are
    checked (a TCP connection) and `topics` are returned unchecked (a pattern: an empty list)."""
    addresses = bootstrap_addresses(bootstrap)
    _require_a_listener(bootstrap, addresses, timeout)
    if needs_java_client(consumer_options or {}):
        return list(topics or ())
    try:
        # two requests at most (the client's bootstrap, then the listing): each gets half the time
        with admin_client(bootstrap, timeout / 2) as admin:
            existing = sorted(name for name in admin.list_topics() if not name.startswith("__"))
    except (BrokerError, KafkaError) as error:
        raise KafkaUnreachableError(
            f"Kafka at {bootstrap} accepted a connection but did not answer as a Kafka broker within "
            f"{timeout:g} s ({type(error).__name__})"
        ) from None
    if pattern is not None:
        matched = [name for name in existing if re.fullmatch(pattern, name)]
        if not matched:
            raise TopicNotFoundError(
                f"--subscribe-pattern {pattern!r} matches no topic on {bootstrap} (topics: {_some(existing)})"
            )
        return matched
    wanted = list(topics or ())
    missing = [name for name in wanted if name not in existing]
    if missing:
        hints = {name: difflib.get_close_matches(name, existing, n=1) for name in missing}
        named = ", ".join(f"{name!r}" + (f" (did you mean {hints[name][0]!r}?)" if hints[name] else "")
                          for name in missing)
        raise TopicNotFoundError(f"topic {named} does not exist on {bootstrap} (topics: {_some(existing)})")
    return wanted


def _require_a_listener(bootstrap: str, addresses: list[tuple[str, int]], timeout: float) -> None:
    """KafkaUnreachableError unless at least one bootstrap address accepts a TCP connection."""
    problems = []
    for host, port in addresses:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            problems.append(f"host {host!r} does not resolve ({error.strerror})")
            continue
        for family, kind, proto, _, address in infos:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.settimeout(timeout / max(len(addresses), 1))
                    probe.connect(address)
                return
            except OSError as error:
                reason = "timed out" if isinstance(error, TimeoutError) else (error.strerror or str(error))
                problems.append(f"{host}:{port}: {reason}")
                break
    raise KafkaUnreachableError(f"no Kafka broker answers at {bootstrap}: {'; '.join(problems)}")


def _some(names: list[str], shown: int = 10) -> str:
    if not names:
        return "none"
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def create_topics(bootstrap: str, topics: Mapping[str, int] | Iterable[str], *, partitions: int = 1,
                  configs: Mapping[str, str] | None = None, exist_ok: bool = False,
                  timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Create topics (a name -> partition count mapping, or names that all get `partitions`) with
    replication factor 1 and return their names once every partition has a leader."""
    counts = dict(topics) if isinstance(topics, Mapping) else {name: partitions for name in topics}
    spec = {name: {"num_partitions": count, "replication_factor": 1, "configs": dict(configs or {})}
            for name, count in counts.items()}
    with admin_client(bootstrap, timeout) as admin:
        try:
            admin.create_topics(spec, timeout_ms=int(timeout * 1000))
        except TopicAlreadyExistsError:
            if not exist_ok:
                raise BrokerError(f"topic(s) {sorted(counts)} already exist on {bootstrap}") from None
        except KafkaError as error:
            raise BrokerError(f"creating topics {sorted(counts)} on {bootstrap} failed: {error!r}") from error
        admin.wait_for_topics(list(counts), timeout_ms=int(timeout * 1000))
    return list(counts)


def partition_leaders(bootstrap: str, topics: Iterable[str] | None = None,
                      timeout: float = DEFAULT_TIMEOUT_S) -> dict[tuple[str, int], int]:
    """``{(topic, partition): leader broker id}`` for `topics` (default: every non-internal topic).
    A partition without a leader maps to -1."""
    with admin_client(bootstrap, timeout) as admin:
        described = admin.describe_topics(list(topics) if topics is not None else None)
    leaders = {}
    for topic in described:
        if topic.get("is_internal"):
            continue
        for part in topic["partitions"]:
            leaders[(topic["name"], part["partition_index"])] = part["leader_id"]
    return leaders


NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"  # what brokers without topic ids (Kafka < 2.8) give


def topic_ids(bootstrap: str, topics: Iterable[str], timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """Kafka's id of each of `topics` (KIP-516: a topic deleted and created again under its name
    gets a new one); a topic the brokers give no id is left out."""
    wanted = list(topics)
    if not wanted:
        return {}
    with admin_client(bootstrap, timeout) as admin:
        try:
            described = admin.describe_topics(wanted)
        except KafkaError as error:
            raise BrokerError(f"describing topics {wanted} on {bootstrap} failed: {error!r}") from error
    return {topic["name"]: str(topic["topic_id"]) for topic in described
            if not topic.get("error_code") and topic.get("topic_id") and str(topic["topic_id"]) != NO_TOPIC_ID}


def topic_retention_ms(bootstrap: str, topics: Iterable[str], timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
    """``{topic: retention.ms}`` as the brokers apply it (the topic's own setting, else the
    broker's default); -1 means no deletion by age."""
    wanted = list(topics)
    if not wanted:
        return {}
    with admin_client(bootstrap, timeout) as admin:
        try:
            described = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, configs=[RETENTION_MS]) for name in wanted],
                config_filter="all")
        except KafkaError as error:
            raise BrokerError(f"reading {RETENTION_MS} of topics {wanted} on {bootstrap} failed: {error!r}") from error
    found = {}
    for name in wanted:
        entry = described.get("topic", {}).get(name, {}).get(RETENTION_MS)
        if entry is None or entry.get("value") is None:
            raise BrokerError(f"{bootstrap} did not say the {RETENTION_MS} of topic {name!r}")
        found[name] = int(entry["value"])
    return found


def broker_addresses(bootstrap: str, timeout: float = DEFAULT_TIMEOUT_S) -> dict[int, str]:
    """``{broker id: "host:port"}`` of the cluster's live brokers."""
    with admin_client(bootstrap, timeout) as admin:
        cluster = admin.describe_cluster()
    return {b["broker_id"]: f"{b['host']}:{b['port']}" for b in cluster["brokers"]}


def latest_offsets(bootstrap: str, topics: Iterable[str], timeout: float = DEFAULT_TIMEOUT_S, *,
                   consumer: KafkaConsumer | None = None) -> dict[tuple[str, int], int]:
    """``{(topic, partition): end offset}`` (the offset the next record will get). `consumer`: one
    from ``offsets_consumer`` to reuse across calls (creating one costs a metadata round trip and
    ~100 ms of CPU); without it a consumer is made and closed here."""
    own = consumer is None
    if own:
        consumer = offsets_consumer(bootstrap, timeout)
    try:
        wanted = []
        for topic in topics:
            found = consumer.partitions_for_topic(topic)
            if not found:
                raise BrokerError(f"topic {topic!r} does not exist on {bootstrap}")
            wanted.extend(TopicPartition(topic, p) for p in sorted(found))
        ends = consumer.end_offsets(wanted)
    finally:
        if own:
            consumer.close()
    return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}


def earliest_offsets(bootstrap: str, partitions: Iterable[tuple[str, int]], timeout: float = DEFAULT_TIMEOUT_S
                     ) -> dict[tuple[str, int], int]:
    """``{(topic, partition): earliest offset Kafka still retains}`` for the `partitions` that
    exist (a deleted topic's are left out)."""
    consumer = offsets_consumer(bootstrap, timeout)
    try:
        wanted = [TopicPartition(topic, partition) for topic, partition in partitions
                  if partition in (consumer.partitions_for_topic(topic) or ())]
        starts = consumer.beginning_offsets(wanted) if wanted else {}
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): offset for tp, offset in starts.items()}


@dataclass(frozen=True)
class FetchedRecord:
    """One record read back from Kafka (the fields the pipeline sets aside with)."""

    offset: int
    timestamp_ms: int
    value: bytes | None


def fetch_records(bootstrap: str, topic: str, partition: int, start: int, end: int, *, limit: int,
                  timeout: float = DEFAULT_TIMEOUT_S, isolation_level: str = READ_COMMITTED) -> list[FetchedRecord]:
    """The records of `topic`-`partition` from offset `start` up to `end` (exclusive), at most
    `limit` of them, as a consumer of `isolation_level` reads them (the indexing job's); BrokerError
    when Kafka stops delivering for `timeout` seconds before that."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id=CLIENT_ID, enable_auto_commit=False,
                             request_timeout_ms=int(timeout * 1000) + 1000, max_poll_records=10_000,
                             isolation_level=isolation_level)
    where = TopicPartition(topic, partition)
    found: list[FetchedRecord] = []
    try:
        consumer.assign([where])
        consumer.seek(where, start)
        quiet_since = time.monotonic()
        while len(found) < limit and consumer.position(where) < end:
            batch = consumer.poll(timeout_ms=1000).get(where, [])
            if batch:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > timeout:
                raise BrokerError(f"reading {topic}-{partition} from offset {start} on {bootstrap}: no record "
                                  f"for {timeout:g} s (position {consumer.position(where)}, wanted up to {end})")
            found.extend(FetchedRecord(r.offset, r.timestamp, r.value) for r in batch if r.offset < end)
    except KafkaError as error:
        raise BrokerError(f"reading {topic}-{partition} from offset {start} on {bootstrap} failed: {error!r}") from error
    finally:
        consumer.close()
    return found[:limit]


def offsets_consumer(bootstrap: str, timeout: float = DEFAULT_TIMEOUT_S, *,
                     isolation_level: str = READ_COMMITTED) -> KafkaConsumer:
    """A consumer that only reads offsets (no group, no commits), for ``latest_offsets``: the end
    a consumer of `isolation_level` reads to (read_committed: the last stable offset)."""
    return KafkaConsumer(bootstrap_servers=bootstrap, client_id=CLIENT_ID,
                         request_timeout_ms=int(timeout * 1000) + 1000, enable_auto_commit=False,
                         isolation_level=isolation_level)


@dataclass(frozen=True)
class OutgoingRecord:
    """One record to produce: RocketMQ-style keys go in the `KEYS` (space separated) and
    `UNIQ_KEY` headers, the Kafka key as is."""

    key: bytes | str | None
    value: bytes | str | None = None
    partition: int | None = None
    timestamp_ms: int | None = None
    keys: tuple[str, ...] = ()
    uniq_key: str | None = None
    headers: tuple[tuple[str, bytes], ...] = field(default=())

    def header_list(self) -> list[tuple[str, bytes]]:
        extra = list(self.headers)
        if self.keys:
            extra.append((KEYS_HEADER, " ".join(self.keys).encode()))
        if self.uniq_key is not None:
            extra.append((UNIQ_KEY_HEADER, self.uniq_key.encode()))
        return extra


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def produce(bootstrap: str, topic: str, records: Iterable[OutgoingRecord],
            timeout: float = DEFAULT_TIMEOUT_S) -> list[tuple[int, int]]:
    """Produce `records` to `topic`, flush, and return each record's ``(partition, offset)`` in
    input order (so tests can compare with what a consumer reads back)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=CLIENT_ID, linger_ms=5,
                             request_timeout_ms=int(timeout * 1000))
    try:
        futures = [
            producer.send(topic, key=_as_bytes(r.key), value=_as_bytes(r.value), partition=r.partition,
                          timestamp_ms=r.timestamp_ms, headers=r.header_list())
            for r in records
        ]
        producer.flush(timeout=timeout)
        placed = []
        for future in futures:
            metadata = future.get(timeout=timeout)
            placed.append((metadata.partition, metadata.offset))
    except KafkaError as error:
        raise BrokerError(f"producing to {topic!r} on {bootstrap} failed: {error!r}") from error
    finally:
        producer.close(timeout=timeout)
    return placed
