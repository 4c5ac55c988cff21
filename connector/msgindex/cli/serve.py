"""msgindex serve: a search page for an index, in the browser.

examples:
  msgindex serve ./index
  msgindex serve ./index --bootstrap-servers 127.0.0.1:9092 --port 8080

Open the address it prints. Type a key (order-00321), pick a topic and a time window (-1h, now,
2026-11-25 10:00, epoch ms; times without a zone are UTC) and search: the messages indexed under
the key come back from the index itself, in time order, as a table with dates, a timeline of the
hits per topic and partition, and each message's payload on demand (fetched from Kafka by topic,
partition and offset: give --bootstrap-servers). Results are paginated. An index that indexes
fields (msgindex index --index-field/--index-header) is searched by any of them too (status =
declined), and each message shows the values it carries. Without a value the page lists the
messages of the time window, and says that it reads them all (a scan).

The page and its JSON API (GET /api/info, /api/search, /api/payload) are served by Python's
standard library, on 127.0.0.1 unless --host says otherwise: it has no login, so expose it only
where everyone who can reach it may read the index.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.cli.store_args import PATH_HELP, add_storage_options, open_store_of
from msgindex.errors import FieldCoverageWarning, InvalidOptionError, MsgIndexError
from msgindex.storage.fields import SHAPE_ARRAY, store_fields
from msgindex.storage.log.batch_format import field_schema
from msgindex.storage.query import Query
from msgindex.times import current_ms, format_ms, format_window, read_time

DEFAULT_PORT = 8080
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
TIMELINE_POINTS = 500  # above this many hits the timeline shows counts per time bin
TIMELINE_BINS = 120
TOPICS_TTL_S = 30.0  # how long the index's topic (and field) list is trusted before it is read again


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` subcommand."""
    parser = subparsers.add_parser(
        "serve", help="a search page for an index: keys, time windows, timeline, payloads",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_storage_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                        help="the Kafka cluster the index was built from, for payloads (optional)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit code 0."""
    store = open_store_of(args)
    app = SearchApp(store, args.path, args.bootstrap_servers)
    try:
        server = ThreadingHTTPServer((args.host, args.port), app.handler())
    except OSError as error:
        raise InvalidOptionError(f"--host {args.host} --port {args.port}: cannot listen there ({error.strerror})") from None
    host, port = server.server_address[:2]
    payloads = f"payloads from Kafka at {args.bootstrap_servers}" if args.bootstrap_servers \
        else "no payloads (give --bootstrap-servers)"
    print(f"msgindex serve: http://{host}:{port}/  (index {args.path}; {payloads}; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
    return 0


class BadRequest(Exception):
    """A request the page should show as a message next to `field` (HTTP 400)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SearchField:
    """What the search box can search by: ``key`` (every key a message is indexed under), or a
    field the index indexes (``msgindex index --index-field``/``--index-header``), whose values are
    looked up the same way. The page lists what /api/info returns."""

    name: str
    label: str
    help: str


KEY_FIELD = SearchField("key", "key", "the record key, or a token of its KEYS or UNIQ_KEY header")


def _search_fields(indexed: tuple[tuple[str, str], ...]) -> dict[str, SearchField]:
    """The key, then each indexed field (its (name, shape) as ``fields.store_fields`` gives it)."""
    fields = {KEY_FIELD.name: KEY_FIELD}
    for name, shape in indexed:
        fields[name] = SearchField(name, name, f"a value of the indexed field {name}"
                                               + (" (one of the values a message carries)" if shape == SHAPE_ARRAY else ""))
    return fields


class SearchApp:
    """The page's API over one open store (and, for payloads, one Kafka cluster)."""

    def __init__(self, store, path: str, bootstrap_servers: str | None) -> None:
        self.store = store
        self.path = path
        self.bootstrap_servers = bootstrap_servers
        self._store_lock = threading.Lock()  # a Store's cached readers are not shared between threads
        self._kafka_lock = threading.Lock()  # nor is a Kafka consumer
        self._page = resources.files("msgindex.cli").joinpath("search_page.html").read_bytes()
        self._topics: tuple[float, list[str]] = (0.0, [])  # (when read, the index's topics)
        self._fields: tuple[float, tuple[tuple[str, str], ...]] = (-TOPICS_TTL_S, ())  # (when read, its fields)

    # --- the API ----------------------------------------------------------------------------------
    def info(self, _params: dict[str, str]) -> dict[str, Any]:
        from msgindex.storage.maintenance.inspect import inspect_store

        with self._store_lock:
            report = inspect_store(self.store.root, verify=False)
            indexed = self._indexed_fields(fresh=True)
        shards = report["shards"]
        ranges = [segment["time_range"] for shard in shards for segment in shard.get("segments", [])
                  if segment.get("time_range")]
        low = min((r["min_ms"] for r in ranges), default=None)
        high = max((r["max_ms"] for r in ranges), default=None)
        return {
            "path": self.path,
            "messages": report["records"],
            "shards": [shard["broker"] for shard in shards],
            "topics": sorted({topic for shard in shards for topic in shard.get("topics", [])}),
            "time_range": {"begin": low, "end": high, "text": format_window(low, high) if ranges else "empty"},
            "fields": [{"name": f.name, "label": f.label, "help": f.help} for f in _search_fields(indexed).values()],
            "payloads": self.bootstrap_servers is not None,
            "now": current_ms(),
        }

    def search(self, params: dict[str, str]) -> dict[str, Any]:
        started = time.perf_counter()
        asked = params.get("field", "key")
        with self._store_lock:
            indexed = self._indexed_fields(fresh=asked not in _search_fields(self._fields[1]))
        fields = _search_fields(indexed)
        field = fields.get(asked)
        if field is None:
            raise BadRequest(f"no field {asked!r} to search by (fields: {', '.join(fields)})", "field")
        value = params.get("value", "")  # exactly as given: a key may begin or end with spaces
        topic = params.get("topic") or None
        now = current_ms()
        begin, end = (_time(name, params.get(name, ""), now) for name in ("begin", "end"))
        if begin is not None and end is not None and begin > end:
            raise BadRequest(f"begin {format_ms(begin)} is after end {format_ms(end)}: the window holds no time", "begin")
        page = _positive("page", params.get("page", "1"))
        size = min(_positive("size", params.get("size", str(PAGE_SIZE))), MAX_PAGE_SIZE)
        with self._store_lock:
            if topic is not None:
                self._check_topic(topic)
            if value:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", FieldCoverageWarning)
                    found = self.store.lookup(_query(field, value, topic, begin, end, indexed))
                total, more = found.num_rows, False
                rows = found.slice((page - 1) * size, size)
                timeline = _timeline(found)
                uncovered = dict.fromkeys(str(w.message) for w in caught if w.category is FieldCoverageWarning)
                notice = " ".join(uncovered) or None
            else:
                rows, more = self._scan(topic, begin, end, (page - 1) * size, size, indexed)
                total = None
                timeline = _timeline(rows)
                notice = ("No key: these are the messages of the time window, read one by one, shard by shard in "
                          "log order (a scan of " + ("the whole index" if begin is None and end is None
                                                      else "the window") + ", not a lookup); give a key to use the index.")
        return {
            "mode": "lookup" if value else "scan",
            "field": field.name, "value": value, "topic": topic,
            "window": {"begin": begin, "end": end, "text": format_window(begin, end)},
            "page": page, "size": size, "total": total, "more": more or (total is not None and page * size < total),
            "rows": _rows(rows, [name for name, _ in indexed]),
            "timeline": timeline,
            "notice": notice,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 2),
        }

    def payload(self, params: dict[str, str]) -> dict[str, Any]:
        from msgindex.cli.lookup import render_header, render_value
        from msgindex.spark.read.kafka_values import fetch_messages

        if self.bootstrap_servers is None:
            raise BadRequest("payloads come from Kafka: start msgindex serve with --bootstrap-servers HOST:PORT")
        try:
            topic, partition, offset = params["topic"], int(params["partition"]), int(params["offset"])
        except (KeyError, ValueError):
            raise BadRequest("a payload is asked by topic, partition and offset") from None
        started = time.perf_counter()
        with self._kafka_lock:
            record = fetch_messages(self.bootstrap_servers, [(topic, partition, offset)],
                                    what="--bootstrap-servers").get((topic, partition, offset))
        shown, text = render_value(None if record is None else record.value)
        return {
            "topic": topic, "partition": partition, "offset": offset,
            "value": {"format": shown, "text": text, "bytes": None if record is None or record.value is None
                      else len(record.value)},
            "headers": None if record is None else [{"key": k, "value": render_header(v)} for k, v in record.headers or []],
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 2),
        }

    def _check_topic(self, topic: str) -> None:
        from msgindex.cli.lookup import index_topics, unknown_name_message

        read_at, have = self._topics
        if topic not in have or time.monotonic() - read_at > TOPICS_TTL_S:  # a new topic is seen at once
            have = index_topics(self.store)
            self._topics = (time.monotonic(), have)
        if topic not in have:
            raise BadRequest(unknown_name_message("topic", topic, have), "topic")

    def _indexed_fields(self, *, fresh: bool) -> tuple[tuple[str, str], ...]:
        """(name, shape) of the fields the index indexes, read again when `fresh` or stale (a job
        may declare a field while the page is open). Under the store lock."""
        read_at, indexed = self._fields
        if fresh or time.monotonic() - read_at > TOPICS_TTL_S:
            indexed = store_fields(self.store)
            self._fields = (time.monotonic(), indexed)
        return indexed

    def _scan(self, topic: str | None, begin: int | None, end: int | None, skip: int, size: int,
              indexed: tuple[tuple[str, str], ...]) -> tuple[pa.Table, bool]:
        """Rows skip..skip+size of the window's scan, and whether more follow (one more is read)."""
        batches, seen, wanted = [], 0, skip + size + 1
        query = Query.of(begin_ms=begin, end_ms=end, topics=None if topic is None else [topic], field_columns=indexed)
        for batch in self.store.scan(query):
            batches.append(batch)
            seen += batch.num_rows
            if seen >= wanted:
                break
        table = pa.Table.from_batches(batches, schema=field_schema([(name, name, shape) for name, shape in indexed]))
        return table.slice(skip, size), table.num_rows > skip + size

    # --- HTTP --------------------------------------------------------------------------------------
    def handler(self) -> type[BaseHTTPRequestHandler]:
        app = self
        routes = {"/api/info": self.info, "/api/search": self.search, "/api/payload": self.payload}

        class Handler(BaseHTTPRequestHandler):
            """The page at / and the JSON API under /api/ (the `routes`), for one request."""

            server_version = "msgindex"

            def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
                url = urlsplit(self.path)
                if url.path in ("/", "/index.html"):
                    self._send(HTTPStatus.OK, app._page, "text/html; charset=utf-8")
                    return
                route = routes.get(url.path)
                if route is None:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {url.path}"})
                    return
                params = {name: values[-1] for name, values in parse_qs(url.query, keep_blank_values=True).items()}
                try:
                    self._json(HTTPStatus.OK, route(params))
                except BadRequest as bad:
                    self._json(HTTPStatus.BAD_REQUEST, {"error": str(bad), "field": bad.field})
                except MsgIndexError as error:
                    self._json(HTTPStatus.BAD_GATEWAY if "Kafka" in str(error) else HTTPStatus.BAD_REQUEST,
                               {"error": str(error).strip().splitlines()[0], "field": None})
                except Exception as error:  # the page shows it; the server keeps serving
                    self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(error).__name__}: {error}"})

            def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
                self._send(status, json.dumps(body, ensure_ascii=False).encode(), "application/json; charset=utf-8")

            def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
                sys.stderr.write(f"msgindex serve: {self.address_string()} {format % args}\n")

        return Handler


