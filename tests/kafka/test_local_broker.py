"""`msgindex kafka start|stop|status` and LocalBroker: each test runs its OWN broker on fresh free
ports and a temp data dir (never the session broker), and stops it."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from msgindex.errors import BrokerError, ToolMissingError
from msgindex.kafka import broker as broker_module
from msgindex.kafka.admin import OutgoingRecord, create_topics, latest_offsets, produce
from msgindex.kafka.broker import LocalBroker, free_port

pytestmark = pytest.mark.kafka

CLI = [sys.executable, "-c", "import sys; from msgindex.cli import main; sys.exit(main())", "kafka"]


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def broker_args(tmp_path):
    args = ["--port", str(free_port()), "--controller-port", str(free_port()),
            "--data-dir", str(tmp_path / "kafka")]
    yield args
    _cli("stop", *args)  # whatever a test left running


@pytest.fixture
def broker(tmp_path):
    instance = LocalBroker(tmp_path / "kafka", port=free_port(), controller_port=free_port())
    yield instance
    instance.stop(timeout=10)


def _pid(data_dir) -> int:
    return int((data_dir / broker_module.PID_FILE).read_text())


def test_cli_start_status_second_start_stop(broker_args, tmp_path):
    port = broker_args[1]
    started = _cli("start", *broker_args)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"127.0.0.1:{port}"
    pid = _pid(tmp_path / "kafka")

    status = _cli("status", *broker_args)
    assert status.returncode == 0
    assert f"running (pid {pid}) at 127.0.0.1:{port}" in status.stdout

    began = time.monotonic()
    again = _cli("start", *broker_args)
    assert again.returncode == 0 and again.stdout.strip() == f"127.0.0.1:{port}"
    assert time.monotonic() - began < 15, "a second start must not launch or wait for a broker"
    assert _pid(tmp_path / "kafka") == pid

    # the broker outlived the CLI process that started it and serves clients
    topic = create_topics(f"127.0.0.1:{port}", ["cli-started"], partitions=2)[0]
    produce(f"127.0.0.1:{port}", topic, [OutgoingRecord(key="k", partition=1)])
    assert latest_offsets(f"127.0.0.1:{port}", [topic]) == {(topic, 0): 0, (topic, 1): 1}

    stopped = _cli("stop", *broker_args)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)
    after = _cli("status", *broker_args)
    assert after.returncode == 1 and "not running" in after.stdout


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_cli_stop_and_status_when_nothing_runs(tmp_path):
    args = ["--port", str(free_port()), "--controller-port", str(free_port()),
            "--data-dir", str(tmp_path / "never-started")]
    stopped = _cli("stop", *args, timeout=60)
    assert stopped.returncode == 0 and "no broker running" in stopped.stdout
    status = _cli("status", *args, timeout=60)
    assert status.returncode == 1 and "not running" in status.stdout


def test_cli_start_on_a_taken_port_says_so(broker_args):
    port = int(broker_args[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = _cli("start", *broker_args, timeout=60)
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is already taken" in result.stderr
    assert result.stdout == ""


def test_port_taken_after_the_check_is_detected_from_the_broker_log(broker, monkeypatch):
    # the race the pre-check cannot see: the port is grabbed between the check and the bind
    monkeypatch.setattr(broker_module, "port_is_free", lambda port, host="127.0.0.1": True)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", broker.controller_port))
        squatter.listen()
        with pytest.raises(BrokerError, match="taken by another process"):
            broker.start(timeout=120)
    assert not broker.status().running


def test_restart_keeps_topics_and_data(broker):
    bootstrap = broker.start()
    topic = create_topics(bootstrap, ["survives-restart"], partitions=1)[0]
    produce(bootstrap, topic, [OutgoingRecord(key=f"k{i}", partition=0) for i in range(5)])
    assert broker.stop() is True
    assert broker.start() == bootstrap  # storage is not reformatted
    assert latest_offsets(bootstrap, [topic]) == {(topic, 0): 5}


def test_stop_escalates_to_sigkill_when_sigterm_is_not_enough(broker):
    broker.start()
    pid = broker.status().pid
    os.kill(pid, signal.SIGSTOP)  # a stopped JVM cannot act on SIGTERM; SIGKILL still works
    began = time.monotonic()
    assert broker.stop(timeout=1.0) is True
    assert time.monotonic() - began < 15
    assert not broker.status().running
    assert broker.stop() is False


def test_missing_java_is_a_clear_error(broker, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolMissingError, match="'java' is not on PATH"):
        broker.start()


def test_equal_ports_are_rejected(tmp_path):
    port = free_port()
    with pytest.raises(BrokerError, match="must differ"):
        LocalBroker(tmp_path, port=port, controller_port=port)


def test_cli_jars_prints_the_spark_connector_classpath():
    result = _cli("jars", timeout=600)
    assert result.returncode == 0, result.stderr
    jars = result.stdout.strip().split(",")
    assert any(os.path.basename(jar).startswith("spark-sql-kafka-0-10_2.13-") for jar in jars)
    assert any(os.path.basename(jar).startswith("spark-avro_2.13-") for jar in jars)  # from_avro in --index-field
    assert all(jar.endswith(".jar") and os.path.isfile(jar) for jar in jars)


def test_missing_maven_on_a_fresh_machine_is_a_clear_cli_error(broker_args, tmp_path):
    # a fresh machine: no staged jars (empty MSGINDEX_HOME) and java but no mvn on PATH
    only_java = tmp_path / "bin"
    only_java.mkdir()
    java = os.path.realpath(subprocess.run(["bash", "-c", "command -v java"], capture_output=True, text=True).stdout.strip())
    if not os.path.isfile(java):
        pytest.skip("no java on PATH to keep while hiding mvn")
    (only_java / "java").symlink_to(java)
    env = {**os.environ, "PATH": str(only_java), "MSGINDEX_HOME": str(tmp_path / "home")}
    result = subprocess.run([*CLI, "start", *broker_args], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert "'mvn' is not on PATH" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cluster_ids_never_start_with_a_dash(monkeypatch):
    # byte 0xF8 encodes to '-' first: kafka-storage's argument parser took such an id for an
    # option ("argument --cluster-id/-t: expected one argument") and the first start failed
    dashed, plain = uuid.UUID(bytes=b"\xf8" + b"\x01" * 15), uuid.UUID(bytes=b"\x10" * 16)
    drawn = iter([dashed, dashed, plain])
    monkeypatch.setattr(broker_module.uuid, "uuid4", lambda: next(drawn))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    assert broker_module.new_cluster_id() == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    monkeypatch.undo()
    ids = [broker_module.new_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids) and len(set(ids)) == 2000
