"""msgindex's IndexFile against RocketMQ's own (org.apache.rocketmq:rocketmq-store, Maven Central).

The same random call sequences go to RocketMQ's ``IndexFile.putKey`` (Java harness), msgindex's
``put_key`` and msgindex's vectorized ``put_keys``: the three files must be byte-identical. Then
RocketMQ's ``selectPhyOffset`` queries both its own and msgindex's files, and msgindex queries both:
all four answers must agree. Everything runs in one JVM launch.

msgindex grows a file ahead of its entries instead of allocating RocketMQ's full size at once
(index_file's module docstring). The scenarios run with growth steps of GROWTH_STEP entries, so
most of msgindex's files are shorter than RocketMQ's when written: byte-identical then means equal
up to msgindex's length, RocketMQ's tail all zeros; and RocketMQ's own IndexFile loads the short
file (extending it to its full size with zeros) and answers alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from msgindex import IndexFile
from msgindex.errors import ToolMissingError
from msgindex.storage.hash_index import hash_run, index_file
from msgindex.storage.hash_index.index_file import index_file_name, reference_candidates
from msgindex.storage.hash_index.java_hash import index_hashes
from msgindex.storage.message import field_hash_string
from tests.interop.rocketmq_harness import Script, harness_classpath, parse_query

T0 = 1_700_000_000_000
WIDE = (-(2**62), 2**62)
MIN_VALUE_KEYS = ["polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"]
SCENARIOS = 63
GROWTH_STEP = 4  # entries: scenario files hold 2-6,500 entries


@dataclass
class Scenario:
    slots: int
    num: int
    end_phy: int
    end_ts: int
    puts: list[tuple[str, int, int]]
    chunks: list[int]  # put_keys batch boundaries
    queries: list[tuple[str, int, int, int]] = field(default_factory=list)


def random_key(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:
        return rng.choice(MIN_VALUE_KEYS + ["", "Aa", "BB"])
    if kind < 0.35:  # any Unicode: astral characters and lone surrogates included
        chars = [rng.choice([chr(rng.randint(0x20, 0xD7FF)), chr(rng.randint(0xD800, 0xDFFF)),
                             chr(rng.randint(0x10000, 0x10FFFF)), "é", "#"]) for _ in range(rng.randint(0, 6))]
        return "topic#" + "".join(chars)
    if kind < 0.45:  # a field value's hash string (storage/fields.py): NULs, no '#' before them
        return field_hash_string(f"topic{rng.randint(0, 2)}", rng.choice(["order", "sku"]), f"o-{rng.randint(0, 12)}")
    return f"topic{rng.randint(0, 2)}#key{rng.randint(0, 12)}"


def random_stamp(rng: random.Random, base: int) -> int:
    kind = rng.random()
    if kind < 0.05:
        return rng.choice([0, -1, 2**63 - 1, -(2**63), base - 10**12])
    if kind < 0.15:
        return base - rng.randint(0, 20_000)  # before the file's begin time
    return base + rng.randint(0, 120_000)


def make_scenario(rng: random.Random, slots: int, num: int, n_puts: int) -> Scenario:
    inherit = rng.random() < 0.4
    end_phy = rng.choice([1, 4096, 10**12]) if inherit else rng.choice([0, -5])
    end_ts = T0 - rng.randint(1, 5000) if inherit and rng.random() < 0.8 else 0
    base = T0 + rng.randint(0, 10_000)
    puts = [(random_key(rng), rng.choice([rng.randint(0, 10**9), rng.randint(-(2**63), 2**63 - 1)]),
             random_stamp(rng, base)) for _ in range(n_puts)]
    chunks = sorted({0, n_puts, *(rng.randint(0, n_puts) for _ in range(rng.randint(0, 4)))})
    scenario = Scenario(slots, num, end_phy, end_ts, puts, chunks)
    pool = sorted({p[0] for p in puts}) or ["never-put"]
    for _ in range(25):
        key = rng.choice(pool) if rng.random() < 0.85 else rng.choice(["never-put", "", "Aa"])
        lo = base + rng.randint(-20_000, 130_000)
        window = rng.choice([WIDE, (lo, lo + rng.randint(0, 60_000)), (lo, lo), (0, T0), (T0 + 10**7, 2**62)])
        scenario.queries.append((key, rng.choice([1, 2, 3, 64, 10_000]), *window))
    return scenario


def scenarios() -> list[Scenario]:
    rng = random.Random(20240101)
    out = [make_scenario(rng, rng.choice([1, 2, 3, 7, 13, 50]), rng.randint(2, 40), rng.randint(0, 50))
           for _ in range(60)]
    out.append(make_scenario(rng, 101, 3000, 3500))  # fills up, long chains
    out.append(make_scenario(rng, 5003, 4000, 3999))  # exactly full
    out.append(hot_key_scenario(rng))
    return out


def hot_key_scenario(rng: random.Random) -> Scenario:
    """A hot key with 40% of 6,000 entries over 7 slots: chains msgindex scans (and answers from a
    hash run) instead of walking; RocketMQ walks them all for a large maxNum."""
    base = T0 + 1000
    puts = [("topic#HOT" if rng.random() < 0.4 else f"topic#k{rng.randint(0, 300)}", i, base + 7 * i)
            for i in range(6000)]
    scenario = Scenario(7, 6500, 0, 0, puts, [0, 2500, 6000])
    for key in ["topic#HOT", "topic#k1", "topic#k17", "never-put"]:
        scenario.queries.append((key, 10_000, *WIDE))
        scenario.queries.append((key, 64, base + 20_000, base + 30_000))
    scenario.queries += [("topic#HOT", 64, *WIDE)] * (25 - len(scenario.queries))
    return scenario


@dataclass
class Run:
    scenario: Scenario
    java: Path
    one: Path
    many: Path
    put_results: list[bool]
    one_bytes: bytes  # msgindex's files as msgindex left them (RocketMQ's load may extend them)
    many_bytes: bytes
    java_on_java: list[list[int]] = field(default_factory=list)
    java_on_msgindex: list[list[int]] = field(default_factory=list)
    java_put_results: list[bool] = field(default_factory=list)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Run]:
    try:
        harness_classpath()
    except ToolMissingError as e:
        pytest.skip(f"needs a JDK and Maven to run RocketMQ's IndexFile: {e}")
    root = tmp_path_factory.mktemp("rocketmq")
    name = index_file_name(T0, utc=True)  # RocketMQ's MappedFile parses the name as a number
    script, results = Script(), []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(index_file, "GROWTH_ENTRIES", GROWTH_STEP)
        _write_scenarios(root, name, script, results)
    lines = iter(script.run(heap="256m", timeout=600))
    for run in results:
        run.java_put_results = [next(lines) == "put true" for _ in run.scenario.puts]
        run.java_on_java = [parse_query(next(lines)) for _ in run.scenario.queries]
        run.java_on_msgindex = [parse_query(next(lines)) for _ in run.scenario.queries]
    assert next(lines, None) is None
    return results


def _write_scenarios(root: Path, name: str, script: Script, results: list[Run]) -> None:
    for i, sc in enumerate(scenarios()):
        folders = [root / f"s{i}" / side for side in ("java", "one", "many")]
        for folder in folders:
            folder.mkdir(parents=True)
        java, one, many = (folder / name for folder in folders)
        with IndexFile.create(one, sc.slots, sc.num, sc.end_phy, sc.end_ts) as f:
            put_results = [f.put_key(*p) for p in sc.puts]
        with IndexFile.create(many, sc.slots, sc.num, sc.end_phy, sc.end_ts) as g:
            for lo, hi in zip(sc.chunks, sc.chunks[1:]):
                g.put_keys(*zip(*sc.puts[lo:hi]))
        results.append(Run(sc, java, one, many, put_results, one.read_bytes(), many.read_bytes()))
        script.create(java, sc.slots, sc.num, sc.end_phy, sc.end_ts)
        for p in sc.puts:
            script.put(*p)
        script.close()
        for target in (java, one):
            script.open(target, sc.slots, sc.num)
            for q in sc.queries:
                script.query(*q)


def same_as_rocketmqs(ours: bytes, rocketmqs: bytes) -> bool:
    """msgindex's bytes are RocketMQ's up to msgindex's length, and RocketMQ's past it are zeros."""
    return len(ours) <= len(rocketmqs) and rocketmqs[: len(ours)] == ours and not any(rocketmqs[len(ours):])


def test_put_key_files_are_byte_identical_to_rocketmq(runs: list[Run]) -> None:
    assert len(runs) == SCENARIOS
    for i, run in enumerate(runs):
        assert run.put_results == run.java_put_results, f"scenario {i}"
        assert same_as_rocketmqs(run.one_bytes, run.java.read_bytes()), f"scenario {i}: put_key bytes differ"


def test_put_keys_files_are_byte_identical_to_rocketmq(runs: list[Run]) -> None:
    for i, run in enumerate(runs):
        assert same_as_rocketmqs(run.many_bytes, run.java.read_bytes()), f"scenario {i}: put_keys bytes differ"
        assert run.many_bytes == run.one_bytes, f"scenario {i}: put_keys and put_key grew the file differently"


def test_files_grow_with_their_entries_and_are_full_size_once_full(runs: list[Run]) -> None:
    """msgindex's file ends within a growth step past its last entry (or at the full size), so
    the byte-identity above compared short files too, and RocketMQ loaded them."""
    short = 0
    for i, run in enumerate(runs):
        sc = run.scenario
        full = IndexFile.file_size(sc.slots, sc.num)
        with IndexFile.open(run.java, sc.slots, sc.num, read_only=True) as rocketmq:
            count = rocketmq.index_count
        entries_at = full - sc.num * 20
        room = (len(run.one_bytes) - entries_at) // 20
        assert room == min(sc.num, -(-max(count, 1) // GROWTH_STEP) * GROWTH_STEP), f"scenario {i}"
        assert len(run.one_bytes) == entries_at + room * 20
        short += len(run.one_bytes) < full
        # RocketMQ's MappedFile maps the full size when it loads a file, extending a short one
        # with zeros (and then answered as on its own file: test_queries_agree_both_ways)
        assert run.one.stat().st_size == full and same_as_rocketmqs(run.one.read_bytes(), run.java.read_bytes())
    assert short >= 15, short


def test_scenarios_cover_the_edge_rules(runs: list[Run]) -> None:
    """The random scenarios really exercise full files, inherited begins and shared slot 0."""
    full = inherited = min_value = 0
    for run in runs:
        with IndexFile.open(run.java, run.scenario.slots, run.scenario.num, read_only=True) as f:
            full += f.is_full
            inherited += run.scenario.end_ts > 0 and f.entry_count > 0
            min_value += any(k in MIN_VALUE_KEYS for k, _, _ in run.scenario.puts)
    assert full >= 10 and inherited >= 5 and min_value >= 5


def test_queries_agree_both_ways(runs: list[Run]) -> None:
    compared = nonempty = 0
    for i, run in enumerate(runs):
        sc = run.scenario
        with IndexFile.open(run.java, sc.slots, sc.num, read_only=True) as java_file, \
                IndexFile.open(run.one, sc.slots, sc.num, read_only=True) as own_file:
            for q, on_java, on_own in zip(sc.queries, run.java_on_java, run.java_on_msgindex):
                assert on_java == on_own, f"scenario {i} query {q}: RocketMQ answers differ between files"
                assert java_file.select_phy_offsets(*q) == on_java, f"scenario {i} query {q} on RocketMQ's file"
                assert own_file.select_phy_offsets(*q) == on_java, f"scenario {i} query {q} on msgindex's file"
                compared += 1
                nonempty += bool(on_java)
    assert compared == SCENARIOS * 25 and nonempty > compared // 8


def test_candidates_on_rocketmq_files_find_every_hash_match(runs: list[Run]) -> None:
    for run in runs:
        sc = run.scenario
        with IndexFile.open(run.java, sc.slots, sc.num, read_only=True) as f:
            keys = sorted({k for k, _, _ in sc.puts})
            many = f.candidates_many(keys)
            for key, from_many in zip(keys, many):
                walk = f.candidates(key)
                assert from_many == walk == reference_candidates(f, key)
                # with no lower time bound RocketMQ's walk has no early stop: same entries
                # (unless begin + diff overflows a Java long, as with a begin of Long.MAX_VALUE)
                if abs(f.begin_timestamp) < 2**61:
                    assert [c[1] for c in walk] == f.select_phy_offsets(key, 10**6, *WIDE)


def test_hot_chains_match_rocketmqs_own_walk(runs: list[Run], tmp_path: Path) -> None:
    """The hot-key scenario: RocketMQ's selectPhyOffset (maxNum 10,000, every time) walked each
    whole chain in the JVM; msgindex's scans, and its hash run over a copy of RocketMQ's file,
    find exactly those entries."""
    run = runs[-1]
    sc = run.scenario
    copy = tmp_path / run.java.name
    copy.write_bytes(run.java.read_bytes())
    with IndexFile.open(copy, sc.slots, sc.num) as f:
        assert hash_run.write(f, 1, f.index_count)
    checked = 0
    for path in (run.java, copy):
        with IndexFile.open(path, sc.slots, sc.num, read_only=True) as f:
            assert bool(f._hash_runs().runs) == (path == copy)
            for q, on_java in zip(sc.queries, run.java_on_java):
                if q[1] == 10_000:
                    assert [c[1] for c in f.candidates(q[0])] == on_java
                    who, _, phys, _ = f.candidate_arrays(index_hashes([q[0], "topic#k2"]).astype("int64"))
                    assert phys[who == 0].tolist() == on_java
                    checked += 1
                    assert q[0] != "topic#HOT" or len(on_java) > 2000
    assert checked == 8
