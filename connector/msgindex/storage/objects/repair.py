"""``msgindex repair URL``: what can be repaired in a store on an object store, and what cannot.

An object-store shard has no checkpoint to rebuild and no derived files to clear (the local
repair's work, ``storage/maintenance/repair.py``): its versions are its commits, each the whole committed
state, and its chunks are immutable data that only a version makes part of the shard. So repair
first inspects each shard exactly as ``msgindex inspect`` does (reading every version and chunk),
then:

* **a shard mark missing** for a shard that has versions (lookups skip the shard): put back
  (put-if-absent of an empty object: always safe);
* **an older version damaged**: deleted (readers and writers read only the newest; collection
  deletes old versions anyway);
* **garbage** (orphans no version lists, objects a version removed): left to collection, which
  deletes them after the grace period, unless ``collect_now``: then deleted at once, except what
  became garbage less than ``min_age_ms`` ago (a writer between its chunk and its commit, a reader
  still on the version before);
* **a marked shard whose versions are gone**: refused, unless ``forget_missing``: its mark is
  deleted (accepting the loss; a replay from Kafka indexes the records again), never one younger
  than ``min_age_ms`` (a shard about to commit its first version);
* **the newest version damaged** (it does not decode: every reader of the shard fails): refused,
  unless ``roll_back``: the damaged versions above the newest one that decodes are deleted, once
  every chunk that one lists was checked; the commits they held are lost from the index (the
  report names the source offsets the shard still holds: index the rest again);
* **a chunk missing or damaged**: refused: a chunk cannot be rebuilt from the store. Restore the
  object (a bucket with versioning keeps the previous one), or re-index from Kafka into a new store.

Nothing a version lists is ever deleted. Stop the indexing job first: repair takes no lock (there
is none), and ``collect_now`` with ``min_age_ms`` 0 would take a running writer's chunk for an
orphan.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from msgindex.errors import CorruptFileError
from msgindex.storage.location import parse_location
from msgindex.storage.maintenance.repair import RepairReport, ShardRepair, ranges_text
from msgindex.storage.objects.inspect import ShardInspection, shard_marks, shard_names
from msgindex.storage.objects.shard import SHARDS_DIR
from msgindex.storage.objects.store import ObjectStore, open_object_store

DEFAULT_MIN_AGE_MS = 10 * 60 * 1000


def repair_object_store(url: str, storage_options: Mapping[str, str] | None = None, *,
                        brokers: Iterable[str] | None = None, forget_missing: bool = False,
                        collect_now: bool = False, roll_back: bool = False,
                        min_age_ms: int = DEFAULT_MIN_AGE_MS, dry_run: bool = False) -> RepairReport:
    """Repair the shards of the store at `url` (all, or `brokers`): see the module docstring."""
    store = open_object_store(parse_location(url, storage_options))
    marks = shard_marks(store)
    present = shard_names(store, marks)
    results = []
    for broker in (present if brokers is None else sorted(set(brokers))):
        if broker not in present:
            results.append(ShardRepair(broker, f"refused: no shard {broker!r} in the store (shards: {present})",
                                       refused=True))
            continue
        inspection = ShardInspection(store, broker, True, marks)
        inspection.report()
        results.append(_ShardRepair(store, inspection, forget_missing=forget_missing, collect_now=collect_now,
                                    roll_back=roll_back, min_age_ms=min_age_ms, dry_run=dry_run).run())
    return RepairReport(store.root, tuple(results))


class _ShardRepair:
    """The repair of one inspected shard (module docstring)."""

    def __init__(self, store: ObjectStore, inspection: ShardInspection, *, forget_missing: bool, collect_now: bool,
                 roll_back: bool, min_age_ms: int, dry_run: bool) -> None:
        self.store = store
        self.shard = inspection
        self.broker = inspection.broker
        self.forget_missing, self.collect_now, self.roll_back = forget_missing, collect_now, roll_back
        self.min_age_ms = min_age_ms
        self.dry_run = dry_run
        self.now_ms = int(time.time() * 1000)
        self.done: list[str] = []
        self.details: list[str] = []

    def _did(self, done: str, planned: str) -> None:
        self.done.append(planned + " (dry run)" if self.dry_run else done)

    def run(self) -> ShardRepair:
        shard = self.shard
        if not shard.numbers:
            refused = self._without_versions()
            if refused is not None:
                return refused
        elif shard.undecodable_newest:
            refused = self._rolled_back()
            if refused is not None:
                return refused
        elif shard.damage:
            return ShardRepair(self.broker, f"refused: {shard.damage[0]} (a chunk cannot be rebuilt from the store: "
                                            f"restore the object, or re-index from Kafka into a new store)",
                               tuple(shard.damage[1:]), refused=True)
        if shard.undecodable_older:
            if not self.dry_run:
                self.store.client.delete([shard.versions.key(n) for n in shard.undecodable_older])
            numbers = ", ".join(map(str, shard.undecodable_older))
            self._did(f"deleted damaged older version(s) {numbers} (no reader reads them)",
                      f"would delete damaged older version(s) {numbers} (no reader reads them)")
        if shard.numbers and shard.mark is None:
            if not self.dry_run:
                self.store.client.put_if_absent(f"{SHARDS_DIR}/{self.broker}", b"")
            self._did("put back the shard mark (lookups skipped the shard without it)",
                      "would put back the shard mark (lookups skip the shard without it)")
        self._garbage()
        action = "; ".join(self.done) if self.done else "intact: nothing to repair"
        return ShardRepair(self.broker, action, tuple(self.details))

    def _without_versions(self) -> ShardRepair | None:
        """A shard with no version: nothing committed, or a lost one (refused unless forgotten)."""
        mark = self.shard.mark
        if mark is None:
            self.details.append("nothing committed (no version)")
            return None
        age_ms = self.now_ms - mark.last_modified_ms
        if age_ms < self.min_age_ms:
            self.details.append(f"marked {age_ms // 1000} s ago and no version yet: a writer may be committing its "
                                f"first version (younger than --min-age): left alone")
            return None
        lost = (f"{self.shard.url}: the shard is marked ({SHARDS_DIR}/{self.broker}) but has no versions: its "
                f"objects were deleted")
        if not self.forget_missing:
            return ShardRepair(self.broker, f"refused: {lost}: restore them, or pass --forget-missing to accept the "
                                            f"loss", refused=True)
        if not self.dry_run:
            self.store.client.delete([f"{SHARDS_DIR}/{self.broker}"])
        self._did("no versions: its mark removed (its records are lost; a replay from Kafka indexes them again)",
                  "no versions: its mark would be removed")
        return None

    def _rolled_back(self) -> ShardRepair | None:
        """The newest version does not decode: refused, or (``roll_back``) the damaged ones deleted."""
        shard = self.shard
        damaged = sorted(shard.undecodable_newest)
        names = ", ".join(shard.versions.url(n) for n in damaged)
        if not self.roll_back:
            return ShardRepair(self.broker, f"refused: {names}: the newest version is damaged (every reader of the "
                                            f"shard fails): restore the object, or pass --roll-back to make the "
                                            f"newest version that decodes the newest again (losing what the damaged "
                                            f"one committed)", refused=True)
        newest = shard.newest
        if newest is None:
            return ShardRepair(self.broker, f"refused: no version of {shard.url} decodes: restore the version "
                                            f"objects, or re-index from Kafka into a new store", refused=True)
        others = [line for line in shard.damage if not any(shard.versions.url(n) in line for n in damaged)]
        if others:
            return ShardRepair(self.broker, f"refused: cannot roll back to version {newest.number}: {others[0]}",
                               tuple(others[1:]), refused=True)
        if not self.dry_run:
            if shard.versions.numbers() != shard.numbers:
                raise CorruptFileError(f"{shard.url}: a version was committed while repair ran: stop the indexing "
                                       f"job and run repair again")
            self.store.client.delete([shard.versions.key(n) for n in damaged])
        self._did(f"rolled back to version {newest.number}: damaged version(s) {', '.join(map(str, damaged))} deleted",
                  f"would roll back to version {newest.number}: damaged version(s) {', '.join(map(str, damaged))} "
                  f"would be deleted")
        self.details += [
            f"what the damaged version(s) committed is no longer in the index; the shard holds the source offsets "
            f"{ranges_text(newest.source_ranges)}: index the offsets after them again (an indexing job from those "
            f"offsets: exactly once by offsets skips what the shard holds)",
            "chunks only the damaged version(s) listed are now orphans: collection deletes them"]
        return None

    def _garbage(self) -> None:
        unlisted = self.shard.unlisted
        waiting = [info for info, _ in unlisted.removed] + list(unlisted.orphans)
        if not waiting:
            return
        if not self.collect_now:
            self.details.append(f"{len(unlisted.orphans)} orphan(s) and {len(unlisted.removed)} removed object(s) "
                                f"({sum(i.size for i in waiting):,} bytes) wait for collection (after the grace period, "
                                f"{self.store.tuning.grace_s:g} s); --collect-now deletes them now")
            return
        doomed = unlisted.collectable(self.now_ms, self.min_age_ms)
        if doomed and not self.dry_run:
            self.store.client.delete([info.key for info in doomed])
        if doomed:
                self._did(f"deleted {len(doomed)} object(s) no reader needs ({sum(i.size for i in doomed):,} bytes)",
                      f"would delete {len(doomed)} object(s) no reader needs ({sum(i.size for i in doomed):,} bytes)")
        self.details += [f"{'would delete' if self.dry_run else 'deleted'} {self.store.root}/{info.key}"
                         for info in doomed]
        if len(doomed) < len(waiting):
            self.details.append(f"kept {len(waiting) - len(doomed)} written or removed less than --min-age ago")
