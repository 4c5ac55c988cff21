"""The requests an object-store shard makes, through one well-kept client library: obstore
(Rust's ``object_store``, which delta-rs and Lance use).

Why obstore (measured against moto's server on loopback, BENCHMARKS.md): it has the two
operations the commit protocol and the readers need — put-if-absent (``mode="create"``: S3
``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure ``If-None-Match``) and ranged reads of
many ranges in parallel — for S3, GCS and Azure with the clouds' own credential chains, and a
ranged GET cost ~8 ms against s3fs's ~29 ms, 200 ranges 27 ms against 3.3 s. pyarrow.fs has no
put-if-absent.

Every call is counted by kind (``requests``): the benchmark and the tests hold the request
budget of a lookup and an append to account. Ranges are coalesced here (``coalesce_ranges``:
ranges closer than ``gap`` bytes become one request) and the library is told not to coalesce
again, so the counts are the requests sent.

Failures a user must act on become one ``ObjectStoreError`` line naming the store and what is
wrong (no bucket, access denied, the endpoint does not answer); a missing object is ``None`` (or
``False`` for a put-if-absent that lost), never an exception to interpret.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import numpy as np

from msgindex.errors import InvalidOptionError, ObjectStoreError
from msgindex.storage.location import StoreLocation

# Options that configure the HTTP client rather than the store (obstore's ClientConfig).
CLIENT_OPTIONS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_only", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate",
    "proxy_excludes", "randomize_addresses", "read_timeout", "timeout", "user_agent",
})
RETRY_OPTIONS = frozenset({"max_retries", "retry_timeout"})
# A user waiting on a lookup should hear of an endpoint that does not answer within seconds, not
# after obstore's default of 10 retries over 3 minutes; both are storage options.
DEFAULT_CLIENT = {"connect_timeout": "5s", "timeout": "60s"}
DEFAULT_RETRY = {"max_retries": 3, "retry_timeout": 20.0}
# Ranges closer than this are read by one GET (the bytes between included): a request costs
# ~10-30 ms of first-byte latency on S3, 256 kB of transfer about as much.
DEFAULT_GAP_BYTES = 256 * 1024
# ... up to this many bytes a request: bigger spans go as several requests in parallel (a store
# serves one stream at a fraction of its bandwidth; a many-key lookup reads most of a log).
MAX_REQUEST_BYTES = 2 * 1024 * 1024
LIST_CHUNK = 1000
T = TypeVar("T")
# object_store retries the transport failures it classifies as safe to retry; others end the call
# at once, retries left or not: an answer cut short (tests/storage/test_object_faults.py), and
# once in CI, under load, 2 connections closed on accept failed a LIST given 3 retries. A read is
# idempotent, so the client reads once more after this pause when the store allows retries at all.
READ_RETRY_PAUSE_S = 0.5
# ... unless the failed read took this long: an endpoint that stalls mid-answer (one byte a second)
# would otherwise hold a reader for two of the client's timeouts
READ_RETRY_MAX_FAILED_S = 5.0
# How the HTTP client words a connection the far side dropped (retried once more by reads) ...
DROPPED_MARKS = ("error sending request", "connection closed", "Connection reset", "IncompleteMessage", "body error")
# ... unless it never connected or timed out: object_store has retried those to its limits, and an
# endpoint that is away must be one line within seconds (DEFAULT_RETRY), not twice as many.
# ("kind: Connect" is object_store's own class for it: TLS failures too.)
AWAY_MARKS = ("Connection refused", "dns error", "connect error", "timed out", "kind: Connect")
# Either way, one "does not answer" line (an answer cut short twice keeps its own first line).
UNANSWERED_MARKS = ("error sending request", "connection closed", "Connection reset", *AWAY_MARKS)


# Where the check that an endpoint refuses a second create puts its object (deleted at once).
PROBE_PREFIX = "_msgindex_probe/"
_CONDITIONAL_PUTS_CHECKED: set[tuple] = set()
_CONDITIONAL_PUTS_LOCK = threading.Lock()


class ObjectMissingError(ObjectStoreError):
    """A ranged read of an object that does not exist (the caller knows what that means)."""


class ObjectShorterError(ObjectStoreError):
    """A ranged read past the end of an object (the caller knows how long it should be)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key (relative to the store's prefix), size and last change."""

    key: str
    size: int
    last_modified_ms: int


def coalesce_ranges(starts: np.ndarray, ends: np.ndarray, gap: int,
                    max_request: int = MAX_REQUEST_BYTES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request starts, request ends, each range's request) for byte ranges [starts, ends) sorted
    by start: a range joins the request before it when it begins at most `gap` bytes after that
    request's end and the request stays within `max_request` bytes (a range longer than that is
    a request of its own)."""
    if not len(starts):
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    request = np.empty(len(starts), dtype=np.int64)
    first_starts, request_ends = [int(starts[0])], [int(ends[0])]
    request[0] = 0
    for i, (start, end) in enumerate(zip(starts[1:].tolist(), ends[1:].tolist()), 1):
        if start <= request_ends[-1] + gap and max(end, request_ends[-1]) - first_starts[-1] <= max_request:
            request_ends[-1] = max(request_ends[-1], end)
        else:
            first_starts.append(start)
            request_ends.append(end)
        request[i] = len(first_starts) - 1
    return np.array(first_starts, np.int64), np.array(request_ends, np.int64), request


class ObjectClient:
    """The requests of one store location (see the module docstring). Thread-safe."""

    def __init__(self, location: StoreLocation, *, gap_bytes: int = DEFAULT_GAP_BYTES) -> None:
        if location.is_local:
            raise InvalidOptionError(f"{location}: a local path is not an object store")
        self.location = location
        self.gap_bytes = gap_bytes
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._store, self._max_retries = _open_store(location)

    # --- reads ----------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The whole object, or None when there is none."""
        import obstore

        try:
            return bytes(self._read("GET", lambda: obstore.get(self._store, key).bytes()))
        except FileNotFoundError as error:
            self._raise_if_store_missing(error)
            return None
        except Exception as error:  # obstore's errors: one line naming the store
            raise self._error(error, f"reading {key}") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes of object `key` from `start` (ObjectStoreError when it has fewer)."""
        return self.get_ranges(key, [start], [length])[0]

    def get_ranges(self, key: str, starts: Sequence[int], lengths: Sequence[int]) -> list[memoryview]:
        """The byte ranges of object `key`, one buffer each; ranges closer than ``gap_bytes``
        share a request, and the requests run in parallel."""
        import obstore

        starts_arr = np.asarray(starts, dtype=np.int64)
        ends_arr = starts_arr + np.asarray(lengths, dtype=np.int64)
        if not len(starts_arr):
            return []
        order = np.argsort(starts_arr, kind="stable")
        request_starts, request_ends, request_of = coalesce_ranges(starts_arr[order], ends_arr[order], self.gap_bytes)
        try:
            fetched = self._read("GET", lambda: obstore.get_ranges(
                self._store, key, starts=request_starts.tolist(), ends=request_ends.tolist(), coalesce=0),
                len(request_starts))
        except FileNotFoundError as error:
            self._raise_if_store_missing(error)
            raise ObjectMissingError(f"{self._where(key)}: object is missing") from None
        except Exception as error:
            if "Range Not Satisfiable" in str(error):  # (416) a range begins past the object's end
                raise ObjectShorterError(f"{self._where(key)}: the object ends before byte "
                                         f"{int(ends_arr.max())} asked for") from None
            raise self._error(error, f"reading {key}") from None
        views = [memoryview(buffer) for buffer in fetched]
        out: list[memoryview] = [memoryview(b"")] * len(starts_arr)
        for position, at in enumerate(order.tolist()):
            request = int(request_of[position])
            offset = int(starts_arr[at] - request_starts[request])
            piece = views[request][offset : offset + int(ends_arr[at] - starts_arr[at])]
            if len(piece) != ends_arr[at] - starts_arr[at]:
                raise ObjectShorterError(f"{self._where(key)}: {len(piece)} bytes at byte {int(starts_arr[at])} where "
                                       f"{int(ends_arr[at] - starts_arr[at])} were expected (the object is shorter)")
            out[at] = piece
        return out

    def list(self, prefix: str, *, after: str | None = None) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix` (a "directory": end it with "/"), in key
        order; `after`: only keys greater than it (one request per 1,000 keys)."""
        import obstore

        def pages() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            stream = obstore.list(self._store, prefix=prefix.rstrip("/") or None, offset=after, chunk_size=LIST_CHUNK)
            for page in stream:
                for meta in page:
                    path = meta["path"]
                    if path.startswith(prefix):
                        found.append(ObjectInfo(path, int(meta["size"]),
                                                int(meta["last_modified"].timestamp() * 1000)))
                if len(page) >= LIST_CHUNK:
                    self._count("LIST")
            return found

        found: list[ObjectInfo] = []
        try:
            found = self._read("LIST", pages)
        except FileNotFoundError as error:
            self._raise_if_store_missing(error)
        except Exception as error:
            raise self._error(error, f"listing {prefix or '/'}") from None
        found.sort(key=lambda info: info.key)
        return found

    def list_directories(self, prefix: str) -> list[str]:
        """The names of the "directories" directly under `prefix` (keys' next path segment)."""
        import obstore

        try:
            result = self._read("LIST", lambda: obstore.list_with_delimiter(self._store,
                                                                            prefix=prefix.rstrip("/") or None))
        except FileNotFoundError as error:
            self._raise_if_store_missing(error)
            return []
        except Exception as error:
            raise self._error(error, f"listing {prefix or '/'}") from None
        names = (common.rstrip("/").rsplit("/", 1)[-1] for common in result["common_prefixes"])
        return sorted(names)

    # --- writes ---------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | memoryview | Iterable) -> None:
        """Create or replace object `key` (atomic: readers see the old or the new bytes)."""
        import obstore

        self._count("PUT")
        try:
            obstore.put(self._store, key, data, use_multipart=False)
        except Exception as error:
            raise self._error(error, f"writing {key}") from None

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Create object `key` unless it exists (the store decides, atomically): True when this
        call created it, False when an object was there already. The first call of a process on
        a location checks that the endpoint does refuse (``_check_conditional_puts``)."""
        self._check_conditional_puts()
        return self._create(key, data)

    def _check_conditional_puts(self) -> None:
        """ObjectStoreError unless the endpoint refuses a second create of one object: commits
        without locks rest on that refusal (an S3-compatible server that ignores If-None-Match
        lets two writers both commit one version, and one's rows are lost without an error).
        Three requests (create, create again, delete), once per location and process."""
        checked = (self.location.url, tuple(sorted(self.location.options.items())))  # (the endpoint among them)
        with _CONDITIONAL_PUTS_LOCK:
            if checked in _CONDITIONAL_PUTS_CHECKED:
                return
        # (threads of one process may each check once at first: harmless, and no lock waits on requests)
        probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            refused = self._create(probe, b"") and not self._create(probe, b"")
        finally:
            try:
                self.delete([probe])
            except ObjectStoreError:
                pass  # (collection leaves it: a stray empty object; the create's own error says more)
        if not refused:
            raise ObjectStoreError(
                f"{self.location.url}: the endpoint does not refuse to create an object that exists (it ignores "
                f"If-None-Match: *); msgindex commits without locks by that refusal, so two writers could both "
                f"commit one version and lose rows: use an S3 API with conditional writes")
        with _CONDITIONAL_PUTS_LOCK:
            _CONDITIONAL_PUTS_CHECKED.add(checked)

    def _create(self, key: str, data: bytes | memoryview) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        self._count("PUT")
        try:
            obstore.put(self._store, key, data, mode="create", use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            return False
        except Exception as error:
            raise self._error(error, f"creating {key}") from None
        return True

    def delete(self, keys: Sequence[str]) -> None:
        """Delete the objects (missing ones are no error)."""
        import obstore

        keys = list(keys)
        for start in range(0, len(keys), 1000):
            self._count("DELETE")
            try:
                obstore.delete(self._store, keys[start : start + 1000])
            except FileNotFoundError:
                pass
            except Exception as error:
                raise self._error(error, f"deleting {keys[start]}") from None

    # --- accounting and errors ------------------------------------------------------------------
    def _read(self, kind: str, read: Callable[[], T], requests: int = 1) -> T:
        """`read()`, counted; once more after READ_RETRY_PAUSE_S when the endpoint dropped it."""
        self._count(kind, requests)
        started = time.monotonic()
        try:
            return read()
        except FileNotFoundError:
            raise
        except Exception as error:
            if not self._max_retries or not _dropped(error) or time.monotonic() - started > READ_RETRY_MAX_FAILED_S:
                raise
        time.sleep(READ_RETRY_PAUSE_S)
        self._count(kind, requests)
        return read()

    def _count(self, kind: str, n: int = 1) -> None:
        with self._count_lock:
            self.requests[kind] += n

    def request_count(self) -> int:
        """Requests sent so far, all kinds."""
        with self._count_lock:
            return sum(self.requests.values())

    def _where(self, key: str) -> str:
        return f"{self.location.url.rstrip('/')}/{key}"

    def _raise_if_store_missing(self, error: BaseException) -> None:
        """A GET of a missing object and a GET from a missing bucket both come back 404."""
        text = str(error)
        if "NoSuchBucket" in text or "ContainerNotFound" in text or "bucket does not exist" in text.lower():
            raise ObjectStoreError(_missing_bucket(self.location)) from None

    def _error(self, error: BaseException, doing: str) -> ObjectStoreError:
        return ObjectStoreError(f"{self.location.url}: {doing}: {explain(error, self.location)}")


def explain(error: BaseException, location: StoreLocation) -> str:
    """One line that says what is wrong, from an obstore error's (long, multi-line) text."""
    text = str(error)
    endpoint = _endpoint_in(text)
    if "NoSuchBucket" in text or "ContainerNotFound" in text:
        return _missing_bucket(location)
    by = f" by {endpoint}" if endpoint else ""
    if "InvalidAccessKeyId" in text:
        named = re.search(r"<AWSAccessKeyId>([^<]*)<", text)  # S3's error body names it; moto's does not
        key_id = named.group(1) if named else _configured_key_id(location)
        return (f"the access key id{' ' + repr(key_id) if key_id else ''} is not known{by}: check "
                f"AWS_ACCESS_KEY_ID or the 'access_key_id' storage option")
    if "SignatureDoesNotMatch" in text:
        return (f"the secret access key does not match the access key id (request signature refused{by}): check "
                f"AWS_SECRET_ACCESS_KEY or the 'secret_access_key' storage option")
    if "ExpiredToken" in text or "InvalidToken" in text:
        return f"the session token is expired or invalid{by}: renew the credentials (AWS_SESSION_TOKEN)"
    if any(mark in text for mark in ("AccessDenied", "403 Forbidden", "401 Unauthorized", "AuthorizationFailure")):
        return (f"access denied{by}: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the storage "
                f"options) and that they may use this bucket")
    if any(mark in text for mark in UNANSWERED_MARKS):
        return (f"the endpoint {endpoint or '(default)'} does not answer: check AWS_ENDPOINT_URL / the 'endpoint' "
                f"storage option and that the server is up")
    if "<html" in text.lower() or "<!doctype html" in text.lower():
        return web_page_answer(endpoint)
    if "credential" in text.lower():
        return ("no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the storage options, "
                "or run where the cloud's default credential chain provides them)")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return first[:300]


def web_page_answer(endpoint: str = "") -> str:
    """What an endpoint that answers HTML (a console or proxy port, not an S3 API) is told."""
    return (f"the endpoint {endpoint or '(configured)'} answered with a web page, not as an S3 API does: check "
            f"AWS_ENDPOINT_URL / the 'endpoint' storage option (a console or proxy port?)")


def _dropped(error: BaseException) -> bool:
    text = str(error)
    return any(mark in text for mark in DROPPED_MARKS) and not any(mark in text for mark in AWAY_MARKS)


def _configured_key_id(location: StoreLocation) -> str:
    """The S3 access key id the client was given (storage option first, then the environment)."""
    import os

    for key, value in location.options.items():
        if _option_name(key, location.kind) == "access_key_id":
            return str(value)
    return os.environ.get("AWS_ACCESS_KEY_ID", "")


def _missing_bucket(location: StoreLocation) -> str:
    return f"{location.url}: bucket {location.bucket!r} does not exist (create it first, or fix the URL)"


def _endpoint_in(text: str) -> str:
    for word in text.split():
        if word.startswith(("http://", "https://")):
            parts = word.split("/")
            return "/".join(parts[:3])
    return ""


def _open_store(location: StoreLocation):
    """The obstore store of `location`: environment first, then the storage options."""
    from obstore.store import from_url

    config: dict[str, object] = {}
    client: dict[str, object] = dict(DEFAULT_CLIENT)
    retry: dict[str, object] = dict(DEFAULT_RETRY)
    import os

    for raw_key, value in location.options.items():
        key = _option_name(raw_key, location.kind)
        if key in CLIENT_OPTIONS:
            client[key] = _boolean(raw_key, value) if key.startswith(("allow_", "http", "randomize")) else value
        elif key in RETRY_OPTIONS:
            retry[key] = _retry_number(raw_key, key, value)
        else:
            config[key] = value
    if location.kind == "s3":
        endpoint = _checked_endpoint(config)
        if "allow_http" not in client:
            if os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes"):
                client["allow_http"] = True
            if endpoint.startswith("http://"):  # an http endpoint named explicitly is meant to be used
                client["allow_http"] = True
        elif endpoint.startswith("http://") and not client["allow_http"]:
            raise InvalidOptionError(f"storage option allow_http=false, but the endpoint {endpoint!r} is http://: "
                                     f"allow it, or give an https:// endpoint")
    retry_config = {"max_retries": int(retry["max_retries"]),
                    "retry_timeout": timedelta(seconds=float(retry["retry_timeout"])),
                    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5),
                                "base": 2.0}}
    url = f"{location.url.split('://', 1)[0]}://{location.url.split('://', 1)[1]}"
    try:
        return (from_url(url, config=config or None, client_options=client, retry_config=retry_config),
                int(retry["max_retries"]))
    except Exception as error:
        raise ObjectStoreError(f"{location.url}: cannot configure the object store client: "
                               f"{explain(error, location)}") from None


