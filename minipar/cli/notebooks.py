"""``minipar notebooks --html DIR``: every notebook executed and written as an HTML page.

EN rendered notebooks · RU тетрадки в HTML · ZH 渲染后的笔记本

For a learner who wants to read before installing: each notebook of ``notebooks/`` is run
top to bottom on this machine (nbclient, a kernel on this Python; its minipar runs use
real local ranks), written as ``DIR/NAME.html`` with its figures and the explorers'
default views (nbconvert), and ``DIR/index.html`` lists them in the learning path's order
(00 the map, then 01 to 11, as README.md's "Learning path").  ``--quick`` runs the
shorter version the test suite runs (``MINIPAR_NOTEBOOK_QUICK=1``); ``--only NAME`` one
notebook.  A notebook that fails is written up to its error and named in one line; the
exit status is then 1.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from minipar.cli.options import ArgumentParser, error_line

PROG = "minipar notebooks"
NOTEBOOKS = Path(__file__).resolve().parent.parent.parent / "notebooks"
QUICK_VAR = "MINIPAR_NOTEBOOK_QUICK"


def title(nb: dict) -> str:
    """The notebook's first heading, without its ``#``."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def render(path: Path, out_dir: Path, timeout: float) -> str | None:
    """Execute ``path`` and write ``out_dir/STEM.html``; the error's one line, or None."""
    import nbclient
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.kernel_manager_class = "jupyter_client.manager.KernelManager"
    client.km = client.create_kernel_manager()
    client.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f",
                            "{connection_file}"]
    failed = None
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # keep what ran, name the error
        plain = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the traceback's colours
        failed = (plain.strip().splitlines() or ["a cell failed"])[-1]
    body, _ = HTMLExporter().from_notebook_node(nb)
    (out_dir / f"{path.stem}.html").write_text(body, encoding="utf-8")
    return failed


def index(pages: list[tuple[str, str, str | None]]) -> str:
    """The index page: the notebooks in the learning path's order, with their titles."""
    items = "\n".join(
        f'<li><a href="{html.escape(stem)}.html">{html.escape(stem)}</a> — '
        f"{html.escape(t)}" + (f" <em>(failed: {html.escape(err)})</em>" if err else "")
        + "</li>" for stem, t, err in pages)
    return ("<!doctype html><meta charset='utf-8'><title>minipar notebooks</title>"
            "<h1>minipar: the notebooks, executed</h1><p>In the learning path's order "
            "(README.md): 00 is the map of the field, then 01 to 11.</p>"
            f"<ul>\n{items}\n</ul>\n")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description="execute every notebook and write HTML "
                            "pages with their figures and an index in the learning path's order")
    parser.add_argument("--html", metavar="DIR", required=True,
                        help="folder to write NAME.html and index.html into (created; "
                             "no default)")
    parser.add_argument("--only", metavar="NAME", action="append", default=[],
                        help="render this notebook only (e.g. 06_pipeline; repeatable; "
                             "default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="the shorter runs the test suite makes (default: off, the full "
                             "notebooks)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one cell may run (default 600)")
    args = parser.parse_args(argv)
    try:
        import nbclient  # noqa: F401
        import nbconvert  # noqa: F401
    except ImportError as e:
        return error_line(PROG, f"needs {e.name}: pip install -e '.[notebooks]'")
    if not NOTEBOOKS.is_dir():
        return error_line(PROG, f"no notebooks/ folder beside the package ({NOTEBOOKS}); "
                          "run it from a clone of the repository")
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    known = {p.stem for p in paths}
    bad = [n for n in args.only if n not in known]
    if bad:
        return error_line(PROG, f"--only {bad[0]!r}: no such notebook; one of "
                          f"{', '.join(sorted(known))}")
    if args.timeout <= 0:
        return error_line(PROG, f"--timeout must be a positive number of seconds, got "
                          f"{args.timeout:g}")
    out = Path(args.html)
    if out.exists() and not out.is_dir():
        return error_line(PROG, f"--html {out}: a file is there; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        os.environ[QUICK_VAR] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    pages, tmpdir = [], os.environ.get("TMPDIR")
    for path in paths:
        if args.only and path.stem not in args.only:
            continue
        print(f"{PROG}: running {path.name} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="minipar-notebooks-") as tmp:
            os.environ["TMPDIR"] = tmp
            err = render(path, out, args.timeout)
        t = title(json.loads(path.read_text(encoding="utf-8")))
        pages.append((path.stem, t, err))
        print(f"{PROG}: {out / (path.stem + '.html')}" + (f"  FAILED: {err}" if err else ""))
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    (out / "index.html").write_text(index(pages), encoding="utf-8")
    print(f"{PROG}: {out / 'index.html'} ({len(pages)} notebooks)")
    return 1 if any(err for _, _, err in pages) else 0
