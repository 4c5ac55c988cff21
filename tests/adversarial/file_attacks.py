"""Every file kind of a store x every damage x every reader, judged against a model of what was
written. Run as a script (``python -m tests.adversarial.file_attacks WORKDIR ATTACK...``) by
``test_file_attacks.py``: a damaged mapped file could kill a process with SIGBUS, and that must
show as one attack's exit status, not as a dead pytest.

One attack = one (file kind, damage) applied to a fresh copy of a small store, then each reader:
``msgindex.open(...).lookup`` / ``.scan`` / ``.scan`` of a time window, ``msgindex lookup`` /
``lookup --scan`` / ``inspect STORE`` / ``inspect FILE`` / ``upgrade`` through ``msgindex.cli.main``,
then ``msgindex repair`` (after which the store must answer right, or repair must refuse naming
the file without sending the user back to repair), and last a writer appending one more record.
Each reader's outcome is one of:

* the right answer (the model's rows, exactly);
* a clear error: a msgindex error class whose message names the damaged file (or the CLI's exit 2
  with one line naming it);
* WRONG: anything else (other rows, another exception, exit 1, several lines, a deleted file).

Prints one JSON line per attack: ``{"attack": ..., "outcomes": [[reader, result, detail], ...]}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import random
import shutil
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgindex
from msgindex.cli import main
from msgindex.errors import MsgIndexError
from msgindex.storage import hot_keys
from msgindex.storage.hash_index import entry_sums, hash_run
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE, IndexFile
from msgindex.storage.partition_brokers import FILE_NAME as PARTITION_BROKERS_FILE
from msgindex.storage.partition_brokers import encode_partition_brokers
from tests.adversarial.tally import GAP, RIGHT, WRONG  # noqa: E402
from tests.storage import damage
from tests.storage.shard_model import model_lookup, model_scan, table_rows

# Tallied as gaps, not failures: damage readers miss and only inspect finds, and damage a reader
# or tool meets with a safe answer (an error, nothing written) naming another file than the
# damaged one. None is left. Readers compare a hash index file with the checkpoint (header, slot
# count), its newest few entries with the log (verify._check_newest_entries), and every entry a
# lookup follows with its record: it must carry a key of the entry's hash
# (VerifiedReads._check_entry_target), and as many keys of that hash as entries of it point there
# (VerifiedReads._check_repeated_entries: an entry moved to another record that carries the same
# key). An entry and its record that disagree are named both (verify.ExpectedEntries.record_file):
# another shard's log swapped in is then named by `msgindex repair` too, not only the hash file.
KNOWN_GAPS: set[str] = set()
VICTIM_SHARD = "b1"
# segments of 1,000 bytes: b1's log has three, so one is in the middle
SETTINGS = dataclasses.replace(damage.SMALL, segment_bytes=1000)
WINDOW = (damage.BASE_MS + 10_000, damage.BASE_MS + 30_000)
EXTRA = damage.record(0, 100_000)  # what the writer appends after the damage


# --- the store and its files ----------------------------------------------------------------------
def build_pristine(root: Path) -> damage.SmallStore:
    """The small store of tests/storage/damage.py (three log segments in b1), with a hash run on
    each sealed hash index file (the writer seals runs only past 65,536 entries; a short min_chain
    makes this one have rows), and the indexing job's partition -> shard map."""
    store = damage.build(root, settings=SETTINGS)
    (root / PARTITION_BROKERS_FILE).write_bytes(encode_partition_brokers({("orders", 1): "b1", ("orders", 2): "b2"}))
    for broker in store.models:
        for path in damage.index_files(store, broker)[:-1]:
            with IndexFile.open(path, SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
                assert hash_run.write(index, 1, index.index_count, min_chain=2), f"{path}: no hash run written"
    return store


@dataclass(frozen=True)
class FileKind:
    """A file (or directory) of a store: how to find it, and how readers may treat its damage."""

    name: str
    locate: Callable[[damage.SmallStore], Path]
    derived: bool = False  # readers may recompute or ignore it: damage may give the right answer
    empty: bool = False  # a lock file: holds no bytes to truncate, zero or scribble
    directory: bool = False
    optional: bool = False  # no reader needs it and a store may lack it: deleting it is no damage


def _shard(store: damage.SmallStore) -> Path:
    return damage.shard(store, VICTIM_SHARD)


def _runs(store: damage.SmallStore) -> Path:
    return hash_run.run_path(damage.index_files(store, VICTIM_SHARD)[0])


def _hot_key_copy(store: damage.SmallStore) -> Path:
    """The victim shard's hot-key copy of its 72 records (the writer copies stretches of 262,144:
    this one is written here, every shared key hot), and b2's of the same name (for the swap)."""
    for broker in store.models:
        with msgindex.open(store.root) as handle, handle.reader(broker) as reader:
            count = reader.checkpoint.record_count
            data = hot_keys.build(reader.log, 0, count, min_share=0.0, min_rows=5)
        path = hot_keys.copy_path(damage.shard(store, broker) / hot_keys.DIRECTORY, 0, count)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    assert hot_keys.HotKeyCopy.open(path).groups, f"{path}: no hot key copied"
    return hot_keys.copy_path(_shard(store) / hot_keys.DIRECTORY, 0, len(store.models[VICTIM_SHARD].records))


KINDS = [
    FileKind("manifest", lambda s: s.root / "msgindex.json"),
    FileKind("manifest_lock", lambda s: s.root / "manifest.lock", empty=True),
    FileKind("checkpoint", lambda s: _shard(s) / "checkpoint"),
    FileKind("shard_lock", lambda s: _shard(s) / "lock", empty=True),
    FileKind("log_oldest", lambda s: damage.segments(s, VICTIM_SHARD)[0]),
    FileKind("log_middle", lambda s: damage.segments(s, VICTIM_SHARD)[1]),
    FileKind("log_active", lambda s: damage.segments(s, VICTIM_SHARD)[-1]),
    FileKind("offset_index", lambda s: damage.segments(s, VICTIM_SHARD, ".index")[0], derived=True),
    FileKind("offset_index_active", lambda s: damage.segments(s, VICTIM_SHARD, ".index")[-1], derived=True),
    FileKind("time_index", lambda s: damage.segments(s, VICTIM_SHARD, ".timeindex")[0], derived=True),
    FileKind("time_index_active", lambda s: damage.segments(s, VICTIM_SHARD, ".timeindex")[-1], derived=True),
    FileKind("summary", lambda s: damage.segments(s, VICTIM_SHARD, ".summary")[0], derived=True),
    FileKind("hash_index_sealed", lambda s: damage.index_files(s, VICTIM_SHARD)[0]),
    FileKind("hash_index_active", lambda s: damage.index_files(s, VICTIM_SHARD)[-1]),
    FileKind("hash_run", _runs, derived=True),
    FileKind("entry_sums", lambda s: entry_sums.sums_path(damage.index_files(s, VICTIM_SHARD)[0]), derived=True),
    FileKind("partition_brokers", lambda s: s.root / PARTITION_BROKERS_FILE, optional=True),
    FileKind("hot_key_copy", _hot_key_copy, derived=True),
    FileKind("shard_dir", _shard, directory=True),
    FileKind("log_dir", lambda s: _shard(s) / "log", directory=True),
    FileKind("index_dir", lambda s: _shard(s) / "index", directory=True),
]


def _scribble(path: Path) -> None:
    size = path.stat().st_size
    damage.scribble(path, size // 2, 8)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncate": lambda p: damage.truncate(p, p.stat().st_size // 2),
    "empty": lambda p: damage.truncate(p, 0),
    "zero": damage.zero,
    "scribble": _scribble,
    "scribble_head": lambda p: damage.scribble(p, 0, 8, seed=11),
    "delete": damage.remove,
    "swap": lambda p: _swap_with_other_shard(p),
    "entry_other_record": lambda p: _move_entry(p, lambda phy: 1 if phy == 0 else phy - 1),
    # 12 records on: the same topic (offset % 3) and shared key (offset % 4); b1 holds 72 records
    "entry_same_key": lambda p: _move_entry(p, lambda phy: phy + 12 if phy + 12 < 72 else phy - 12),
    "directory": damage.replace_by_directory,
    # random bytes over the middle of a hash index file's written entries (header and slots intact)
    "scribble_entries": lambda p: _scribble_entries(p),
    "foreign_checkpoint": lambda p: _foreign_checkpoint(p),
}


def _scribble_entries(path: Path) -> None:
    with IndexFile.open(path, SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
        written = index.entry_count
    first = 1 + written // 4
    count = max(1, min(100, written // 2))
    at = HEADER_SIZE + SETTINGS.hash_slot_num * 4 + first * ENTRY_SIZE
    raw = bytearray(path.read_bytes())
    rng = random.Random(5)
    raw[at : at + count * ENTRY_SIZE] = bytes(rng.randrange(256) for _ in range(count * ENTRY_SIZE))
    path.write_bytes(bytes(raw))


def _foreign_checkpoint(path: Path) -> None:
    """The checkpoint of a shard of another store, of the same name but other records (its log
    position falls inside a batch of this shard's log, its counts are not this shard's)."""
    with tempfile.TemporaryDirectory() as other:
        store = damage.build(Path(other) / "store", brokers=(VICTIM_SHARD,), appends=7, per_append=5,
                             settings=SETTINGS)
        path.write_bytes((damage.shard(store, VICTIM_SHARD) / "checkpoint").read_bytes())


def _move_entry(path: Path, move: Callable[[int], int]) -> None:
    """Entry 2 of a hash index file (the shared key of its first record) pointed at another
    committed record: the one before (other keys), or one with the same topic and shared key."""
    at = HEADER_SIZE + SETTINGS.hash_slot_num * 4 + 2 * ENTRY_SIZE + 4
    raw = bytearray(path.read_bytes())
    struct.pack_into(">q", raw, at, move(struct.unpack_from(">q", raw, at)[0]))
    path.write_bytes(bytes(raw))


def _swap_with_other_shard(path: Path) -> None:
    """Replace `path` by its namesake of shard b2 (same format, valid checksums, other data)."""
    other = Path(str(path).replace(f"broker={VICTIM_SHARD}", "broker=b2"))
    if other == path or not other.exists():  # store-level files, b1-only names: a copy of itself
        other = path
    data = other.read_bytes() if other.is_file() else None
    damage.remove(path)
    if data is None:
        shutil.copytree(other if other != path else path.parent, path)
    else:
        path.write_bytes(data)


def attack_ids() -> list[str]:
    """Every (file kind, damage) pair that means something ("kind:damage")."""
    ids = []
    for kind in KINDS:
        for name in DAMAGES:
            if (kind.empty or kind.directory) and name not in ("delete", "directory") or (
                    name == "swap" and (kind.empty or kind.directory or kind.name.startswith("manifest")
                                        or kind.name == "partition_brokers")) or (
                    name in ("entry_other_record", "entry_same_key", "scribble_entries")
                    and not kind.name.startswith("hash_index")) or (
                    name == "foreign_checkpoint" and kind.name != "checkpoint"):
                continue
            ids.append(f"{kind.name}:{name}")
    return ids


# --- readers and judging --------------------------------------------------------------------------
class Judge:
    """Judges each reader of one damaged store."""

    def __init__(self, store: damage.SmallStore, kind: FileKind, damage_name: str, victim: Path,
                 unchanged: bool) -> None:
        self.store, self.kind, self.damage_name, self.victim = store, kind, damage_name, victim
        self.unchanged = unchanged  # the damage left the same bytes (e.g. an identical file swapped in)
        self.gap = f"{kind.name}:{damage_name}" in KNOWN_GAPS
        self.outcomes: list[tuple[str, str, str]] = []

    def names_victim(self, text: str) -> bool:
        """Whether an error message names the damaged file: its path relative to the store
        (``broker=b1/log/000...0.log``), which the absolute path in a message contains."""
        return str(self.victim.relative_to(self.store.root)) in text

    def api(self, reader: str, run: Callable[[], object], expected: object) -> None:
        try:
            got = run()
        except MsgIndexError as error:
            line = str(error)
            if self.names_victim(line):
                self.outcomes.append((reader, type(error).__name__, line))
            else:
                self.outcomes.append((reader, WRONG, f"{type(error).__name__} not naming the file: {line}"))
            return
        except Exception as error:  # noqa: BLE001 - judged: a foreign exception is WRONG
            self.outcomes.append((reader, WRONG, f"{type(error).__name__}: {error} "
                                                 f"{traceback.format_exc(limit=-3)}"))
            return
        if got == expected:
            self.outcomes.append((reader, RIGHT, ""))
        else:
            self.outcomes.append((reader, GAP if self.gap else WRONG,
                                  f"silent wrong answer: {_difference(got, expected)}"))

    def cli(self, reader: str, argv: list[str], expected: list[tuple] | None) -> None:
        """`expected`: the rows `argv` must print (JSON lines), None: any exit 0 (inspect)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse
                code = exit_.code
        said = err.getvalue().strip()
        if code == 0:
            if expected is None:
                if (self.kind.derived or self.kind.optional) and self.damage_name == "delete" or self.kind.empty \
                        or self.unchanged:
                    self.outcomes.append((reader, RIGHT, ""))
                else:  # a file of the store damaged, and inspect says all is well
                    self.outcomes.append((reader, WRONG, "inspect exit 0 on a damaged file"))
                return
            got = [_cli_row(json.loads(line)) for line in out.getvalue().splitlines()]
            want = [_cli_row_of_model(row) for row in expected]
            self.outcomes.append((reader, RIGHT, "") if got == want else
                                 (reader, GAP if self.gap else WRONG, f"silent wrong answer: {_difference(got, want)}"))
            return
        lines = said.splitlines()
        if code != 2:
            self.outcomes.append((reader, WRONG, f"exit {code}: {said[-500:]}"))
        elif not any(self.names_victim(line) for line in lines):
            self.outcomes.append((reader, WRONG, f"exit 2 without naming the file: {said[-500:]}"))
        elif not reader.startswith("cli_inspect") and len(lines) != 1:  # inspect: one line per problem
            self.outcomes.append((reader, WRONG, f"exit 2 with {len(lines)} lines: {said[-500:]}"))
        else:
            self.outcomes.append((reader, "exit 2", lines[0]))


def _cli_row(row: dict) -> tuple:
    ms = int(datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00")).timestamp() * 1000)
    return (ms, row["broker"], row["topic"], row["partition"], row["offset"], row["seq"], row["key"],
            tuple(row["keys"]))


def _cli_row_of_model(row: tuple) -> tuple:
    return row[:8]


def _difference(got: object, expected: object) -> str:
    if isinstance(got, list) and isinstance(expected, list):
        missing = [r for r in expected if r not in got]
        extra = [r for r in got if r not in expected]
        return f"{len(got)} rows instead of {len(expected)}; missing {missing[:2]}, extra {extra[:2]}"
    return f"{got!r:.200} != {expected!r:.200}"


def run_attack(pristine: damage.SmallStore, workdir: Path, attack: str) -> list[tuple[str, str, str]]:
    kind_name, damage_name = attack.split(":")
    kind = next(k for k in KINDS if k.name == kind_name)
    store = damage.copy_of(pristine, workdir / attack.replace(":", "-"))
    try:
        victim = kind.locate(store)
        before = _listing_without(store.root, victim)
        content = _content(victim)
        DAMAGES[damage_name](victim)
        judge = Judge(store, kind, damage_name, victim, unchanged=_content(victim) == content)
        # lookups consult copies once they meet this many candidates (the small store has 72)
        min_rows = hot_keys.MIN_ROWS
        hot_keys.MIN_ROWS = 1 if kind.name == "hot_key_copy" else min_rows
        try:
            _read_all(judge, store, victim)
        finally:
            hot_keys.MIN_ROWS = min_rows
        if _listing_without(store.root, victim) != before:
            judge.outcomes.append(("files", WRONG, "a reader changed or deleted files of the store"))
        _repair(judge, store)
        _append(judge, store, victim, before)
        return judge.outcomes
    finally:
        shutil.rmtree(store.root, ignore_errors=True)


def _content(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _read_all(judge: Judge, store: damage.SmallStore, victim: Path) -> None:
    root, models, keys = store.root, list(store.models.values()), store.keys()
    every_key = model_lookup(models, keys)
    everything = model_scan(models)
    window = model_scan(models, begin_ms=WINDOW[0], end_ms=WINDOW[1])
    judge.api("api_lookup", lambda: _api(root, lambda s: table_rows(s.lookup(keys))), every_key)
    judge.api("api_scan", lambda: _api(root, lambda s: table_rows(list(s.scan()))), everything)
    judge.api("api_scan_window", lambda: _api(root, lambda s: table_rows(list(
        s.scan(begin_ms=WINDOW[0], end_ms=WINDOW[1])))), window)
    some_keys = keys[3::7] + [f"shared{n}" for n in range(4)]  # most records only through shared keys
    judge.cli("cli_lookup", ["lookup", str(root), "--limit", "0", "--format", "json",
                             *[a for k in some_keys for a in ("--key", k)]],
              model_lookup(models, some_keys))
    judge.cli("cli_scan", ["lookup", str(root), "--scan", "--limit", "0", "--format", "json", "--begin", str(WINDOW[0]),
                           "--end", str(WINDOW[1])], window)
    judge.cli("cli_inspect", ["inspect", str(root)], None)
    judge.cli("cli_inspect_file", ["inspect", str(victim)], None)
    _upgrade(judge, store)


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue().strip()


def _upgrade(judge: Judge, store: damage.SmallStore) -> None:
    """`msgindex upgrade` of a current store changes nothing; it must not call a damaged shard that
    holds records "nothing committed"."""
    code, said, err = _run_cli(["upgrade", str(store.root)])
    if code == 0:
        claims_empty = f"broker={VICTIM_SHARD}: nothing committed" in said
        judge.outcomes.append(("cli_upgrade", WRONG, f"exit 0 saying: {said[-300:]}") if claims_empty
                              else ("cli_upgrade", RIGHT, ""))
    elif code == 2 and len(err.splitlines()) == 1 and judge.names_victim(err):
        judge.outcomes.append(("cli_upgrade", "exit 2", err))
    else:
        judge.outcomes.append(("cli_upgrade", WRONG, f"exit {code}: {err[-500:]}"))


def _repair(judge: Judge, store: damage.SmallStore) -> None:
    """`msgindex repair`: then the store answers right, or repair refuses in one line per shard
    that names the damaged file and does not send the user to `msgindex repair` again."""
    code, _said, err = _run_cli(["repair", str(store.root)])
    if code == 0:
        models, keys = list(store.models.values()), store.keys()
        judge.api("cli_repair", lambda: _api(store.root, lambda s: table_rows(s.lookup(keys))),
                  model_lookup(models, keys))
    elif code != 2 or not err:
        judge.outcomes.append(("cli_repair", WRONG, f"exit {code}: {err[-500:]}"))
    elif not judge.names_victim(err):  # (a known gap: safe, nothing written, another file named)
        judge.outcomes.append(("cli_repair", GAP if judge.gap else WRONG, f"exit 2 without naming the file: {err[-500:]}"))
    elif "run `msgindex repair" in err:
        judge.outcomes.append(("cli_repair", WRONG, f"repair tells the user to run repair: {err[-500:]}"))
    else:
        judge.outcomes.append(("cli_repair", "exit 2", err.splitlines()[0]))


def _api(root: Path, read: Callable[[msgindex.Store], list]) -> list:
    with msgindex.open(root) as store:
        return read(store)


def _append(judge: Judge, store: damage.SmallStore, victim: Path, before: dict[str, int]) -> None:
    """A writer after the damage: refuses clearly, or appends without losing anything committed
    (every file there before is still there, no shorter) and then reads right (or errs clearly)."""
    try:
        with msgindex.open(store.root) as handle, handle.writer(VICTIM_SHARD) as writer:
            writer.append([EXTRA])
    except MsgIndexError as error:
        line = str(error)
        judge.outcomes.append(("writer", type(error).__name__, line) if judge.names_victim(line)
                              else ("writer", WRONG, f"{type(error).__name__} not naming the file: {line}"))
        _check_kept(judge, store, victim, before)
        return
    except Exception as error:  # noqa: BLE001
        judge.outcomes.append(("writer", WRONG, f"{type(error).__name__}: {error}"))
        return
    if not _check_kept(judge, store, victim, before):
        return
    models = list(store.models.values())
    shard_model = store.models[VICTIM_SHARD]
    grown = damage.ShardModel(shard_model.broker, list(shard_model.records) + [EXTRA])
    keys = store.keys() + list(EXTRA.keys)
    expected = model_lookup([grown, *[m for m in models if m.broker != VICTIM_SHARD]], keys)
    judge.api("writer", lambda: _api(store.root, lambda s: table_rows(s.lookup(keys))), expected)


def _check_kept(judge: Judge, store: damage.SmallStore, victim: Path, before: dict[str, int]) -> bool:
    after = _listing_without(store.root, victim, with_sizes=True)
    lost = [name for name, size in before.items() if name not in after or after[name] < size]
    if lost:
        judge.outcomes.append(("writer", WRONG, f"committed files deleted or shortened: {lost[:4]}"))
    return not lost


def _listing_without(root: Path, victim: Path, with_sizes: bool = True) -> dict[str, int]:
    """Every file of the store (locks left out) but the victim and what is under it."""
    inside = str(victim.relative_to(root))
    return {name: size for name, size in damage.listing(root).items()
            if name != inside and not name.startswith(inside + "/")}


def main_(argv: list[str]) -> None:
    workdir = Path(argv[0])
    pristine = build_pristine(workdir / "pristine")
    for attack in argv[1:]:
        print(json.dumps({"start": attack}), flush=True)
        try:
            outcomes = run_attack(pristine, workdir, attack)
        except Exception as error:  # noqa: BLE001 - the harness itself failed: say where
            outcomes = [("harness", WRONG, f"{type(error).__name__}: {error} {traceback.format_exc(limit=-4)}")]
        print(json.dumps({"attack": attack, "outcomes": outcomes}), flush=True)


if __name__ == "__main__":
    main_(sys.argv[1:])
