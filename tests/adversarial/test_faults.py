"""The adversarial run's other attacks: retention while reading, out-of-range timestamps, two
writers racing (these three on both kinds of store: the ``stores`` fixture), a full disk, and
files damaged under a reader that has them open (in a child process: a mapped file truncated
under a reader could kill it with SIGBUS). Each attack adds its outcomes to the tally (tally.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from msgindex.cli import main
from msgindex.errors import InvalidAppendError, MsgIndexError, StorageFullError
from msgindex.storage.message import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, MessageRecord
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store
from tests.adversarial.tally import RIGHT, TALLY, WRONG, Outcome
from tests.storage import damage
from tests.storage.kinds import accept_any_timestamp, committed_state
from tests.storage.shard_model import ShardModel, model_lookup, model_scan, table_rows

REPO = Path(__file__).resolve().parents[2]


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def settle(attack: str, outcomes: list[Outcome]) -> None:
    TALLY.add(outcomes)
    wrong = [f"{o.attack}: {o.detail}" for o in outcomes if o.wrong]
    assert not wrong, f"{attack}:\n" + "\n".join(wrong)


# --- retention while reading ------------------------------------------------------------------------
def snapshot_rows(models: list[ShardModel], states: list[dict[str, tuple[int, int]]], read) -> list[list[tuple]]:
    """What `read` (model_lookup / model_scan over shard models) answers at each committed state
    (per broker: log_start_seq, record_count)."""
    answers = []
    for state in states:
        cut = []
        for model in models:
            start, end = state[model.broker]
            part = ShardModel(model.broker, model.records[:end], log_start_seq=start)
            cut.append(part)
        answers.append(read(cut))
    return answers


def test_retention_and_appends_while_readers_read(stores):
    """A thread appends and applies retention (max_bytes) over and over while the main thread
    reads through one long-lived store handle (cached readers), fresh handles, a scan generator
    consumed across commits, and the CLI: every answer is exactly the model at some committed
    state, or a clear error (never a torn or partial answer, never a crash). On both kinds of
    store (an object store drops whole chunks; a scan's pinned version keeps them)."""
    root = stores.root("s")
    small = damage.build(root, brokers=("b1",), appends=3, per_append=12, stores=stores)
    model = small.models["b1"]
    with stores.open(root) as store:
        states = [{"b1": committed_state(store, "b1")}]
    stop = threading.Event()
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            with stores.open(root) as store:
                for n in range(3, 40 if stores.is_local else 22):  # (an object store's round is ~15 requests)
                    batch = [damage.record(0, n * 12 + i) for i in range(12)]
                    with store.writer("b1") as writer:
                        writer.append(batch)
                    model.append(batch)
                    states.append({"b1": committed_state(store, "b1")})
                    store.apply_retention(max_bytes=6000)
                    model.log_start_seq = committed_state(store, "b1")[0]
                    states.append({"b1": committed_state(store, "b1")})
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)
        finally:
            stop.set()

    keys = ["shared0", "shared3", "k0-5", "k0-100", "k0-400"]
    outcomes: list[Outcome] = []
    writer_thread = threading.Thread(target=churn)
    long_lived = stores.open(root)
    generator = None
    writer_thread.start()
    rounds = 0
    try:
        while not stop.is_set() or rounds < 3:
            rounds += 1
            reads = {
                "cached_lookup": (lambda: table_rows(long_lived.lookup(keys)), lambda m: model_lookup(m, keys)),
                "fresh_scan": (lambda: _fresh(stores, root, lambda s: table_rows(list(s.scan()))), model_scan),
            }
            for name, (read, expected_of) in reads.items():
                try:
                    got = read()
                except MsgIndexError as error:
                    outcomes.append(Outcome(f"retention {name}", type(error).__name__, str(error)))
                    continue
                matched = _matches_a_state(got, model, states, expected_of, stop)
                outcomes.append(Outcome(f"retention {name}", RIGHT) if matched else
                                Outcome(f"retention {name}", WRONG, f"{len(got)} rows match no committed state"))
            if generator is None:  # a scan held open across several commits and retention runs
                scan_states = list(states)
                generator = long_lived.scan()
                first = [next(generator)]
            elif rounds % 4 == 0:
                got = table_rows(first + list(generator))
                answers = snapshot_rows([model], scan_states + list(states), model_scan)
                # the scan's reader keeps the snapshot it opened (deleted files stay readable)
                outcomes.append(Outcome("retention open_scan", RIGHT) if got in answers else
                                Outcome("retention open_scan", WRONG, f"{len(got)} rows match no committed state"))
                generator = None
            code, out, err = cli(["lookup", *stores.cli_args(root), "--limit", "0", "--key", "shared1", "--format", "json"])
            outcomes.append(Outcome("retention cli_lookup", RIGHT if code == 0 else
                                    "exit 2" if code == 2 and len(err.splitlines()) == 1 else WRONG, err))
    finally:
        stop.set()
        writer_thread.join()
        long_lived.close()
    assert not failures, failures
    assert model.log_start_seq > 0, "retention never dropped a segment: the attack did not happen"
    with stores.open(root) as store:  # and afterwards, exactly the retained model
        got = table_rows(list(store.scan()))
    outcomes.append(Outcome("retention final_scan", RIGHT if got == model_scan([model]) else WRONG,
                            f"{len(got)} rows, {len(model.rows())} retained"))
    settle("retention while reading", outcomes)


