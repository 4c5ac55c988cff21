"""The tools that look at a store from outside its readers and writers: ``inspect`` (every check,
bytes by kind of file), ``repair`` (rebuilds what the log proves, never deletes committed data),
``upgrade`` (older formats to the current one) and ``disk_usage`` (the bytes of each kind of file
that ``inspect`` and the benchmarks print)."""
