"""A real S3 API server for the tests: moto's server (``moto[server]``) in its own process on
loopback, started once per test session (the ``s3`` fixture, registered in conftest.py).

moto implements what msgindex relies on over HTTP: put-if-absent (``If-None-Match: *`` answered
412 when the object exists), ranged and multi-range GETs, listing with a start-after key. Each
test gets its own bucket (``s3.bucket()``), so tests never see each other's objects.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

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
        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                     region_name=REGION).create_bucket(Bucket=name)
        return name

    def url(self, path: str = "index") -> str:
        """``s3://<a new bucket>/<path>``."""
        return f"s3://{self.bucket()}/{path}"


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
