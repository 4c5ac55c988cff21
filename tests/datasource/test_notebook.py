"""``examples/explore.ipynb`` executed as a user would run it, with ``jupyter nbconvert --execute``
from the dev extra, in a kernel of this interpreter: pointed at an index that does not exist yet,
it builds the demo's (the demo's traffic, ``msgindex index``), investigates the demo's order, and
stops what it started. Here the index is in a bucket (the session's S3 server, through the
``AWS_*`` variables) and Kafka is the session's broker; its run against a Spark Connect server
(``tests/connect``) takes a local index and starts the demo's own broker. Its outputs stay
stripped in the repository.

The figure is saved as a PNG beside the executed notebook (and to ``$MSGINDEX_SCREENSHOTS``)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

import msgindex

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "explore.ipynb"
JUPYTER = str(Path(sys.executable).with_name("jupyter"))
DEMO_RECORDS = 4000
PARAMETERS = ("MSGINDEX_INDEX", "MSGINDEX_KEY", "MSGINDEX_BOOTSTRAP", "MSGINDEX_REMOTE", "MSGINDEX_DEMO_RECORDS")


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def run_notebook(work: Path, remote: str | None = None, index: str | None = None, bootstrap: str | None = None,
                 variables: dict[str, str] | None = None) -> str:
    """Execute the notebook in `work` on an index that does not exist yet (`index`, default a
    folder in `work`), with the demo's own broker unless `bootstrap`; its text outputs."""
    from msgindex.kafka.broker import LocalBroker

    index = index or str(work / "demo" / "records")
    env = {name: value for name, value in os.environ.items() if name not in PARAMETERS}
    env.update(MSGINDEX_INDEX=index, MSGINDEX_DEMO_RECORDS=str(DEMO_RECORDS), **(variables or {}))
    if remote:
        env["MSGINDEX_REMOTE"] = remote
    if bootstrap:
        env["MSGINDEX_BOOTSTRAP"] = bootstrap
    temp_before = set(Path(tempfile.gettempdir()).glob("msgindex-*"))
    executed = work / "explored.ipynb"
    try:
        done = subprocess.run([JUPYTER, "nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK), "--output",
                               str(executed), "--ExecutePreprocessor.timeout=900"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-6000:]
    finally:
        LocalBroker(work / "demo" / "kafka").stop()  # when a cell failed before the last one
    notebook = nbformat.read(executed, as_version=4)
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    text = "".join(out.get("text", "") + str(out.get("data", {}).get("text/plain", "")) for out in outputs)
    figures = [out["data"]["image/png"] for out in outputs if "image/png" in out.get("data", {})]
    assert len(figures) == 1
    for folder in (work, Path(os.environ.get("MSGINDEX_SCREENSHOTS") or work)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"notebook-{'connect' if remote else 'local'}.png").write_bytes(base64.b64decode(figures[0]))
    # what it showed: the order's six messages, from the index and from Spark, with payloads
    assert f"index {index}" in text and "payloads from 127.0.0.1:" in text
    assert "6 messages under 'order-00321' in 2 topics and 2 partitions" in text
    assert "PushedFilters: [EqualTo(any_key,order-00321)]" in text and "6 messages (the lookup above: 6)" in text
    assert "issuer timeout" in text and "declined at " in text and "shipped" in text
    # section 5: the declines around it, found by the payload field the index holds
    declines = re.search(r"(\d+) declined payments from \S+ to \S+ UTC, found by the 'status' field", text)
    assert declines and int(declines.group(1)) > 0, text[-3000:]
    mine = re.search(r"order-00321: (\d+) of them", text)  # as many as its payloads say (section 4)
    assert mine and int(mine.group(1)) == text.count("declined at ") > 0, text[-3000:]
    assert (remote or "a local Spark session") in text
    # ... and it cleaned up: its broker stopped, no temporary folders left, nothing written but the index
    assert ("stopped the broker this notebook started" in text) == (bootstrap is None)
    assert not LocalBroker(work / "demo" / "kafka").status().running
    assert set(Path(tempfile.gettempdir()).glob("msgindex-*")) - temp_before == set()
    assert sorted(p.name for p in work.iterdir()) == sorted([*(["demo"] if index.startswith(str(work)) else []),
                                                             "explored.ipynb",
                                                             f"notebook-{'connect' if remote else 'local'}.png"])
    return text


def test_notebook_investigates_the_demo_index_it_builds_in_a_bucket(tmp_path, s3):
    """Kafka is a broker of the test's own (the session's has other tests' demo topics)."""
    from msgindex.kafka.broker import LocalBroker, free_port

    url = s3.url("demo")
    broker = LocalBroker(tmp_path / "kafka", port=free_port(), controller_port=free_port())
    work = tmp_path / "work"
    work.mkdir()
    try:
        run_notebook(work, index=url, bootstrap=broker.start(timeout=300), variables=s3.env)
    finally:
        broker.stop()
    with msgindex.open(url, storage_options=s3.options) as store:
        assert store.brokers() and store.client.list("_checkpoint/offsets/")  # all of it in the bucket
