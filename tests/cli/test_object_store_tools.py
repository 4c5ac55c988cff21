"""The tools on a store on object storage, through the real ``msgindex`` console script in a
subprocess against a real S3 API server (moto's): inspect (healthy, and each kind of damage named
by its object), compact (same answers after), repair's actions, retention, upgrade, and bad input
(one line, exit 2, nothing written locally).

The CLI takes a few seconds to start on a loaded machine: independent commands run concurrently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import numpy as np
import pytest

import msgindex
from msgindex.storage.location import parse_location
from msgindex.storage.objects import chunk_format
from msgindex.storage.objects.chunk_format import FOOTER_SIZE, decode_footer
from msgindex.storage.objects.shard import ObjectTuning
from msgindex.storage.objects.store import open_object_store
from msgindex.storage.objects.versions import ShardVersions
from tests.object_store import ACCESS_KEY, REGION, SECRET_KEY
from tests.storage.damage import record

CLI = str(Path(sys.executable).parent / "msgindex")  # the console script, as users run it
KEYS = [f"k{b}-{o}" for b in range(3) for o in range(0, 60, 7)] + ["shared1", "shared3"]


# --- running the CLI -------------------------------------------------------------------------------
def _env(s3, home: Path, *, aws: bool = True) -> dict[str, str]:
    """The environment of a user's shell: the server's AWS_* variables (or none at all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["MSGINDEX_HOME"] = str(home)
    return {**env, **s3.env} if aws else env


def _options(s3) -> list[str]:
    return [arg for k, v in s3.options.items() for arg in ("--storage-option", f"{k}={v}")]


def _run_all(commands: list[list[str]], env: dict[str, str], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Run the commands at once (each `msgindex ...` in its own process); their results in order."""
    processes = [subprocess.Popen([CLI, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, cwd=cwd) for command in commands]
    done = []
    for command, process in zip(commands, processes):
        out, err = process.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(command, process.returncode, out, err))
    return done


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return _run_all([command], env, cwd)[0]


@pytest.fixture
def shell(s3, tmp_path):
    """(env, cwd) of a user's shell in an empty directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return _env(s3, tmp_path / "home"), cwd


# --- stores and damage -----------------------------------------------------------------------------
def _store(s3, brokers=("a", "b"), appends: int = 4, per_append: int = 15):
    """A store written by the real append path: per broker `appends` chunks (no compaction)."""
    store = open_object_store(parse_location(s3.url(), s3.options), create=True,
                              tuning=ObjectTuning(compaction_interval_s=3600))
    for number, broker in enumerate(brokers):
        writer = store.writer(broker)
        for n in range(appends):
            writer.append([record(number % 3, n * per_append + i) for i in range(per_append)])
    return store


class Bucket:
    """The objects of a store, reached the way an operator's mistake or a bad disk would: boto3."""

    def __init__(self, s3, store) -> None:
        self.store = store
        self.client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=ACCESS_KEY,
                                   aws_secret_access_key=SECRET_KEY, region_name=REGION)
        self.name, self.prefix = store.location.bucket, store.location.prefix

    def url(self, key: str) -> str:
        return f"{self.store.root}/{key}"

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=f"{self.prefix}/{key}")["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=f"{self.prefix}/{key}", Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=f"{self.prefix}/{key}")

    def keys(self, under: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=f"{self.prefix}/{under}")
        return sorted(o["Key"][len(self.prefix) + 1 :] for page in pages for o in page.get("Contents", []))

    def flip(self, key: str, at: int) -> None:
        data = bytearray(self.get(key))
        data[at] ^= 0x5A
        self.put(key, bytes(data))

    def newest(self, broker: str):
        return ShardVersions(self.store.client, f"broker={broker}").latest()

    def chunk(self, broker: str, number: int = 0):
        """(key, ChunkRef, footer) of a chunk the newest version lists."""
        ref = self.newest(broker).chunks[number]
        key = f"broker={broker}/{ref.name}"
        data = self.get(key)
        footer = decode_footer(data[ref.info.footer_offset : ref.info.footer_offset + ref.info.footer_length],
                               ref.info.footer_crc, key)
        return key, ref, footer


def _problems(done: subprocess.CompletedProcess) -> list[str]:
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith("msgindex inspect: ") for line in lines), done.stderr
    return [line.removeprefix("msgindex inspect: ") for line in lines]