def _time(name: str, text: str, now: int) -> int | None:
    if not text.strip():
        return None
    try:
        return read_time(name, text).resolve(now_ms=now)
    except InvalidOptionError as bad:
        raise BadRequest(str(bad).replace("option ", "", 1), name) from None


def _positive(name: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number <= 0:
        raise BadRequest(f"{name} {text!r}: must be a positive number", name)
    return number


def _query(field: SearchField, value: str, topic: str | None, begin: int | None, end: int | None,
           indexed: tuple[tuple[str, str], ...]) -> Query:
    """The lookup of `value` (as rows show it: ``message.text_of_shown``) by `field`, its rows
    showing every `indexed` field."""
    from msgindex.storage.message import text_of_shown

    text = text_of_shown(value)
    asked = {"fields": {field.name: [text]}} if field is not KEY_FIELD else {"keys": text}
    return Query.of(**asked, topic=topic, begin_ms=begin, end_ms=end, field_columns=indexed)


def _rows(table: pa.Table, fields: list[str]) -> list[dict[str, Any]]:
    """The page's rows; ``fields``: each row's values of the indexed `fields` it carries."""
    stamps = table["timestamp"].cast(pa.int64()).to_pylist()
    carried = table.select(fields).to_pylist() if fields else [{}] * table.num_rows
    rows = []
    shown = table.select(["topic", "partition", "offset", "key", "keys", "broker"]).to_pylist()
    for row, micros, values in zip(shown, stamps, carried):
        row["timestamp"] = micros // 1000
        row["time"] = format_ms(micros // 1000)
        row["fields"] = {name: value for name, value in values.items() if value is not None}
        rows.append(row)
    return rows


def _timeline(table: pa.Table) -> dict[str, Any]:
    """Where the hits are in time, per topic-partition lane: each hit (up to TIMELINE_POINTS),
    else counts per time bin. Vectorized: a hot key has its millions of hits here."""
    if table.num_rows == 0:
        return {"lanes": [], "points": [], "bins": None}
    stamps = table["timestamp"].cast(pa.int64()).to_numpy() // 1000
    names = pc.binary_join_element_wise(table["topic"], pc.cast(table["partition"], pa.string()), "-")
    present = pc.unique(names).to_pylist()
    lanes = sorted(present, key=lambda name: (name.rpartition("-")[0], int(name.rpartition("-")[2])))
    lane_of = pc.index_in(names, value_set=pa.array(lanes, pa.string())).to_numpy()
    low, high = int(stamps.min()), int(stamps.max())
    if len(stamps) <= TIMELINE_POINTS:
        return {"lanes": lanes, "begin": low, "end": high, "bins": None,
                "points": np.stack([stamps, lane_of], axis=1).tolist()}
    width = max(1, -(-(high - low + 1) // TIMELINE_BINS))
    counts = np.zeros((len(lanes), TIMELINE_BINS), dtype=np.int64)
    np.add.at(counts, (lane_of, (stamps - low) // width), 1)
    return {"lanes": lanes, "begin": low, "end": high, "points": [],
            "bins": {"width": width, "counts": counts.tolist()}}