def _option_name(key: str, kind: str) -> str:
    """obstore's name of a storage option given in its own or its environment spelling
    (``AWS_ENDPOINT_URL`` -> ``endpoint``, ``aws_access_key_id`` -> ``access_key_id``)."""
    name = key.strip().lower()
    aliases = {"endpoint_url": "endpoint", "aws_endpoint_url": "endpoint", "aws_endpoint": "endpoint",
               "aws_allow_http": "allow_http", "region_name": "region", "aws_default_region": "region"}
    if name in aliases:
        return aliases[name]
    if kind == "s3" and name.startswith("aws_") and name != "aws_endpoint_url_s3":
        return name[len("aws_"):]  # obstore's S3 keys are the variables' names without AWS_
    for prefix in ("google_", "azure_storage_", "azure_"):  # client options in the other clouds' spelling
        if name.startswith(prefix) and name[len(prefix):] in CLIENT_OPTIONS | RETRY_OPTIONS:
            return name[len(prefix):]
    return name


def _boolean(name: str, value: object) -> bool:
    word = str(value).strip().lower()
    if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise InvalidOptionError(f"storage option {name}={value!r}: not a boolean (true or false)")
    return word in ("1", "true", "yes", "on")


def _retry_number(name: str, key: str, value: object) -> int | float:
    """max_retries (an int >= 0) or retry_timeout (seconds, finite, > 0; a trailing s allowed)."""
    text = str(value).strip()
    try:
        number = int(text) if key == "max_retries" else float(text.removesuffix("s"))
    except ValueError:
        number = None
    if number is None or not math.isfinite(number) or number < 0 or (key != "max_retries" and number == 0):
        wanted = "a whole number >= 0" if key == "max_retries" else "seconds, a number > 0"
        raise InvalidOptionError(f"storage option {name}={value!r}: must be {wanted}")
    return number


def _checked_endpoint(config: Mapping[str, object]) -> str:
    """The S3 endpoint the client will use (the storage option, else the environment): one
    that is not an http(s) URL is refused here (the client library panics on it, mid-request)."""
    import os

    given = [("storage option endpoint", config["endpoint"])] if "endpoint" in config else [
        (name, os.environ[name]) for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT") if name in os.environ]
    for where, value in given[:1]:
        endpoint = str(value)
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", endpoint):
            raise InvalidOptionError(f"{where} = {endpoint!r} is not an endpoint URL: write it http://host:port "
                                     f"or https://host (or unset it for AWS's own)")
        return endpoint
    return ""
