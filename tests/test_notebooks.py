"""Every notebook in notebooks/ runs top to bottom, headless, without error.

Notebooks are stored without outputs (checked here too) and executed with
nbclient on the test environment's own Python kernel.

A shorter run under test: the kernel gets ``MINIPAR_NOTEBOOK_QUICK=1`` (:data:`QUICK_VAR`).
A notebook whose full run is long (``11_end_to_end``: two minutes of training) reads it in
its first code cell and trains fewer steps; every cell still runs, and its assertions check
the claims on the shorter run's numbers.  Unset (Jupyter), a notebook runs in full.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
TIMEOUT_PER_CELL = 120
#: set for the kernel of every executed notebook: "run the short version"
QUICK_VAR = "MINIPAR_NOTEBOOK_QUICK"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("outputs")]
    assert not dirty, f"{path.name}: code cells {dirty} have stored outputs; clear them"
    ids = [c.get("id") for c in nb["cells"]]  # nbformat 4.5: every cell has its own id
    assert None not in ids and len(set(ids)) == len(ids), f"{path.name}: cells without an id"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_speaks_of_ideals_and_papers_not_project_goals(path: Path) -> None:
    """A learner reads the ideal and the paper's figure, never "target 1.45x" or "issue 8"."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    text = "".join("".join(c["source"]) for c in nb["cells"])
    found = re.findall(r"(?i)\btargets? *[<>=≤≥]*\s*\d|\bissue \d", text)
    assert not found, f"{path.name}: {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("MPLBACKEND", "Agg")
    monkeypatch.setenv(QUICK_VAR, "1")  # the kernel inherits this process's environment
    # a temp folder of its own (the kernel, its minipar runs and their ranks inherit TMPDIR):
    # what the run leaves behind there is seen, whoever else shares the machine's /tmp
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
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
    left = sorted(p.name for p in tmp.iterdir())  # minipar-launch-*, a notebook's own folders
    assert not left, f"{path.name} left {left} in the temp folder"


def test_the_quick_switch_is_read_by_the_long_notebook() -> None:
    """The notebook that trains for minutes spells the switch as this test sets it (a typo
    would run its full version under test)."""
    readers = [p.name for p in NOTEBOOKS if QUICK_VAR in p.read_text(encoding="utf-8")]
    assert "11_end_to_end.ipynb" in readers, readers


def _code(cell: dict) -> str:
    """A code cell's Python, IPython's ``!shell`` and ``%magic`` lines blanked."""
    return "\n".join("" if ln.lstrip().startswith(("!", "%")) else ln
                     for ln in "".join(cell["source"]).splitlines())


def test_the_full_run_asserts_what_the_quick_run_asserts() -> None:
    """The suite runs the quick mode only: an assertion under ``if not QUICK`` (or any branch
    on the switch) is never executed by it, and notebook 11's full run failed on one twice.
    A notebook's claims are checked the same way in both modes, on their own numbers."""
    import ast
    import json

    found = []
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
            for node in ast.walk(ast.parse(_code(cell))):
                if isinstance(node, ast.If) and "QUICK" in ast.unparse(node.test):
                    branch = ast.Module(body=node.body + node.orelse, type_ignores=[])
                    if any(isinstance(n, ast.Assert) for n in ast.walk(branch)):
                        found.append(f"{path.name} code cell {i}: if {ast.unparse(node.test)}")
    assert not found, found
