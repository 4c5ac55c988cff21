"""Real RocketMQ for the tests and the benchmark: a NameServer + Broker in one JVM, a client JVM
(producer, pull consumer, admin queryMessage) and RocketMQ's own message store as a writer, all
from Maven Central jars (``java/`` holds the small Java mains; see their javadoc).

Every JVM gets ``user.home`` in a temp directory (RocketMQ logs under ``~/logs``) and talks to
127.0.0.1 only. The broker binds its remoting ports to 127.0.0.1; its HA listener (port + 1) is
bound by RocketMQ's DefaultHAService to the wildcard address, which has no setting to change it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from msgindex.errors import BrokerError, MsgIndexError
from msgindex.jvm import compile_java, java_command, stage_jars
from msgindex.kafka.broker import free_port, port_is_free

ROCKETMQ_VERSION = "5.3.3"  # 5.3.4's modules are incomplete on Maven Central
ARTIFACTS = [f"org.apache.rocketmq:{name}:{ROCKETMQ_VERSION}"
             for name in ("rocketmq-broker", "rocketmq-namesrv", "rocketmq-client", "rocketmq-tools")]
JAVA_SOURCES = Path(__file__).parent / "java"
HOST = "127.0.0.1"
# the test sizing: small enough that a few thousand messages roll several index and log files
HASH_SLOT_NUM = 1000
INDEX_NUM = 4000
COMMIT_LOG_FILE_SIZE = 256 * 1024
# A broker deletes its oldest commit-log files, whatever their age, once the disk is 85% used
# (and stops taking messages at 90%): a CI machine's full disk lost the first 786,432 bytes of the
# tests' store a minute after they were sent. The ground truth is what was sent, so keep it all.
KEEP_EVERY_FILE = ["cleanFileForciblyEnable=false", "diskMaxUsedSpaceRatio=95", "diskSpaceCleanForciblyRatio=99",
                   "diskSpaceWarningLevelRatio=99", "fileReservedTime=1000000"]
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]


def classpath() -> list[Path]:
    """Staged RocketMQ jars plus the compiled Java mains (first call may take a minute)."""
    jars = stage_jars(f"rocketmq-{ROCKETMQ_VERSION}", ARTIFACTS)
    return [compile_java(f"rocketmq-{ROCKETMQ_VERSION}-tests", JAVA_SOURCES, jars), *jars]


def _java(main: str, *args: str, home: Path, heap: str = "256m", flags: tuple[str, ...] = ()) -> list[str]:
    argv = java_command(classpath(), main, *args, heap=heap)
    argv[1:1] = [f"-Duser.home={home}", *JVM_FLAGS, *flags]
    return argv


def _run(argv: list[str], what: str, timeout: float) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise MsgIndexError(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}\n{done.stdout[-2000:]}")


def read_json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def write_json_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def _broker_port() -> int:
    """A listen port p with p - 2 (the broker's fast remoting port) and p + 1 (HA) free too."""
    for _ in range(50):
        port = free_port()
        if port > 1026 and port_is_free(port - 2) and port_is_free(port + 1):
            return port
    raise BrokerError("no free port triple for the RocketMQ broker")


@dataclass
class LocalRocketMQ:
    """A NameServer and one Broker in one JVM, with the store in `work/<store_name>`.

    `store_name` is the store directory's name (what msgindex's ``brokerName`` defaults to);
    `broker_name` the broker's own brokerName; `topics` are created (`queues` queues each) before
    the broker registers, so producers never wait for a route."""

    work: Path
    store_name: str = "broker-a-store"
    broker_name: str = "broker-a"
    commit_log_file_size: int = COMMIT_LOG_FILE_SIZE
    hash_slot_num: int = HASH_SLOT_NUM
    index_num: int = INDEX_NUM
    topics: tuple[str, ...] = ()
    queues: int = 4
    heap: str = "512m"

    def __post_init__(self) -> None:
        self.work = Path(self.work)
        self.process: subprocess.Popen | None = None
        self.namesrv = ""

    @property
    def store_root(self) -> Path:
        return self.work / self.store_name

    def start(self, timeout: float = 180) -> str:
        """Start both and return the NameServer address once the broker is up."""
        self.work.mkdir(parents=True, exist_ok=True)
        namesrv_port, broker_port = free_port(), _broker_port()
        self.namesrv = f"{HOST}:{namesrv_port}"
        home = self.work / "home"
        home.mkdir(exist_ok=True)
        namesrv_conf, broker_conf = self.work / "namesrv.conf", self.work / "broker.conf"
        namesrv_conf.write_text(f"listenPort={namesrv_port}\nbindAddress={HOST}\nrocketmqHome={home}\n")
        broker_conf.write_text("\n".join([
            "brokerClusterName=msgindexTest", f"brokerName={self.broker_name}", "brokerId=0",
            f"namesrvAddr={self.namesrv}", f"listenPort={broker_port}", f"bindAddress={HOST}",
            f"brokerIP1={HOST}", f"storePathRootDir={self.store_root}", f"rocketmqHome={home}",
            f"mappedFileSizeCommitLog={self.commit_log_file_size}",
            f"maxHashSlotNum={self.hash_slot_num}", f"maxIndexNum={self.index_num}",
            "autoCreateTopicEnable=false", "flushDiskType=ASYNC_FLUSH", *KEEP_EVERY_FILE,
        ]) + "\n")
        self._log = open(self.work / "server.out", "w")
        self.process = subprocess.Popen(
            _java("RocketMqServer", str(namesrv_conf), str(broker_conf), ",".join(self.topics), str(self.queues),
                  home=home, heap=self.heap),
            stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("READY"):
                return self.namesrv
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise BrokerError(f"RocketMQ did not start within {timeout}s; see {self.work / 'server.out'}")

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM (the brokers' shutdown hooks flush and close), then SIGKILL."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout:
            process.stdout.close()
        self._log.close()

    def client(self, command: str, *args: str, timeout: float = 600) -> None:
        """Run one RocketMqClient command against this broker."""
        with tempfile.TemporaryDirectory(prefix="rocketmq-client-") as home:
            _run(_java("RocketMqClient", command, self.namesrv, *args, home=Path(home)), f"RocketMqClient {command}", timeout)

    def produce(self, specs: list[dict], work: Path) -> list[dict]:
        """Send `specs` (see RocketMqClient); per message msgId, offsetMsgId, queueId, queueOffset."""
        spec_file, out = work / "produce-spec.jsonl", work / "produce-out.jsonl"
        write_json_lines(spec_file, specs)
        self.client("produce", str(spec_file), str(out))
        return read_json_lines(out)

    def pull(self, topics: list[str], work: Path) -> list[dict]:
        """Every message of `topics`, read through the broker's consume queues."""
        out = work / "pull-out.jsonl"
        self.client("pull", ",".join(topics), str(out))
        return read_json_lines(out)

    def query(self, queries: list[dict], work: Path) -> list[list[int]]:
        """The admin API's queryMessage answer (commit-log offsets) for each query."""
        query_file, out = work / "queries.jsonl", work / "query-out.jsonl"
        write_json_lines(query_file, queries)
        self.client("query", str(query_file), str(out))
        return [row["offsets"] for row in read_json_lines(out)]


def write_store(root: Path, specs: list[dict], *, commit_log_file_size: int, hash_slot_num: int,
                index_num: int, timeout: float = 300) -> list[dict]:
    """Put `specs` with RocketMQ's own DefaultMessageStore into a store at `root` (see
    StoreWriter); per message its offset, size, storeTimestamp and queueOffset."""
    with tempfile.TemporaryDirectory(prefix="rocketmq-store-writer-") as home:
        spec_file, out = Path(home) / "spec.jsonl", Path(home) / "out.jsonl"
        write_json_lines(spec_file, specs)
        _run(_java("StoreWriter", str(root), str(commit_log_file_size), str(hash_slot_num), str(index_num),
                   str(spec_file), str(out), home=Path(home)), "StoreWriter", timeout)
        return read_json_lines(out)


def environment_ready() -> str | None:
    """Why RocketMQ cannot run here (no java/javac/mvn), or None."""
    from shutil import which

    missing = [tool for tool in ("java", "javac", "mvn") if which(tool) is None]
    return f"needs {', '.join(missing)} on PATH" if missing else None


__all__ = ["LocalRocketMQ", "write_store", "classpath", "environment_ready"]
