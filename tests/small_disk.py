"""A small filesystem that tests can fill up: a 4 MiB tmpfs (needs root to mount; the fixture
skips with the reason where it cannot). Registered as the `small_disk` fixture in conftest.py."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

MOUNT_BYTES = 4 << 20


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={MOUNT_BYTES}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_disk(mount: Path, leave_bytes: int) -> Path:
    """A file that takes all but `leave_bytes` of the free space of `mount` (delete it to free them)."""
    filler = mount / f"filler-{uuid.uuid4().hex}"
    free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(free - leave_bytes, 0))
    return filler
