"""A local single-node Kafka (KRaft: broker and controller in one JVM) built from Maven Central jars.

No Docker and no Kafka tarball are needed: ``kafka_2.13`` is staged with its runtime dependencies
(plus the log4j2 binding its pom leaves out), the data directory gets a generated
``server.properties`` and log4j2 config, storage is formatted on first start, and the broker runs
detached (its own session) so that ``msgindex kafka start`` can return while it keeps running.

Data directory layout (everything the broker owns):
    server.properties   generated on every start (ports may change between starts)
    log4j2.properties   the broker's logging: ``server.log`` beside it
    broker.pid          pid of the running JVM
    broker.json         the ports it was started with, so `status`/`start` can report them
    broker.out          the JVM's stdout/stderr (early failures, before log4j is up)
    logs/               Kafka's log.dirs (formatted storage: logs/meta.properties)

Topics are not auto-created (``auto.create.topics.enable=false``): a typo in a topic name should
fail loudly instead of silently indexing an empty new topic; use `msgindex.kafka.admin`.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from msgindex.errors import BrokerError
from msgindex.jvm import java_command, msgindex_home, require_tool, stage_jars

KAFKA_VERSION = "4.3.1"  # the newest Kafka line kafka-python 3 supports
KAFKA_ARTIFACT = f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}"
LOG4J_VERSION = "2.25.3"
# kafka_2.13 logs through slf4j 1.x and ships no binding: without these the broker logs nothing.
LOG4J_BINDING = [
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-api:{LOG4J_VERSION}",
]
BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"

DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
PORT_ENV = "MSGINDEX_KAFKA_PORT"
CONTROLLER_PORT_ENV = "MSGINDEX_KAFKA_CONTROLLER_PORT"
DATA_DIR_ENV = "MSGINDEX_KAFKA_DATA_DIR"
HEAP_ENV = "MSGINDEX_KAFKA_HEAP"
DEFAULT_HEAP = "384m"
# serial GC and C1-only JIT: a quick start and a small footprint on a shared 2-core machine
JVM_FLAGS = ["-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
NODE_ID = 1
HOST = "127.0.0.1"

PID_FILE = "broker.pid"
STATE_FILE = "broker.json"
CONFIG_FILE = "server.properties"
LOG_CONFIG_FILE = "log4j2.properties"
SERVER_LOG = "server.log"
STDOUT_FILE = "broker.out"
LOG_DIRS = "logs"
FORMATTED_MARKER = "meta.properties"  # written into log.dirs by StorageTool

PORT_TAKEN_SIGNS = ("Address already in use", "BindException")
READY_POLL_SECONDS = 0.25


def broker_jars() -> list[Path]:
    """The broker's classpath, staged with Maven on first use."""
    return stage_jars(f"kafka-broker-{KAFKA_VERSION}", [KAFKA_ARTIFACT, *LOG4J_BINDING])


def new_cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64 without padding, like Kafka's
    ``Uuid.randomUuid``, which also rejects ids starting with '-' (1 in 64 draws): the storage
    tool's argument parser would read such an id as an option and the format would fail."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on / is bound to host:port (TIME_WAIT leftovers do not count,
    as Kafka binds with SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the OS reports free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class BrokerStatus:
    """Whether the broker of a data directory runs, and where."""

    running: bool
    pid: int | None
    bootstrap: str | None
    data_dir: Path

    def describe(self) -> str:
        if self.running:
            return f"running (pid {self.pid}) at {self.bootstrap}, data in {self.data_dir}"
        return f"not running (data dir {self.data_dir})"


