"""RocketMQ's default IndexFile sizing (MessageStoreConfig maxHashSlotNum / maxIndexNum), stated
once: the defaults of every index file msgindex creates or reads, and of the CLI's help. A module
of its own so that the command line can name them without loading numpy."""

DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