# --- inspect ---------------------------------------------------------------------------------------
def test_inspect_a_healthy_store_shard_version_and_chunk(s3, shell, tmp_path):
    store = _store(s3)
    bucket = Bucket(s3, store)
    key, ref, _ = bucket.chunk("a", 1)
    version = ShardVersions(store.client, "broker=b").key(2)
    no_aws = _env(s3, tmp_path / "home", aws=False)
    done = _run_all([["inspect", store.root, "--json"], ["inspect", f"{store.root}/broker=a"],
                     ["inspect", bucket.url(key), "--json"], ["inspect", bucket.url(version), "--json"],
                     ["inspect", store.root, "--quick", "--json"]], shell[0], shell[1])
    done.append(_run(["inspect", store.root, "--json", *_options(s3)], no_aws, shell[1]))
    for result in done:
        assert result.returncode == 0, result.stderr
    report = json.loads(done[0].stdout)
    assert report["kind"] == "object_store" and report["brokers"] == ["a", "b"] and report["records"] == 120
    a = report["shards"][0]
    assert (a["version"], a["versions_kept"]["count"], len(a["chunks"])) == (4, 4, 4)
    assert [c["records"] for c in a["chunks"]] == [15] * 4 and a["chunks"][1]["base_seq"] == 15
    assert a["source_ranges"] == bucket.newest("a").source_ranges.to_json() == {
        "orders": {"0": [[1, 15], [16, 30], [31, 45], [46, 60]]}, "payments": {"0": [[0, 13], [15, 28], [30, 43],
                                                                                   [45, 58]]}}
    assert a["orphans"] == [] and a["removed_pending_collection"] == [] and a["problems"] == []
    per_record = report["bytes_per_record"]
    assert set(per_record) == {"log", "hash", "footer", "total"}
    assert per_record["hash"] == 16.0  # two keys a record, 8 bytes an item
    assert per_record["total"] == pytest.approx(report["bytes"] / 120, abs=0.01)
    assert report["requests"]["total"] == sum(v for k, v in report["requests"].items() if k != "total")
    assert report["requests"]["GET"] >= 1 + 2 * 4 + 2 * 4  # manifest, every version, every chunk
    quick = json.loads(done[4].stdout)
    assert quick["requests"]["GET"] < report["requests"]["GET"] and quick["records"] == 120
    assert json.loads(done[5].stdout)["records"] == 120  # no AWS_* at all: the storage options
    assert "version: 4" in done[1].stdout and "problems: (none)" in done[1].stdout
    chunk = json.loads(done[2].stdout)
    assert chunk["kind"] == "chunk" and chunk["status"] == "listed by shard version 4 (seqs 15..29)"
    assert (chunk["records"], chunk["hash_items"], chunk["bytes"]) == (15, 30, ref.info.size)
    assert chunk["topics"] == ["orders", "payments"]
    shown = json.loads(done[3].stdout)
    assert (shown["kind"], shown["number"], shown["newest"], shown["records"]) == ("shard_version", 2, 4, 30)
    assert "older version" in shown["note"]
    assert list(Path(shell[1]).iterdir()) == []


def _wrong_item_chunks(monkeypatch):
    """Make the next chunks' hash items lie once: one item moved to the next record (which does not
    carry its key), checksums and all made right, so that only checking the items against the
    records finds it (a lookup of the key would silently miss)."""
    honest = chunk_format.hash_items

    def lying(columns):
        items = honest(columns).copy()
        hashes, counts = np.unique(items["key_hash"], return_counts=True)
        at = int(np.flatnonzero(items["key_hash"] == hashes[counts == 1][-1])[0])
        items["rel_seq"][at] = (int(items["rel_seq"][at]) + 1) % len(columns)
        return items

    monkeypatch.setattr(chunk_format, "hash_items", lying)


