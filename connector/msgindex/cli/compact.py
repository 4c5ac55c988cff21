"""msgindex compact: merge the chunks of a store on object storage now, then delete what is
past the grace period (writers do the same by themselves, bounded, at most once per interval).

    msgindex compact URL [--broker B ...] [--dry-run] [--storage-option K=V ...]

Each shard's chunks are merged as far as one merged chunk may hold (ObjectStore.compact), so
a lookup reads as few objects as possible; readers keep answering from the version they hold
while it runs, and the replaced chunks are deleted only after the grace period. A local store has
nothing to compact: each of its shards appends to one log and one hash index file.
"""

from __future__ import annotations

import argparse

from msgindex.cli.store_args import open_store_of, store_subcommand


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compact`` subcommand."""
    parser = store_subcommand(subparsers, "compact", "merge the chunks of a store on object storage now", __doc__)
    parser.add_argument("--dry-run", action="store_true", help="say what would be merged; write and delete nothing")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print what was merged per shard; exit code 0."""
    from msgindex.storage.objects.store import ObjectStore

    with open_store_of(args) as store:
        if not isinstance(store, ObjectStore):
            print(f"{store.root}: a local store: its shards need no compaction (each appends to one metadata log "
                  f"and one hash index file; nothing to merge)")
            return 0
        results = store.compact_shards(args.broker, dry_run=args.dry_run)
    print(f"{store.root}:")
    for shard in results:
        if not shard.merged_away:
            done = f"{shard.chunks_before} chunk(s): nothing to merge"
        elif args.dry_run:
            done = (f"{shard.chunks_before} chunk(s): would merge them into {shard.chunks_after} "
                    f"({shard.bytes_merged:,} bytes to read)")
        else:
            done = f"{shard.chunks_before} chunk(s) -> {shard.chunks_after} ({shard.bytes_merged:,} bytes merged)"
        if not args.dry_run:
            done += f"; {shard.collected} object(s) past the grace period deleted"
        print(f"  broker={shard.broker}: {done}")
    merged = sum(shard.merged_away for shard in results)
    verb = "would merge away" if args.dry_run else "merged away"
    print(f"{verb} {merged} chunk(s) in {len(results)} shard(s)")
    return 0
