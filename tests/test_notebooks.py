"""Every notebook in notebooks/ runs top to bottom, headless, without error.

Notebooks are stored without outputs (checked here too) and executed with
nbclient on the test environment's own Python kernel.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
TIMEOUT_PER_CELL = 120


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("outputs")]
    assert not dirty, f"{path.name}: code cells {dirty} have stored outputs; clear them"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_PER_CELL,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    # run the kernel with this interpreter, whatever kernelspec is installed globally
    client.kernel_manager_class = "jupyter_client.manager.KernelManager"
    client.km = client.create_kernel_manager()
    client.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    client.execute()