def test_inspect_names_each_damaged_object(s3, shell, monkeypatch):
    brokers = ("ok", "block", "page", "footer", "missing", "version", "orphan", "items")
    store = _store(s3, brokers, appends=3)
    bucket = Bucket(s3, store)
    _wrong_item_chunks(monkeypatch)
    store.writer("items").append([record(0, 1000 + i) for i in range(15)])
    monkeypatch.undo()

    block, _, footer = bucket.chunk("block", 0)
    bucket.flip(block, int(footer.directory.block_positions[0]) + 3)
    page, _, footer = bucket.chunk("page", 1)
    bucket.flip(page, footer.hash_offset + 5)
    footer_key, ref, _ = bucket.chunk("footer", 2)
    bucket.flip(footer_key, ref.info.footer_offset + FOOTER_SIZE + 2)
    missing, _, _ = bucket.chunk("missing", 1)
    bucket.delete(missing)
    version = ShardVersions(store.client, "broker=version").key(3)
    text = bucket.get(version)
    bucket.put(version, text.replace(b'"record_count":45', b'"record_count":44'))
    orphan = f"broker=orphan/chunks/0000000000000-{uuid.uuid4().hex[:16]}.chunk"
    bucket.put(orphan, bucket.get(bucket.chunk("orphan", 0)[0]))
    items = f"broker=items/{bucket.newest('items').chunks[-1].name}"

    named = {"block": block, "page": page, "footer": footer_key, "missing": missing, "version": version,
             "orphan": orphan, "items": items}
    done = _run_all([["inspect", store.root], ["inspect", store.root, "--quick"],
                     *(["inspect", f"{store.root}/broker={b}"] for b in brokers),
                     ["inspect", bucket.url(block)], ["inspect", bucket.url(version)]], *shell)
    everything, quick, shards, (chunk, version_object) = done[0], done[1], done[2:-2], done[-2:]
    assert everything.returncode == 2 and everything.stdout == ""
    problems = _problems(everything)
    for broker, key in named.items():
        assert any(line.startswith(f"{bucket.url(key)}: ") for line in problems), (broker, problems)
    assert all(any(line.startswith(f"{bucket.url(key)}: ") for key in named.values()) for line in problems), problems
    said = {broker: [line for line in problems if line.startswith(bucket.url(key))] for broker, key in named.items()}
    assert said["block"] == [f"{bucket.url(block)}: batch at byte 0 (seqs 0..): checksum mismatch"]
    assert said["page"] == [f"{bucket.url(page)}: hash items of page 0 fail their checksum (the chunk object is "
                            f"damaged)"]
    assert "chunk footer fails its checksum" in said["footer"][0]
    assert "chunk object listed by shard version 3 is missing" in said["missing"][0]
    assert "shard version checksum mismatch" in said["version"][0] and "--roll-back" in said["version"][0]
    assert "orphan chunk: no version lists it" in said["orphan"][0] and "it is harmless" in said["orphan"][0]
    assert any("carries no key of that hash" in line for line in said["items"]), said["items"]
    assert any("with no hash item: lookups of it miss" in line for line in said["items"]), said["items"]
    # the checks a reader makes: the version, a missing chunk, an orphan; not the chunks' insides
    quick_said = _problems(quick)
    assert {key for key in named.values() if any(line.startswith(bucket.url(key)) for line in quick_said)} == {
        missing, version, orphan}
    for broker, result in zip(brokers, shards):
        assert result.returncode == (0 if broker == "ok" else 2), (broker, result.stderr)
        if broker != "ok":
            assert all(line.startswith(bucket.url(named[broker])) for line in _problems(result)), result.stderr
    assert chunk.returncode == 2 and _problems(chunk) == said["block"]
    assert version_object.returncode == 2 and _problems(version_object)[0].startswith(
        f"{bucket.url(version)}: shard version checksum mismatch")


# --- compact ---------------------------------------------------------------------------------------
def test_compact_then_lookups_give_the_same_rows(s3, shell, tmp_path):
    store = _store(s3, ("a", "b"), appends=5)
    versions = {b: ShardVersions(store.client, f"broker={b}") for b in ("a", "b")}
    lookup = ["lookup", store.root, *(arg for key in KEYS for arg in ("--key", key)), "--format", "json"]
    local = msgindex.open(tmp_path / "local", create=True)
    before, dry, local_compact = _run_all([lookup, ["compact", store.root, "--dry-run"],
                                           ["compact", str(tmp_path / "local")]], *shell)
    assert before.returncode == 0 and len(before.stdout.splitlines()) > 20, before.stderr
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [f"{store.root}:",
                                       "  broker=a: 5 chunk(s): would merge them into 1 "
                                       f"({sum(c.info.size for c in versions['a'].latest().chunks):,} bytes to read)",
                                       "  broker=b: 5 chunk(s): would merge them into 1 "
                                       f"({sum(c.info.size for c in versions['b'].latest().chunks):,} bytes to read)",
                                       "would merge away 8 chunk(s) in 2 shard(s)"]
    assert [v.latest().number for v in versions.values()] == [5, 5]  # a dry run writes nothing
    assert local_compact.returncode == 0 and "a local store: its shards need no compaction" in local_compact.stdout
    local.close()

    no_aws = _env(s3, tmp_path / "home", aws=False)
    done = _run(["compact", store.root, *_options(s3)], no_aws, shell[1])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("  broker=a: 5 chunk(s) -> 1 (") and lines[1].endswith(
        "bytes merged); 0 object(s) past the grace period deleted")
    assert lines[-1] == "merged away 8 chunk(s) in 2 shard(s)"
    assert [len(v.latest().chunks) for v in versions.values()] == [1, 1]
    after, inspected, again = _run_all([lookup, ["inspect", store.root, "--json"], ["compact", store.root]], *shell)
    assert after.returncode == 0 and after.stdout == before.stdout  # the same rows, the same seqs
    assert inspected.returncode == 0, inspected.stderr
    shard = json.loads(inspected.stdout)["shards"][0]
    assert len(shard["chunks"]) == 1 and len(shard["removed_pending_collection"]) == 5  # kept for the grace period
    assert again.stdout.splitlines()[1] == "  broker=a: 1 chunk(s): nothing to merge; 0 object(s) past the grace " \
                                           "period deleted"
    assert list(shell[1].iterdir()) == []


