"""A real S3 API server for the tests: moto's server (``moto[server]``) in its own process on
loopback, started once per test session (the ``s3`` fixture, registered in conftest.py).

moto implements what msgindex relies on over HTTP: put-if-absent (``If-None-Match: *`` answered
412 when the object exists), ranged and multi-range GETs, listing with a start-after key. Each
test gets its own bucket (``s3.bucket()``), so tests never see each other's objects.

``stores`` (a fixture, both kinds): a test of the Store API runs once on a local directory and
once on a bucket of that server. ``FaultProxy``: a proxy between a client and the server that
refuses, cuts, truncates or delays chosen requests (the fault tests).
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from msgindex.storage.objects.shard import ObjectTuning
    from msgindex.storage.objects.store import ObjectStore
    from msgindex.storage.settings import StoreSettings
    from msgindex.storage.store import Store

ACCESS_KEY = "msgindex-test"
SECRET_KEY = "msgindex-test-secret"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """Where the session's S3 server answers, and what a client needs to reach it."""

    endpoint: str

    @property
    def options(self) -> dict[str, str]:
        """Storage options for ``msgindex.open(url, storage_options=...)``."""
        return {"endpoint": self.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                "region": REGION, "allow_http": "true"}

    @property
    def env(self) -> dict[str, str]:
        """The AWS_* variables a subprocess (the CLI, Spark's workers) reads the same settings from."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def bucket(self, prefix: str = "t") -> str:
        """A new empty bucket's name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        _boto3_client(self.endpoint).create_bucket(Bucket=name)
        return name

    def url(self, path: str = "index") -> str:
        """``s3://<a new bucket>/<path>``."""
        return f"s3://{self.bucket()}/{path}"

    def keys(self, url: str) -> list[str]:
        """Every object key under `url` (``s3://bucket/prefix``), as the bucket names them."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        pages = _boto3_client(self.endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def truncate(self, url: str, key: str, length: int) -> None:
        """Replace object `key` of `url`'s bucket with its first `length` bytes (damage by hand)."""
        client = _boto3_client(self.endpoint)
        bucket = url.removeprefix("s3://").partition("/")[0]
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        client.put_object(Bucket=bucket, Key=key, Body=data[:length])


