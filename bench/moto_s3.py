"""moto's S3 server (and a latency-injecting proxy in front of it) for the object-store runs of
the benchmarks, each in its own process on loopback.

``Servers(latency_ms)`` starts both; ``options()`` are msgindex's storage options, ``env()`` the
``AWS_*`` variables the CLI, the indexing job and Spark's ``s3a://`` connector read the same
settings from, ``filesystem()`` a pyarrow ``S3FileSystem`` on the same server. ``slow=True``
goes through the proxy, which adds ``latency_ms`` before every request it forwards (real S3's
first-byte latency, ~10-30 ms, which loopback hides); ``relay=True`` through a second one that
adds nothing: what relaying every byte through a Python process costs by itself, so that
``slow`` minus ``relay`` is the latency's share alone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

ACCESS, SECRET, REGION = "bench", "bench-secret", "us-east-1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not answer on port {port}")


PROXY = textwrap.dedent('''
    import asyncio, re, sys
    listen, target, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000
    # the log: each request line as it goes to the server, and "<- N" for each N bytes coming back
    log = open(sys.argv[4], "a", buffering=1) if len(sys.argv) > 4 else None
    request_line = re.compile(rb"(?:^|\\r\\n)((?:GET|PUT|HEAD|POST|DELETE) [^ ]+) HTTP/1")
    async def pipe(reader, writer, pause):
        try:
            while data := await reader.read(1 << 16):
                if pause and log:
                    log.writelines(line.decode("latin-1") + "\\n" for line in request_line.findall(data))
                elif log:
                    log.write(f"<- {len(data)}\\n")
                if pause and delay:
                    await asyncio.sleep(delay)  # before each request (or piece of one) goes on
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
    async def handle(client_reader, client_writer):
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(client_reader, server_writer, True), pipe(server_reader, client_writer, False))
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()
    asyncio.run(main())
''')


class Servers:
    """moto's server and the latency proxy in front of it, both in their own processes."""

    def __init__(self, latency_ms: float = 20.0) -> None:
        self.port, self.proxy_port, self.relay_port = free_port(), free_port(), free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115
        self.moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.proxy = self.relay = self.relay_log = None
        try:  # a server that did not start leaves none of the others running
            wait_for(self.port, self.moto, "moto's server")
            self.proxy = subprocess.Popen([sys.executable, "-c", PROXY, str(self.proxy_port), str(self.port),
                                           str(latency_ms)])
            wait_for(self.proxy_port, self.proxy, "the latency proxy")
            self.relay_log = tempfile.NamedTemporaryFile(prefix="relay-", suffix=".log", delete=False)  # noqa: SIM115
            self.relay = subprocess.Popen([sys.executable, "-c", PROXY, str(self.relay_port), str(self.port), "0",
                                           self.relay_log.name])
            wait_for(self.relay_port, self.relay, "the relay")
        except BaseException:
            self.stop()
            raise

    def endpoint(self, *, slow: bool = False, relay: bool = False) -> str:
        return f"http://127.0.0.1:{self.proxy_port if slow else self.relay_port if relay else self.port}"

    def options(self, *, slow: bool = False, relay: bool = False) -> dict[str, str]:
        return {"endpoint": self.endpoint(slow=slow, relay=relay), "access_key_id": ACCESS,
                "secret_access_key": SECRET, "region": REGION, "allow_http": "true"}

    def env(self, *, slow: bool = False) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint(slow=slow), "AWS_ACCESS_KEY_ID": ACCESS,
                "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def export_env(self, *, slow: bool = False) -> None:
        """Put `env()` into this process's environment (its Spark jobs and subprocesses read it)."""
        os.environ.update(self.env(slow=slow))

    def boto3(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint(), aws_access_key_id=ACCESS,
                            aws_secret_access_key=SECRET, region_name=REGION)

    def create_bucket(self, name: str) -> str:
        self.boto3().create_bucket(Bucket=name)
        return name

    def bucket_bytes(self, bucket: str, prefix: str) -> int:
        total = 0
        for page in self.boto3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            total += sum(item["Size"] for item in page.get("Contents", ()))
        return total

    def filesystem(self, *, slow: bool = False, relay: bool = False):
        from pyarrow.fs import S3FileSystem

        return S3FileSystem(access_key=ACCESS, secret_key=SECRET, region=REGION, scheme="http",
                            endpoint_override=self.endpoint(slow=slow, relay=relay).removeprefix("http://"))

    def relay_traffic(self) -> tuple[int, int]:
        """(requests, bytes sent back: headers and bodies) through the relay since it started:
        what a client asked of the server, counted outside the client."""
        requests = served = 0
        with open(self.relay_log.name, encoding="latin-1") as log:
            for line in log:
                if line.startswith("<- "):
                    served += int(line[3:])
                else:
                    requests += 1
        return requests, served

    def stop(self) -> None:
        for process in (self.relay, self.proxy, self.moto):
            if process is not None:
                process.terminate()
                process.wait(timeout=10)
        if self.relay_log is not None:
            os.unlink(self.relay_log.name)  # (moto's own log stays: it holds a failed start's reason)


def add_object_store_flag(parser, what: str) -> None:
    """``--no-object-store`` (dest ``object_store``): a benchmark's object-store runs are on by default."""
    parser.add_argument("--no-object-store", dest="object_store", action="store_false",
                        help=f"skip {what} (moto's S3 server on loopback)")
