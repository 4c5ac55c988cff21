"""Runnable jobs: the indexing pipeline, the demo and load generators."""