# --- repair ----------------------------------------------------------------------------------------
def test_repair_collects_orphans_only_when_asked_and_puts_back_marks(s3, shell):
    store = _store(s3, ("a", "b"), appends=2)
    bucket = Bucket(s3, store)
    orphan = f"broker=a/chunks/0000000000000-{uuid.uuid4().hex[:16]}.chunk"
    bucket.put(orphan, bucket.get(bucket.chunk("a", 0)[0]))
    bucket.delete("_shards/b")
    lookup = ["lookup", store.root, "--key", "k0-3", "--key", "k1-3", "--format", "csv"]
    blind, plain, dry, young = _run_all([lookup, ["repair", store.root, "--broker", "a"],
                                         ["repair", store.root, "--collect-now", "--min-age", "0", "--dry-run"],
                                         ["repair", store.root, "--broker", "a", "--collect-now"]], *shell)
    assert blind.returncode == 0 and len(blind.stdout.splitlines()) == 2  # shard b's mark is gone: b is skipped
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [f"{store.root}:", "  broker=a: intact: nothing to repair",
                                         f"    1 orphan(s) and 0 removed object(s) ({len(bucket.get(orphan)):,} "
                                         f"bytes) wait for collection (after the grace period, 3600 s); --collect-now "
                                         f"deletes them now"]
    assert dry.returncode == 0 and "would delete 1 object(s)" in dry.stdout and \
        "would put back the shard mark" in dry.stdout, dry.stdout
    assert f"would delete {bucket.url(orphan)}" in dry.stdout
    assert "kept 1 written or removed less than --min-age ago" in young.stdout, young.stdout
    assert orphan in bucket.keys() and "_shards/b" not in bucket.keys()  # nothing was done yet

    done = _run(["repair", store.root, "--collect-now", "--min-age", "0s"], *shell)
    assert done.returncode == 0, done.stderr
    assert "  broker=a: deleted 1 object(s) no reader needs" in done.stdout
    assert "  broker=b: put back the shard mark (lookups skipped the shard without it)" in done.stdout
    assert orphan not in bucket.keys() and "_shards/b" in bucket.keys()
    inspected, found = _run_all([["inspect", store.root], lookup], *shell)
    assert inspected.returncode == 0, inspected.stderr
    assert len(found.stdout.splitlines()) == 3  # header, a's row, b's row


