"""Writer processes for test_crash_safety, started from a fork server so that each trial costs a
fork, not a Python start-up with numpy and pyarrow imports.

The server reads commands from stdin, one per line: ``run STORE_ROOT BROKER SEED``. For each it
forks a writer that appends the deterministic batches of SEED to the shard, printing
``pid <pid>`` first, then ``begin <batch id>`` before and ``commit <batch id>`` after each
append; the server prints ``exit <status>`` when that writer is gone (the parent kills it with
SIGKILL mid-batch). An empty line or EOF stops the server.

usage: python crash_writer.py
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.storage

from msgindex.storage.store import open_store  # noqa: E402
from tests.storage.shard_model import crash_batches  # noqa: E402


def say(message: str) -> None:
    """One line in ONE write: with PYTHONUNBUFFERED, print() writes text and newline separately,
    and a kill -9 between the two would leave a torn line for the parent to read."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def write_batches(root: str, broker: str, seed: int) -> None:
    batches = crash_batches(seed)
    with open_store(root) as store, store.writer(broker) as writer:
        for batch_id, batch in enumerate(batches):
            say(f"begin {batch_id}")
            writer.append(batch)
            say(f"commit {batch_id}")


def serve() -> int:
    for line in sys.stdin:
        command = line.split()
        if not command:
            break
        _, root, broker, seed = command
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                say(f"pid {os.getpid()}")
                write_batches(root, broker, int(seed))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        say(f"exit {status}")
    return 0


if __name__ == "__main__":
    sys.exit(serve())