def _matches_a_state(got, model, states, expected_of, stop, patience_s: float = 5.0) -> bool:
    """Whether `got` is the answer at some committed state. The thread records a state right
    after it commits, so a read may see a commit not listed yet: wait for the next one."""
    deadline = time.monotonic() + patience_s
    while True:
        seen = len(states)
        if got in snapshot_rows([model], list(states), expected_of):
            return True
        while len(states) == seen and not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(states) == seen:
            return False


def _fresh(stores, root, read):
    with stores.open(root) as store:
        return read(store)


# --- out-of-range timestamps ------------------------------------------------------------------------
HOSTILE_MS = [(1 << 63) - 1, -(1 << 63), MAX_TIMESTAMP_MS + 1, MIN_TIMESTAMP_MS - 1, 253_402_300_800_000 * 1000]
NOW = 1_700_000_000_000


def test_out_of_range_timestamps(stores, monkeypatch):
    """Appends refuse each hostile timestamp naming the record; records already on disk (written
    before the rule) read through every reader and format without breaking the others. On both
    kinds of store."""
    outcomes: list[Outcome] = []
    with stores.create("new", settings=damage.SMALL) as store, store.writer("b") as writer:
        for bad in HOSTILE_MS:
            try:
                writer.append([MessageRecord("t", 0, 0, NOW, "k", ("k",)), MessageRecord("t", 0, 1, bad, "k", ("k",))])
                outcomes.append(Outcome(f"timestamps append {bad}", WRONG, "appended"))
            except InvalidAppendError as error:
                named = "record 1 of the batch" in str(error) and str(bad) in str(error)
                outcomes.append(Outcome(f"timestamps append {bad}", "InvalidAppendError" if named else WRONG,
                                        str(error)))
    root = stores.root("old")
    records = [MessageRecord("t", 0, n, NOW + n if n % 2 else HOSTILE_MS[n // 2 % len(HOSTILE_MS)], "shared",
                             ("shared", f"own{n}")) for n in range(2 * len(HOSTILE_MS))]
    with monkeypatch.context() as patched:  # a store written before the rule
        accept_any_timestamp(patched)
        with stores.open(root, create=True, settings=damage.SMALL) as store, store.writer("b") as writer:
            writer.append(records)
    every = sorted(r.offset for r in records)
    normal = sorted(r.offset for r in records if MIN_TIMESTAMP_MS <= r.timestamp_ms <= MAX_TIMESTAMP_MS)

    def offsets_api(read) -> list[int]:
        with stores.open(root) as store:
            return sorted(row["offset"] for row in read(store))

    checks = {
        "api_lookup": (lambda: offsets_api(lambda s: s.lookup("shared").to_pylist()), every),
        "api_scan": (lambda: offsets_api(lambda s: [r for b in s.scan() for r in b.to_pylist()]), every),
        "api_window": (lambda: offsets_api(lambda s: s.lookup("shared", begin_ms=NOW, end_ms=NOW + 100).to_pylist()),
                       normal),
        "api_own_keys": (lambda: offsets_api(lambda s: s.lookup([f"own{n}" for n in every]).to_pylist()), every),
        "pandas": (lambda: offsets_api(lambda s: s.lookup("shared").to_pandas().to_dict("records")), every),
    }
    where = stores.cli_args(root)
    for fmt in ("table", "json", "csv"):
        checks[f"cli_lookup_{fmt}"] = (lambda fmt=fmt: _cli_count(["lookup", *where, "--limit", "0", "--key", "shared",
                                                                    "--format", fmt], fmt), len(every))
        checks[f"cli_scan_{fmt}"] = (lambda fmt=fmt: _cli_count(["lookup", *where, "--limit", "0", "--scan",
                                                                 "--format", fmt], fmt),
                                     len(every))
    if stores.is_local:  # (inspect of an object store: the objtools branch)
        checks["cli_inspect"] = (lambda: cli(["inspect", str(root)])[0], 0)
    for name, (read, expected) in checks.items():
        try:
            got = read()
        except Exception as error:  # noqa: BLE001 - any exception breaks the others' answers: WRONG
            outcomes.append(Outcome(f"timestamps {name}", WRONG, f"{type(error).__name__}: {error}"))
            continue
        outcomes.append(Outcome(f"timestamps {name}", RIGHT) if got == expected else
                        Outcome(f"timestamps {name}", WRONG, f"{got!r:.200} != {expected!r:.200}"))
    settle("out-of-range timestamps", outcomes)


def _cli_count(argv: list[str], fmt: str) -> int:
    code, out, err = cli(argv)
    assert code == 0, err
    lines = out.splitlines()
    # table: a title line (what and which window), the header, the rows, a count line
    return {"json": len(lines), "csv": len(lines) - 1, "table": len(lines) - 3}[fmt]


# --- two writers racing ----------------------------------------------------------------------------
RACER = textwrap.dedent("""
    import json, sys
    from msgindex.errors import MsgIndexError
    from msgindex.storage.store import open_store  # (an s3:// root: credentials from the AWS_* variables)
    from tests.storage import damage

    root, partition, first, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    with open_store(root) as store:
        for n in range(first, first + count):
            batch = [damage.record(partition, n * 5 + i) for i in range(5)]
            try:
                if mode == "wait":  # take turns: the writer's lock, waited for
                    writer = store.writer("b1", hold_lock=False)
                    with writer.locked(60):
                        appended = writer.append(batch).appended
                    writer.close()
                else:  # grab the lock or give up
                    with store.writer("b1") as writer:
                        appended = writer.append(batch).appended
                print(json.dumps({"n": n, "appended": appended}), flush=True)
            except MsgIndexError as error:
                print(json.dumps({"n": n, "error": type(error).__name__, "message": str(error)}), flush=True)
""")


def race(root: Path | str, specs: list[tuple[int, int, int, str]], env: dict[str, str]) -> list[list[dict]]:
    children = [subprocess.Popen([sys.executable, "-c", RACER, str(root), *map(str, spec)], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**env, "PYTHONPATH": str(REPO)}) for spec in specs]
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, f"racer died with status {child.returncode}: {err[-2000:]}"
        results.append([json.loads(line) for line in out.splitlines()])
    return results


