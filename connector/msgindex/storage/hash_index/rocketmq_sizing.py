"""IndexFile sizing defaults, stated once, in a module of their own so that the command line can
name them without loading numpy.

* RocketMQ's (MessageStoreConfig maxHashSlotNum / maxIndexNum): the sizing of a broker's index
  files, so the default for reading them (RocketMQ mode, ``msgindex inspect`` of a bare file).
* msgindex's for new stores (``StoreSettings``): RocketMQ's entries per file, fewer slots. The
  slot table is the one part of a hash index file that cannot follow its data (a key's slot is
  its hash modulo the slot count, written at random from the first put on), so it is allocated
  whole when a file is created: RocketMQ's 5,000,000 slots take 20 MB a file, four times a zstd
  Parquet copy of 500,000 records of bench_vs_parquet's long-key workload; 1,000,000 take 4 MB.
  Chains get longer (~6 entries a slot at 6M entries, 20 when the file is full, against 1.2 and 4),
  which measured no slower on a 5M-record store: one-key, 1,000-key and hot-key lookups within
  the run-to-run noise (BENCHMARKS.md). The files stay byte-identical to RocketMQ's for that sizing.
"""

DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
STORE_HASH_SLOT_NUM = 1_000_000
