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


def run_notebook(kafka_bootstrap: str, work: Path, monkeypatch: pytest.MonkeyPatch, remote: str | None = None) -> None:
    """Run the notebook in a fresh kernel (a local session, or Spark Connect at `remote`) and
    check what it shows: pushed filters, lookups, bulk lookups, both figures, the index built."""
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("MSGINDEX_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("MSGINDEX_NOTEBOOK_DIR", str(work / "index"))
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
    assert len(figures) == 2  # messages per minute, chain-length histogram
    assert any(p.name.startswith("broker=") for p in (work / "index").iterdir())


def test_notebook_runs_end_to_end(kafka_bootstrap, tmp_path, monkeypatch):
    run_notebook(kafka_bootstrap, tmp_path, monkeypatch)