@functools.cache
def _boto3_client(endpoint: str):
    """One boto3 client per server (making one costs ~100 ms; they are thread-safe)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        region_name=REGION)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_s3_server(log_path: str, *, requests_before_auth: int | None = None) -> tuple[subprocess.Popen, S3Server]:
    """moto's server in a new process; waits until it answers. moto checks no credentials unless
    told to: with `requests_before_auth`, it answers that many requests (e.g. creating a bucket)
    and then checks every request's key and signature against its own IAM, where no key exists:
    every later request is refused with 403 InvalidAccessKeyId, as a real store refuses wrong keys."""
    port = _free_port()
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the process
    env = dict(os.environ)
    if requests_before_auth is not None:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(requests_before_auth)
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto's server exited with {process.returncode}; its log: {log_path}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return process, S3Server(f"http://127.0.0.1:{port}")
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto's server did not answer on port {port} within 60 s; its log: {log_path}")


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's S3 API server (moto, a real HTTP server in its own process)."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        pytest.skip("moto[server] is not installed (the dev extra installs it)")
    process, server = start_s3_server(str(tmp_path_factory.mktemp("s3") / "moto.log"))
    try:
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()



def require_credentials(server: S3Server) -> dict[str, dict[str, str]]:
    """Make `server` check every request's credentials from now on (moto's IAM authentication:
    its ``INITIAL_NO_AUTH_ACTION_COUNT`` switch, set through ``/moto-api/reset-auth``), with two
    IAM users made first: "writer" may do anything in S3, "nobody" nothing. Returns the storage
    options of each (then a new bucket needs the writer's keys: ``bucket_as``). Use a server of
    its own: every client of it must sign with real keys afterwards."""
    import json
    import urllib.request

    import boto3

    iam = boto3.client("iam", endpoint_url=server.endpoint, aws_access_key_id=ACCESS_KEY,
                       aws_secret_access_key=SECRET_KEY, region_name=REGION)
    identities = {}
    for user, actions in (("writer", ["s3:*"]), ("nobody", [])):
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        if actions:
            iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
        identities[user] = {**server.options, "access_key_id": key["AccessKeyId"],
                            "secret_access_key": key["SecretAccessKey"]}
    switch = urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                    headers={"Content-Type": "text/plain"})  # (a form body would be parsed away)
    urllib.request.urlopen(switch, timeout=30).read()
    return identities


def bucket_as(server: S3Server, options: dict[str, str]) -> str:
    """A new bucket made with the keys in `options` (on a server that checks them)."""
    import boto3

    name = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=options["access_key_id"],
                 aws_secret_access_key=options["secret_access_key"], region_name=REGION).create_bucket(Bucket=name)
    return name


def environment_with(server: S3Server) -> dict[str, str]:
    """os.environ plus the server's AWS_* variables (for subprocesses)."""
    return {**os.environ, **server.env}



# --- one fixture, both kinds of store ---------------------------------------------------------------
STORE_KINDS = ["local", "s3"]


@dataclass
class Stores:
    """Fresh stores of one kind for a test (the ``stores`` fixture): directories under the test's
    tmp_path, or prefixes of one new bucket on the session's S3 server. A test written against
    it runs on both kinds with the same assertions, except where a kind documents other
    behaviour on purpose (``is_local``)."""

    kind: str
    tmp_path: Path
    server: S3Server | None = None
    bucket: str = ""

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    def root(self, name: str = "store") -> Path | str:
        """Where store `name` of this test lives (nothing is created)."""
        return self.tmp_path / name if self.is_local else f"s3://{self.bucket}/{name}"

    @property
    def options(self) -> dict[str, str] | None:
        """The storage options of this kind (None for a local store)."""
        return None if self.is_local else self.server.options

    def open(self, root: Path | str | None = None, *, create: bool = False, settings: StoreSettings | None = None,
             tuning: ObjectTuning | None = None) -> Store | ObjectStore:
        """``msgindex.open`` of `root` (default: ``root()``); object stores with `tuning`."""
        from msgindex.storage.location import parse_location
        from msgindex.storage.objects.store import open_object_store
        from msgindex.storage.store import open_store

        root = self.root() if root is None else root
        if self.is_local:
            return open_store(root, create=create, settings=settings)
        return open_object_store(parse_location(str(root), self.options), create=create, settings=settings,
                                 tuning=tuning)

    def create(self, name: str = "store", *, settings: StoreSettings | None = None,
               tuning: ObjectTuning | None = None) -> Store | ObjectStore:
        """A new store `name`."""
        return self.open(self.root(name), create=True, settings=settings, tuning=tuning)

    def cli_args(self, root: Path | str) -> list[str]:
        """`root` as the CLI takes it, with the storage options (--storage-option K=V)."""
        options = [arg for key, value in (self.options or {}).items() for arg in ("--storage-option", f"{key}={value}")]
        return [str(root), *options]

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus, for an object store, the AWS_* variables that reach the server."""
        return dict(os.environ) if self.is_local else environment_with(self.server)


@pytest.fixture(params=STORE_KINDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    """Fresh stores of each kind in turn (``Stores``): the test runs once on a local directory,
    once on the session's S3 server (started on first use)."""
    if request.param == "local":
        return Stores("local", tmp_path)
    server = request.getfixturevalue("s3")
    return Stores("s3", tmp_path, server, server.bucket())

# --- a proxy that fails requests on purpose --------------------------------------------------------
class FaultProxy:
    """A TCP proxy on loopback in front of the S3 server that forwards HTTP/1.1 requests one at
    a time per connection and, on request, fails the next ones: a fault test points the client
    at ``endpoint`` and arms a rule (``fail``) for the request it wants to break.

    Actions: ``"refuse"`` closes the client's connection before the request reaches the server
    (the request never happened); ``"cut"`` lets the server answer, then closes the connection
    without passing the answer on (the request happened; the client cannot know); ``"truncate"``
    passes on half the answer, then closes; ``"delay"`` waits ``delay_s`` before forwarding;
    ``"dribble"`` passes on the answer's head, then its body a byte every ``delay_s`` (a stalled
    endpoint); ``"unconditional"`` drops the request's If-None-Match and If-Match headers (an
    S3-compatible server that ignores conditional writes).
    ``refuse_connections(n)`` closes the next n connections as soon as they are accepted."""

    def __init__(self, upstream: str) -> None:
        import threading

        host, port = upstream.removeprefix("http://").split(":")
        self._upstream = (host, int(port))
        self._rules: list[_Rule] = []
        self._refuse_connections = 0
        self.refused_connections = 0  # how many were closed on accept
        self._lock = threading.Lock()
        self.log: list[tuple[str, str, str]] = []  # (method, path, what the proxy did)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    # --- arming ---------------------------------------------------------------------------------
    def fail(self, action: str, *, method: str | None = None, path: str | None = None, count: int = 1,
             delay_s: float = 0.0, skip: int = 0) -> _Rule:
        """Apply `action` to the next `count` requests whose method is `method` and whose path
        matches the regular expression `path` (None: any), after letting `skip` of them pass."""
        import re

        if action not in ("refuse", "cut", "truncate", "delay", "dribble", "unconditional"):
            raise ValueError(action)
        rule = _Rule(action, method, re.compile(path) if path else None, count, delay_s, skip)
        with self._lock:
            self._rules.append(rule)
        return rule

    def refuse_connections(self, count: int) -> None:
        with self._lock:
            self._refuse_connections += count

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._refuse_connections = 0

    def requests(self, method: str | None = None, path: str | None = None) -> list[tuple[str, str, str]]:
        import re

        with self._lock:
            return [entry for entry in self.log if (method is None or entry[0] == method)
                    and (path is None or re.search(path, entry[1]))]

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                sock.close()

    # --- forwarding -----------------------------------------------------------------------------
    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._refuse_connections > 0
                self._refuse_connections -= refuse
                self.refused_connections += refuse
            if refuse:
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take(self, method: str, path: str) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.count and (rule.method is None or rule.method == method) and (
                        rule.path is None or rule.path.search(path)):
                    if rule.skip:
                        rule.skip -= 1
                        return None
                    rule.count -= 1
                    rule.hits += 1
                    return rule
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        with self._lock:
            self._open.add(client)
        try:
            upstream = socket.create_connection(self._upstream)
            client_in, upstream_in = client.makefile("rb"), upstream.makefile("rb")
            while True:
                request = _read_message(client_in, request=True)
                if request is None:
                    return
                head, body, method, path = request
                rule = self._take(method, path)
                action = rule.action if rule else "pass"
                with self._lock:
                    self.log.append((method, path, action))
                if action == "refuse":
                    return
                if action == "delay":
                    time.sleep(rule.delay_s)
                if action == "unconditional":
                    head = b"".join(line for line in head.splitlines(keepends=True)
                                    if not line.lower().startswith((b"if-none-match:", b"if-match:")))
                upstream.sendall(head + body)
                response = _read_message(upstream_in, request=False, method=method)
                if response is None:
                    return
                answer = response[0] + response[1]
                if action == "cut":
                    return
                if action == "truncate":
                    client.sendall(answer[: max(len(response[0]), len(answer) // 2)])
                    return
                if action == "dribble":
                    client.sendall(response[0])
                    for at in range(len(response[1])):
                        time.sleep(rule.delay_s)
                        client.sendall(response[1][at : at + 1])
                    continue
                client.sendall(answer)
        except OSError:
            return
        finally:
            with self._lock:
                self._open.discard(client)
            client.close()
            if upstream is not None:
                upstream.close()


@dataclass
class _Rule:
    action: str
    method: str | None
    path: object
    count: int
    delay_s: float
    skip: int
    hits: int = 0


def _read_message(stream, *, request: bool, method: str = "") -> tuple[bytes, bytes, str, str] | None:
    """One HTTP/1.1 message from `stream`: (head, body, method, path); None at end of stream.
    Bodies are framed by Content-Length or chunked encoding (moto's and obstore's only ways)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = stream.readline()
        if not line:
            return None
        head += line
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    status = 0 if request else int(first[1])
    if not request and (method == "HEAD" or status in (204, 304) or 100 <= status < 200):
        return head, b"", method, ""
    if "content-length" in headers:
        body = stream.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size_line = stream.readline()
            body += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            body += stream.read(size + 2)
            if size == 0:
                break
    elif request:
        body = b""
    else:
        body = stream.read()  # the server closes the connection after it
    return head, body, first[0] if request else method, first[1] if request else ""
