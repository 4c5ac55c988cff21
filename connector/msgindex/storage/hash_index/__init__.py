"""RocketMQ's hash index, as msgindex writes and reads it: the IndexFile (``index_file``: the
format byte for byte, its chain walk and lookups; ``_index_walk.c``, the compiled walk),
RocketMQ's key hash (``java_hash``) and sizing (``rocketmq_sizing``), and what msgindex derives
from a file to read it faster and safer: sealed hash runs (``hash_run``) and the checksums of
chunks of entries that readers check (``entry_sums``)."""
