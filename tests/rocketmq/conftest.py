"""Fixtures of the RocketMQ store tests; the broker itself is the session fixture
``rocketmq_dataset`` of ``tests/conftest.py`` (shared with the data source tests)."""

from __future__ import annotations

import base64
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.rocketmq.harness import environment_ready, write_store

# A store written by RocketMQ's own DefaultMessageStore (see java/StoreWriter.java): tiny files so
# that 300 messages roll many commit-log files (blank end-of-file markers) and index files.
WRITER_COMMIT_LOG_FILE_SIZE = 16 * 1024
WRITER_HASH_SLOT_NUM = 16
WRITER_INDEX_NUM = 50
ENTRIES_PER_FILE = WRITER_INDEX_NUM - 1  # entry 0 is never written
LONG_TOPIC = "L" * 130 + "-v2"  # longer than 127 characters: stored with the v2 magic code
CODECS = (None, "LZ4", "ZSTD", "ZLIB")


@dataclass(frozen=True)
class WrittenStore:
    """A store root written by RocketMQ's store, the specs put and the writer's report of each."""

    root: Path
    specs: tuple[dict, ...]
    written: tuple[dict, ...]

    def copy(self, destination: Path) -> Path:
        """A private copy of the store to damage."""
        target = destination / self.root.name
        shutil.copytree(self.root, target)
        return target


def writer_specs(seed: int = 3) -> list[dict]:
    """300 messages. Most have 2-3 KEYS tokens, so some messages' entries span two index files;
    every fourth index file is instead filled exactly and the next message is put 1.3 s later, so
    that the next file's first entry holds a time diff against the begin time it inherited (the
    case where an entry's index time is later than the message's store time)."""
    rng = random.Random(seed)
    specs, entries, exact_fills = [], 0, 0
    sleep_next = False
    for i in range(300):
        room = ENTRIES_PER_FILE - entries % ENTRIES_PER_FILE
        tokens = [f"w{i % 13}", f"n{i}"] + (["w1"] if i % 17 == 0 else [])
        exact = room <= 4 and (entries // ENTRIES_PER_FILE) % 4 == 1
        if exact:
            tokens = tokens[: room - 1] if room - 1 <= len(tokens) else tokens + ["w1"] * (room - 1 - len(tokens))
            exact_fills += 1
        body = ("".join(rng.choice("xyz ") for _ in range(rng.choice([10, 300, 5000])))).encode()
        properties = {"UNIQ_KEY": f"UNIQ{i:06d}", "TAGS": f"tag{i % 2}", "p": str(i)}
        if tokens:
            properties["KEYS"] = " ".join(tokens)
        specs.append({
            "topic": LONG_TOPIC if i % 5 == 0 else ("Aa" if i % 2 else "BB"),
            "queueId": i % 3,
            "properties": properties,
            "bodyB64": base64.b64encode(body).decode(),
            "compress": CODECS[i % 4] if len(body) > 100 else None,
            "bornV6": i % 3 == 0,
            "storeV6": i % 4 == 0,
            "sleepMs": 1300 if sleep_next else 0,
        })
        entries += 1 + len(tokens)
        sleep_next = exact
    assert exact_fills >= 3
    return specs


@pytest.fixture(scope="session")
def written_store(tmp_path_factory: pytest.TempPathFactory) -> WrittenStore:
    missing = environment_ready()
    if missing:
        pytest.skip(f"RocketMQ's message store {missing}")
    root = tmp_path_factory.mktemp("rocketmq-writer") / "store-w"
    specs = writer_specs()
    written = write_store(root, specs, commit_log_file_size=WRITER_COMMIT_LOG_FILE_SIZE,
                          hash_slot_num=WRITER_HASH_SLOT_NUM, index_num=WRITER_INDEX_NUM)
    return WrittenStore(root, tuple(specs), tuple(written))