def test_repair_refuses_damage_and_rolls_back_a_damaged_version_only_when_asked(s3, shell):
    store = _store(s3, ("a", "b", "c", "d"), appends=3)
    bucket = Bucket(s3, store)
    old_version = ShardVersions(store.client, "broker=d").key(1)
    bucket.put(old_version, bucket.get(old_version).replace(b'"number":1', b'"number":7'))
    damaged, _, footer = bucket.chunk("a", 1)
    bucket.flip(damaged, int(footer.directory.block_positions[0]))
    version = ShardVersions(store.client, "broker=b").key(3)
    bucket.put(version, b"{" + bucket.get(version)[1:-9])
    for key in bucket.keys("broker=c/"):
        bucket.delete(key)
    before = bucket.keys()
    chunk_refused, version_refused, lost_young, lost, dry = _run_all([
        ["repair", store.root, "--broker", "a", "--collect-now", "--min-age", "0"],
        ["repair", store.root, "--broker", "b"], ["repair", store.root, "--broker", "c"],
        ["repair", store.root, "--broker", "c", "--min-age", "0"],
        ["repair", store.root, "--broker", "b", "--roll-back", "--dry-run"]], *shell)
    assert chunk_refused.returncode == 2
    assert chunk_refused.stderr.strip() == (f"msgindex repair: broker=a: refused: {bucket.url(damaged)}: batch at byte "
                                            f"0 (seqs 15..): checksum mismatch (a chunk cannot be rebuilt from the "
                                            f"store: restore the object, or re-index from Kafka into a new store)")
    assert version_refused.returncode == 2 and "--roll-back" in version_refused.stderr
    assert bucket.url(version) in version_refused.stderr and len(version_refused.stderr.splitlines()) == 1
    assert lost_young.returncode == 0 and "a writer may be committing its first version" in lost_young.stdout
    assert lost.returncode == 2 and "pass --forget-missing to accept the loss" in lost.stderr
    assert dry.returncode == 0 and "would roll back to version 2" in dry.stdout, dry.stdout
    assert bucket.keys() == before  # refusals and dry runs change nothing

    rolled, forgot, older = _run_all([["repair", store.root, "--broker", "b", "--roll-back"],
                                      ["repair", store.root, "--broker", "c", "--forget-missing", "--min-age", "0"],
                                      ["repair", store.root, "--broker", "d"]], *shell)
    assert older.returncode == 0 and "broker=d: deleted damaged older version(s) 1 (no reader reads them)" in \
        older.stdout, older.stdout
    assert old_version not in bucket.keys() and ShardVersions(store.client, "broker=d").latest().number == 3
    assert rolled.returncode == 0, rolled.stderr
    assert "broker=b: rolled back to version 2: damaged version(s) 3 deleted" in rolled.stdout
    assert "the shard holds the source offsets orders-1 [[1, 15], [16, 30]]; payments-1 [[0, 13], [15, 28]]: index " \
           "the offsets after them again" in rolled.stdout, rolled.stdout
    assert forgot.returncode == 0 and "no versions: its mark removed" in forgot.stdout, forgot.stdout
    assert version not in bucket.keys() and "_shards/c" not in bucket.keys()
    found, inspected = _run_all([["lookup", store.root, "--broker", "b", "--key", "k1-1", "--key", "k1-31",
                                  "--format", "csv"], ["inspect", f"{store.root}/broker=b"]], *shell)
    assert found.returncode == 0 and found.stdout.count("\n") == 2, found.stdout  # k1-31 was in version 3 only
    assert inspected.returncode == 2 and "orphan chunk" in inspected.stderr  # version 3's chunk, until collected


# --- retention and upgrade ---------------------------------------------------------------------------
def test_retention_and_upgrade_on_an_object_store(s3, shell):
    store = _store(s3, ("a",), appends=3)
    dry, upgrade = _run_all([["retention", store.root, "--max-age", "1d", "--dry-run"],
                             ["upgrade", store.root]], *shell)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1].startswith("would remove 2 chunk(s), ")
    assert upgrade.returncode == 0 and "always in the current format" in upgrade.stdout
    done = _run(["retention", store.root, "--max-age", "1d"], *shell)
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("removed 2 chunk(s), "), done.stdout
    assert "their objects are deleted after the grace period (3600 s)" in done.stdout
    found = _run(["lookup", store.root, "--key", "k0-1", "--key", "k0-31", "--format", "csv"], *shell)
    assert found.stdout.count("\n") == 2  # only the newest chunk's record is left


# --- bad input -------------------------------------------------------------------------------------
COMMANDS = (["inspect"], ["repair"], ["compact"], ["upgrade"], ["retention", "--max-age", "1d"],
            ["lookup", "--key", "k"])


def test_bad_urls_buckets_and_endpoints_are_one_line(s3, shell):
    """Each command meets each kind of bad input at least once (they share the code that says it)."""
    env, cwd = shell
    dead = ["--storage-option", "endpoint=http://127.0.0.1:9", "--storage-option", "max_retries=0",
            "--storage-option", "connect_timeout=1s"]
    bad = [("foo://bucket/index", [], "foo://bucket/index: unknown scheme 'foo'"),
           ("s3://no-such-bucket-here/index", [], "bucket 'no-such-bucket-here' does not exist"),
           (f"s3://{s3.bucket()}/index", dead, "endpoint http://127.0.0.1:9 does not answer")]
    cases = [([name, url, *rest, *options], message)
             for number, (name, *rest) in enumerate(COMMANDS)
             for url, options, message in (bad[number % 3], bad[(number + 1) % 3])]
    done = _run_all([command for command, _ in cases], env, cwd)
    for (command, message), result in zip(cases, done):
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1 and message in result.stderr, (command, result.stderr)
        assert result.stderr.startswith(f"msgindex {command[0]}: ") and result.stdout == "", result.stderr
    assert list(cwd.iterdir()) == [] and not (Path(env["MSGINDEX_HOME"]) / "logs").exists()
