"""``examples/explore.ipynb`` runs end to end against the session's real Kafka broker, in a kernel
of this interpreter, and its outputs stay stripped in the repository. (Its run against a Spark
Connect server is in ``tests/connect``.)"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "explore.ipynb"


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def run_notebook(kafka_bootstrap: str, work: Path, monkeypatch: pytest.MonkeyPatch, remote: str | None = None,
                 index: str | None = None) -> str:
    """Run the notebook in a fresh kernel (a local session, or Spark Connect at `remote`) on the
    index at `index` (default: a folder in `work`) and check what it shows: pushed filters,
    lookups, bulk lookups, both figures, the index built. Returns the text it printed."""
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("MSGINDEX_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("MSGINDEX_NOTEBOOK_DIR", index or str(work / "index"))
    monkeypatch.setenv("MSGINDEX_NOTEBOOK_MESSAGES", "2000")
    if remote is None:
        monkeypatch.delenv("MSGINDEX_REMOTE", raising=False)
    else:
        monkeypatch.setenv("MSGINDEX_REMOTE", remote)
    # kernel "python3" runs `python -m ipykernel_launcher`; jupyter_client swaps a bare "python"
    # for sys.executable, so the kernel is this interpreter (the project's venv)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(work)}})
    client.execute()
    outputs = "".join(
        out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
    )
    assert ("local Spark" if remote is None else remote) in outputs
    assert "PushedFilters: [" in outputs and "EqualTo(key,customer-1)" in outputs
    assert "order-42" in outputs
    assert "orders found: 20 of 20" in outputs  # lookup_keys over the incident's order ids
    figures = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
               if "image/png" in out.get("data", {})]
    assert len(figures) == 2  # messages per minute, chain-length (or chunk-size) histogram
    if index is None:
        assert any(p.name.startswith("broker=") for p in (work / "index").iterdir())
    return outputs


def test_notebook_runs_end_to_end(kafka_bootstrap, tmp_path, monkeypatch):
    run_notebook(kafka_bootstrap, tmp_path, monkeypatch)


def test_notebook_runs_on_an_object_store_index(kafka_bootstrap, s3, tmp_path, monkeypatch):
    """MSGINDEX_NOTEBOOK_DIR an s3:// URL, endpoint and credentials in the kernel's AWS_* variables
    (as the notebook says): the same answers, the chunks plotted, nothing written to a local path."""
    import msgindex

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    url = s3.url("explore")
    work = tmp_path / "work"
    work.mkdir()
    outputs = run_notebook(kafka_bootstrap, work, monkeypatch, index=url)
    assert "chunks in 1 shards; 2000 records" in outputs
    with msgindex.open(url, storage_options=s3.options) as store:
        assert store.brokers() and sum(batch.num_rows for batch in store.scan()) == 2000
    assert [p.name for p in work.iterdir() if not p.name.startswith("spark-")] == []