class LocalBroker:
    """A single-node KRaft Kafka broker on 127.0.0.1 whose state lives in one data directory.

    The pid file makes start/stop/status work across processes: `msgindex kafka stop` stops a
    broker that `msgindex kafka start` launched earlier."""

    def __init__(self, data_dir: str | Path | None = None, port: int | None = None,
                 controller_port: int | None = None, heap: str | None = None) -> None:
        env = os.environ
        self.data_dir = Path(data_dir or env.get(DATA_DIR_ENV) or msgindex_home() / "kafka").resolve()
        self.port = int(port or env.get(PORT_ENV) or DEFAULT_PORT)
        self.controller_port = int(controller_port or env.get(CONTROLLER_PORT_ENV) or DEFAULT_CONTROLLER_PORT)
        self.heap = heap or env.get(HEAP_ENV) or DEFAULT_HEAP
        if self.port == self.controller_port:
            raise BrokerError(f"client port and controller port are both {self.port}; they must differ")
        self._process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> str:
        """Start the broker and return its bootstrap address once an admin call succeeds.
        Returns at once when this data directory's broker already runs (with the address it was
        started on, which wins over this instance's port)."""
        current = self.status()
        if current.running:
            return current.bootstrap
        require_tool("java", "run the local Kafka broker")
        self._check_ports_free()
        jars = broker_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._format_storage(jars)
        self._launch(jars)
        self._wait_ready(timeout)
        return self.bootstrap

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker: SIGTERM (a clean controlled shutdown), SIGKILL if it is still alive
        after `timeout` seconds. Returns False when it was not running."""
        pid = self._running_pid()
        if pid is None:
            self._forget()
            return False
        self._signal(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout):
            self._signal(pid, signal.SIGKILL)
            if not self._wait_exit(pid, 10.0):
                raise BrokerError(f"broker pid {pid} survived SIGKILL (data dir {self.data_dir})")
        self._forget()
        return True

    def status(self) -> BrokerStatus:
        """Running or not, with the pid and bootstrap address recorded at start."""
        pid = self._running_pid()
        if pid is None:
            return BrokerStatus(False, None, None, self.data_dir)
        state = self._read_state()
        return BrokerStatus(True, pid, f"{HOST}:{state.get('port', self.port)}", self.data_dir)

    @property
    def server_log(self) -> Path:
        return self.data_dir / SERVER_LOG

    # ---- start steps -----------------------------------------------------------------------

    def _check_ports_free(self) -> None:
        for role, port in (("client", self.port), ("controller", self.controller_port)):
            if not port_is_free(port):
                raise BrokerError(
                    f"cannot start Kafka: {role} port {HOST}:{port} is already taken by another "
                    f"process; choose other ports (--port/--controller-port or {PORT_ENV}/"
                    f"{CONTROLLER_PORT_ENV})"
                )

    def _write_config(self) -> None:
        (self.data_dir / CONFIG_FILE).write_text(self._server_properties())
        (self.data_dir / LOG_CONFIG_FILE).write_text(self._log4j2_properties())

    def _server_properties(self) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": NODE_ID,
            # static voters (not --standalone): the voter set then lives in this file, so the
            # controller port may change between starts of the same data directory
            "controller.quorum.voters": f"{NODE_ID}@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / LOG_DIRS),
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 4,  # 50 by default: slow first consumer group on 2 cores
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false",
            "log.segment.bytes": 16 * 1024 * 1024,
            "log.retention.check.interval.ms": 60_000,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,  # 128 MiB by default: a third of the heap
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _log4j2_properties(self) -> str:
        log = self.data_dir / SERVER_LOG
        return (
            # log4j's own shutdown hook would stop logging before Kafka's clean shutdown ends
            "shutdownHook = disable\n"
            "rootLogger.level = info\n"
            "rootLogger.appenderRef.file.ref = file\n"
            "appender.file.type = RollingFile\n"
            "appender.file.name = file\n"
            f"appender.file.fileName = {log}\n"
            f"appender.file.filePattern = {log}.%i\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n%ex\n"
            "appender.file.policies.type = Policies\n"
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy\n"
            "appender.file.policies.size.size = 10MB\n"
            "appender.file.strategy.type = DefaultRolloverStrategy\n"
            "appender.file.strategy.max = 2\n"
            "logger.state.name = state.change.logger\n"
            "logger.state.level = warn\n"
            "logger.request.name = kafka.request.logger\n"
            "logger.request.level = warn\n"
        )

    def _jvm(self, jars: list[Path], main_class: str, *args: str) -> list[str]:
        argv = java_command(jars, main_class, *args, heap=self.heap)
        log_config = f"-Dlog4j2.configurationFile={(self.data_dir / LOG_CONFIG_FILE).as_uri()}"
        return [argv[0], *JVM_FLAGS, log_config, *argv[1:]]

    def _format_storage(self, jars: list[Path]) -> None:
        if (self.data_dir / LOG_DIRS / FORMATTED_MARKER).is_file():
            return
        cluster_id = new_cluster_id()
        done = subprocess.run(
            self._jvm(jars, STORAGE_TOOL_MAIN, "format", "--ignore-formatted",
                      "-t", cluster_id, "-c", str(self.data_dir / CONFIG_FILE)),
            capture_output=True, text=True, timeout=300,
        )
        if done.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage in {self.data_dir / LOG_DIRS} failed:\n"
                f"{(done.stdout + done.stderr)[-3000:]}"
            )

    def _launch(self, jars: list[Path]) -> None:
        # the last run's log must not be mistaken for this run's (port-taken detection reads it)
        if self.server_log.is_file():
            self.server_log.replace(self.data_dir / f"{SERVER_LOG}.previous")
        with open(self.data_dir / STDOUT_FILE, "wb") as out:
            self._process = subprocess.Popen(
                self._jvm(jars, BROKER_MAIN, str(self.data_dir / CONFIG_FILE)),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=True,  # survives the CLI that started it
            )
        (self.data_dir / PID_FILE).write_text(str(self._process.pid))
        (self.data_dir / STATE_FILE).write_text(json.dumps(
            {"pid": self._process.pid, "port": self.port, "controller_port": self.controller_port,
             "kafka_version": KAFKA_VERSION, "started_at": time.time()}
        ))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._process is not None and self._process.poll() is not None:
                self._forget()
                raise self._launch_failure(f"exited with code {self._process.returncode}")
            if self._port_taken_in_log():
                self.stop(timeout=10)
                raise self._launch_failure("could not bind its ports")
            if _admin_call_succeeds(self.bootstrap):
                return
            if time.monotonic() > deadline:
                self.stop(timeout=10)
                raise self._launch_failure(f"was not ready after {timeout:.0f} s")
            time.sleep(READY_POLL_SECONDS)

    def _log_text(self) -> str:
        texts = []
        for name in (STDOUT_FILE, SERVER_LOG):
            path = self.data_dir / name
            if path.is_file():
                texts.append(path.read_text(errors="replace")[-200_000:])
        return "\n".join(texts)

    def _port_taken_in_log(self) -> bool:
        text = self._log_text()
        return any(sign in text for sign in PORT_TAKEN_SIGNS)

    def _launch_failure(self, what: str) -> BrokerError:
        text = self._log_text()
        if any(sign in text for sign in PORT_TAKEN_SIGNS):
            return BrokerError(
                f"Kafka broker {what}: port {self.port} or {self.controller_port} on {HOST} is taken "
                f"by another process (see {self.server_log}); choose other ports"
            )
        tail = "\n".join(text.splitlines()[-25:])
        return BrokerError(f"Kafka broker {what}; see {self.server_log}. Last lines:\n{tail}")

    # ---- process bookkeeping ---------------------------------------------------------------

    def _read_state(self) -> dict:
        try:
            return json.loads((self.data_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _running_pid(self) -> int | None:
        try:
            pid = int((self.data_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_our_broker(pid) else None

    def _is_our_broker(self, pid: int) -> bool:
        """Alive, not a zombie, and really this data dir's broker (pids get reused)."""
        self._reap(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
        config = str(self.data_dir / CONFIG_FILE).encode()
        return BROKER_MAIN.encode() in cmdline and config in cmdline

    def _reap(self, pid: int) -> None:
        if self._process is not None and self._process.pid == pid:
            self._process.poll()

    def _signal(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._is_our_broker(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _forget(self) -> None:
        for name in (PID_FILE, STATE_FILE):
            (self.data_dir / name).unlink(missing_ok=True)


def _admin_call_succeeds(bootstrap: str) -> bool:
    """Readiness: a real metadata request through kafka-python answers with a broker list."""
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            pass
    except OSError:
        return False  # the listener opens only once the broker is up; no need to try the client
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000,
                                 client_id="msgindex-ready")
    except (KafkaError, OSError):
        return False
    try:
        return bool(admin.describe_cluster().get("brokers"))
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()
