"""Stores on object storage (s3://, gs://, az://): immutable chunk objects, shard versions
committed by put-if-absent, compaction; no locks, no shared disk (DESIGN.md "Object storage").

``client``: the requests (obstore), counted, with one-line errors. ``chunk_format``: the chunk
object (record batches + sorted hash items + footer). ``versions``: the commit protocol (a
shard's versions, put-if-absent). ``shard``: writers (append, compact, retention) and readers of
one shard. ``store``: the store (manifest, shards, lookups across them).
"""
