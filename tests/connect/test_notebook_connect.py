"""``examples/explore.ipynb`` against a Spark Connect server (its kernel is the Connect client)."""

from __future__ import annotations

import pytest

from tests.datasource.test_notebook import run_notebook

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_notebook_runs_against_connect(kafka_bootstrap, connect_server, tmp_path, monkeypatch):
    run_notebook(kafka_bootstrap, tmp_path, monkeypatch, remote=connect_server)