@pytest.mark.parametrize("mode, overlap", [("wait", False), ("wait", True), ("grab", False), ("grab", True)])
def test_two_writers_racing(stores, mode, overlap):
    """Two processes append to one shard at once, taking turns (the lock, waited for) or each
    grabbing it (the loser gets ShardLockedError naming the lock); with `overlap` both write the
    same Kafka offsets (a replay racing the job). Afterwards the shard holds every committed
    batch exactly once, in some order, and nothing else. An object store takes no lock: every
    append of both commits (a lost version is retried)."""
    if not stores.is_local and mode == "wait":
        pytest.skip("an object store's writers take no lock: waiting for it is the same race as 'grab'")
    root = stores.root("s")
    damage.build(root, brokers=("b1",), appends=1, per_append=5, stores=stores)
    specs = [(0, 1, 12, mode), (0 if overlap else 1, 1 if overlap else 0, 12, mode)]
    results = race(root, specs, stores.env)
    outcomes = []
    committed: set[tuple[int, int]] = set()
    for (partition, _first, _, _), lines in zip(specs, results):
        for line in lines:
            attack = f"race {mode}{' overlapping' if overlap else ''} append"
            if "error" in line:
                ok = line["error"] == "ShardLockedError" and "broker=b1/lock" in line["message"]
                outcomes.append(Outcome(attack, line["error"] if ok else WRONG, line["message"]))
            else:
                outcomes.append(Outcome(attack, RIGHT))
                committed |= {(partition, line["n"] * 5 + i) for i in range(5)}
    expected = {(0, i) for i in range(5)} | committed
    with stores.open(root) as store:
        rows = [(r["partition"], r["offset"]) for b in store.scan() for r in b.to_pylist()]
    whole = sorted(rows) == sorted(expected) and len(rows) == len(set(rows))
    outcomes.append(Outcome(f"race {mode} final", RIGHT if whole else WRONG,
                            "" if whole else f"{len(rows)} rows ({len(set(rows))} distinct), {len(expected)} committed"))
    if mode == "wait" or not stores.is_local:
        assert all("error" not in line for lines in results for line in lines), results
    settle("two writers racing", outcomes)


