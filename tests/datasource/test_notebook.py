"""``examples/explore.ipynb`` runs end to end against the session's real Kafka broker, in a kernel
of this interpreter, and its outputs stay stripped in the repository."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "explore.ipynb"


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_notebook_runs_end_to_end(kafka_bootstrap, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("MSGINDEX_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("MSGINDEX_NOTEBOOK_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("MSGINDEX_NOTEBOOK_MESSAGES", "2000")
    # kernel "python3" runs `python -m ipykernel_launcher`; jupyter_client swaps a bare "python"
    # for sys.executable, so the kernel is this interpreter (the project's venv)
    client = NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(
        out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
    )
    assert "PushedFilters: [" in outputs and "EqualTo(key,customer-1)" in outputs
    assert "order-42" in outputs
    figures = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
               if "image/png" in out.get("data", {})]
    assert len(figures) == 2  # messages per minute, chain-length histogram
    assert any(p.name.startswith("broker=") for p in (tmp_path / "index").iterdir())
    assert os.listdir(tmp_path / "index")
