"""``examples/explore.ipynb`` against a Spark Connect server (its kernel is the Connect client)."""

from __future__ import annotations

import pytest

from tests.datasource.test_notebook import run_notebook

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_notebook_runs_against_connect(connect_server, tmp_path):
    run_notebook(tmp_path, remote=connect_server)