# --- damage under an open reader (child process) ----------------------------------------------------
HELD_OPEN = textwrap.dedent("""
    import sys
    import time
    from pathlib import Path
    from msgindex.errors import MsgIndexError
    from msgindex.storage.store import open_store
    from tests.storage import damage
    from tests.adversarial import file_attacks
    from tests.storage.shard_model import model_lookup, model_scan, table_rows

    root, kind_name, damage_name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    store = file_attacks.build_pristine(root)
    kind = next(k for k in file_attacks.KINDS if k.name == kind_name)
    victim = kind.locate(store)
    with open_store(root) as handle:
        keys = store.keys()
        handle.lookup(keys)  # the readers are open (and cached) now, their files mapped
        first = handle.scan()
        head = table_rows([next(first)])  # a scan under way: its reader is open
        time.sleep(0.05)  # damage comes later than the files' last write (mtime granularity: a few ms)
        file_attacks.DAMAGES[damage_name](victim)
        models = list(store.models.values())
        for name, read, expected in (
                ("cached_lookup", lambda: table_rows(handle.lookup(keys)), model_lookup(models, keys)),
                ("open_scan", lambda: head + table_rows(list(first)), model_scan(models)),
                ("new_scan", lambda: table_rows(list(handle.scan())), model_scan(models))):
            try:
                got = read()
                print(name, "answered" if got == expected else "WRONG", len(got), len(expected), flush=True)
            except MsgIndexError as error:
                print(name, "error", type(error).__name__, error, flush=True)
""")

HELD_KINDS = ["hash_index_sealed", "hash_index_active", "log_oldest", "log_active", "time_index", "hash_run"]


@pytest.mark.parametrize("damage_name", ["truncate", "zero", "delete"])
@pytest.mark.parametrize("kind_name", HELD_KINDS)
def test_damage_under_an_open_reader(tmp_path, kind_name, damage_name):
    """A file damaged while a reader has it open and mapped: the process must survive (no
    SIGBUS) and answer or raise a msgindex error. (An answer may be the snapshot the reader
    opened: a reader that already holds a file keeps what it read.)"""
    child = subprocess.run([sys.executable, "-c", HELD_OPEN, str(tmp_path / "s"), kind_name, damage_name],
                           cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    attack = f"open {kind_name}:{damage_name}"
    outcomes = []
    if child.returncode < 0:
        outcomes.append(Outcome(attack, WRONG, f"killed by {signal.Signals(-child.returncode).name}"))
    elif child.returncode != 0:
        outcomes.append(Outcome(attack, WRONG, child.stderr[-1500:]))
    else:
        for line in child.stdout.splitlines():
            name, what, *rest = line.split(" ", 2)
            result = RIGHT if what == "answered" else WRONG if what == "WRONG" else rest[0].split()[0]
            outcomes.append(Outcome(f"{attack} {name}", result, " ".join(rest)))
    settle(attack, outcomes)


# --- a full disk -----------------------------------------------------------------------------------
def test_a_full_disk_while_appending_and_reading(small_disk):
    """Appends until the disk is full: each append commits or is StorageFullError naming a file
    under the store; afterwards every reader still answers exactly what was committed, and
    `msgindex repair` / a writer reopening on the full disk never lose it."""
    root = small_disk / "s"
    settings = StoreSettings(hash_slot_num=512, index_num=4000, segment_bytes=64 << 10, index_interval_bytes=1024)
    model = ShardModel("b1")
    outcomes = []
    with open_store(root, create=True, settings=settings) as store:
        full = False
        for n in range(2000):
            batch = [damage.record(0, n * 50 + i) for i in range(50)]
            try:
                with store.writer("b1") as writer:
                    writer.append(batch)
                model.append(batch)
            except StorageFullError as error:
                named = str(error).startswith(f"{root}/")
                outcomes.append(Outcome("disk append", "StorageFullError" if named else WRONG, str(error)))
                full = True
                if len(outcomes) >= 3:  # again on the full disk: still an error, never a signal
                    break
            except MsgIndexError as error:
                outcomes.append(Outcome("disk append", WRONG, f"{type(error).__name__}: {error}"))
                break
        assert full, "the disk never filled: the attack did not happen"
    keys = sorted({k for r in model.records for k in r.keys})[::50] + ["shared2"]
    with open_store(root) as store:
        for name, got, want in (("lookup", table_rows(store.lookup(keys)), model_lookup([model], keys)),
                                ("scan", table_rows(list(store.scan())), model_scan([model]))):
            outcomes.append(Outcome(f"disk {name}", RIGHT if got == want else WRONG, f"{len(got)} vs {len(want)}"))
    code, _, err = cli(["inspect", str(root)])
    outcomes.append(Outcome("disk inspect", RIGHT if code == 0 else WRONG, err))
    settle("full disk", outcomes)


# --- numbers that are not numbers ------------------------------------------------------------------
NON_FINITE = ("nan", "inf", "-inf", "NaN", "Infinity")
# every float option of every command (and a duration/size given as digits that overflow a float);
# the index job's flags are checked before anything starts, so no Kafka or Spark is needed
FLOAT_OPTIONS = [
    (["index", "--bootstrap-servers", "127.0.0.1:1", "--subscribe", "t", "--path", "{root}", "--lock-timeout"],
     "--lock-timeout"),
    (["index", "--bootstrap-servers", "127.0.0.1:1", "--subscribe", "t", "--path", "{root}",
      "--retention-interval"], "--retention-interval"),
    (["kafka", "start", "--data-dir", "{root}/kafka", "--timeout"], "--timeout"),
    (["kafka", "stop", "--data-dir", "{root}/kafka", "--timeout"], "--timeout"),
]
HUGE = "9" * 400  # float() of it is inf


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize(("argv", "option"), FLOAT_OPTIONS, ids=lambda v: v if isinstance(v, str) else " ".join(v[:2]))
def test_non_finite_seconds_are_refused(tmp_path, argv, option, value):
    """`--lock-timeout nan` was accepted and a task then waited for a shard lock forever."""
    *head, flag = [part.format(root=tmp_path) for part in argv]
    code, _out, err = cli([*head, f"{flag}={value}"])  # `=`: argparse takes "-inf" alone for an option
    lines = err.strip().splitlines()
    right = code == 2 and len(lines) == 1 and option in lines[0] and "finite number of seconds" in lines[0]
    settle(f"option {option}={value}", [Outcome(f"option {' '.join(argv[:2])} {option}={value}",
                                                "exit 2" if right else WRONG, err.strip()[-300:])])


@pytest.mark.parametrize(("argv", "option"), [
    (["retention", "{root}", "--max-age"], "--max-age"), (["retention", "{root}", "--max-bytes"], "--max-bytes"),
    (["index", "--bootstrap-servers", "127.0.0.1:1", "--subscribe", "t", "--path", "{root}", "--retention-ms"],
     "--retention-ms"),
    (["index", "--bootstrap-servers", "127.0.0.1:1", "--subscribe", "t", "--path", "{root}", "--retention-bytes"],
     "--retention-bytes"),
])
@pytest.mark.parametrize("value", [*NON_FINITE, HUGE, HUGE + "d"])
def test_durations_and_sizes_that_are_not_numbers(tmp_path, argv, option, value):
    *head, flag = [part.format(root=tmp_path) for part in argv]
    code, _out, err = cli([*head, f"{flag}={value}"])
    lines = err.strip().splitlines()
    right = code == 2 and len(lines) == 1 and option in lines[0]
    settle(f"option {option}", [Outcome(f"option {argv[0]} {option}={value[:12]}", "exit 2" if right else WRONG,
                                        err.strip()[-300:])])


def test_a_nan_lock_timeout_in_the_api(tmp_path):
    """The storage layer refuses it too (the job's options and ShardWriter.locked end there)."""
    from msgindex.errors import InvalidArgumentError
    from msgindex.storage.file_lock import wait_for_lock

    try:
        wait_for_lock(tmp_path / "lock", float("nan"))
        result = WRONG
    except InvalidArgumentError as error:
        result = "InvalidArgumentError" if "lock timeout" in str(error) else WRONG
    settle("api lock timeout nan", [Outcome("option api wait_for_lock(timeout_s=nan)", result)])


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("option", ["begin", "end", "maxNum", "partitions", "hashSlotNum", "indexNum"])
def test_read_options_that_are_not_numbers(option, value):
    """The data source's numeric options (none is a float): nan and inf are refused by name."""
    from msgindex.errors import InvalidOptionError
    from msgindex.spark.read.options import ReadOptions

    try:
        ReadOptions.parse({"path": "/data/index", "mode": "rocketmq", option: value})
        result, detail = WRONG, "accepted"
    except InvalidOptionError as error:
        result, detail = ("InvalidOptionError" if f"'{option}' = {value!r}" in str(error) else WRONG), str(error)
    settle(f"read option {option}", [Outcome(f"option read {option}={value}", result, detail)])
