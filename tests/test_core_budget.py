"""A technique is read whole: its core files are short and hold no instrumentation.

``../shared/ARCHITECTURE.md`` §7: inside each family, the technique itself is a
short *core* (functions and small classes over explicit state, named as the
papers name them) and the engine around it a *shell* (the Engine interface,
options and their checks, state_dict, memory, traffic, timelines) with the
family's ``measure.py`` (formulas, ledgers).  A glossary term's ``code`` link
names its core files in reading order; this test holds every such term — those
of today and every one added later — to

* at most 3 files, every one present;
* a budget of code lines summed over them (docstrings, comments and blank
  lines not counted; :func:`minipar.glossary.code_lines.code_lines`, the same
  counter ``minipar glossary TERM`` prints): about 200 per technique, 250 for a
  pipeline schedule with the loop that runs a stage, 300 for tensor parallelism
  with sequence parallelism;
* no instrumentation: no clock, no byte, memory or timeline accounting, no
  report text, no import of a ``measure`` module, of a front end or of the
  family's shell (the shell calls the core, never the other way round).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from minipar import glossary as g
from minipar.glossary.code_lines import code_file, code_lines
from minipar.glossary.render import card

ROOT = Path(__file__).resolve().parent.parent

#: the techniques of the mission that must point at their core (issue "Read a technique whole")
REQUIRED = (
    "distributed-data-parallel", "parameter-server", "zero-1", "zero-2", "zero-3",
    "tensor-parallelism", "column-parallelism", "row-parallelism", "sequence-parallelism",
    "ring-attention", "deepspeed-ulysses", "expert-parallelism", "gpipe", "1f1b",
    "interleaved-pipeline", "zero-bubble", "activation-checkpointing", "offloading",
)

DEFAULT_BUDGET = 200
#: a pipeline schedule with the loop that runs one stage; TP with SP (ARCHITECTURE §7)
BUDGET = {
    **dict.fromkeys(("gpipe", "1f1b", "interleaved-pipeline", "zero-bubble", "dualpipe",
                     "dualpipe-v"), 250),
    **dict.fromkeys(("tensor-parallelism", "column-parallelism", "row-parallelism",
                     "sequence-parallelism"), 300),
}
MAX_FILES = 3

#: modules a core may not import: clocks, memory accounting, report formats, front ends
FORBIDDEN_MODULES = ("time", "tracemalloc", "json", "minipar.memory", "minipar.progress",
                     "minipar.trace")
FORBIDDEN_PREFIXES = ("minipar.run", "minipar.bench", "minipar.viz", "minipar.cli",
                      "minipar.exercises")
#: names a core may not use or define: clocks, timelines, ledgers, byte counters, report text
FORBIDDEN_NAMES = frozenset({
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "time_ns",
    "Timeline", "Ledger", "ledger", "stats", "bytes_sent", "set_aside", "tracemalloc",
    "measured", "notes",
})


def coded_terms() -> list[g.Term]:
    return [t for t in g.terms() if t.links.get("code")]


def core_files() -> list[str]:
    return sorted({f for t in coded_terms() for f in t.links["code"]})


def module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def imported(tree: ast.AST, module: str) -> list[str]:
    """Absolute names of every module a file imports (relative imports resolved)."""
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]
    return out


def is_shell(name: str, family: str) -> bool:
    """A family's shell: its ``engine`` module or any ``*_engine`` beside it (``ps_engine``)."""
    return name.startswith(family + ".") and name.rsplit(".", 1)[-1].endswith("engine")


def instrumentation(path: str) -> list[str]:
    """What in a core file measures instead of computing: each problem as ``file:line what``."""
    text = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    module = module_of(path)
    family = module.rsplit(".", 1)[0]
    problems = []
    for name in imported(tree, module):
        last = name.rsplit(".", 1)[-1]
        if (name in FORBIDDEN_MODULES or name.startswith(FORBIDDEN_PREFIXES)
                or last == "measure" or is_shell(name, family) and module != name):
            problems.append(f"{path}: imports {name}")
    for node in ast.walk(tree):
        defs = (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)
        name = (node.id if isinstance(node, ast.Name)
                else node.attr if isinstance(node, ast.Attribute)
                else node.name if isinstance(node, defs)
                else node.arg if isinstance(node, ast.arg) else None)
        if name in FORBIDDEN_NAMES:
            problems.append(f"{path}:{node.lineno}: {name}")
    return problems


def test_every_technique_of_the_mission_points_at_its_core() -> None:
    table = g.by_id()
    missing = [tid for tid in REQUIRED if not table[tid].links.get("code")]
    assert not missing, f"terms without a [links] code: {missing}"


@pytest.mark.parametrize("term", coded_terms(), ids=lambda t: t.id)
def test_a_technique_is_read_whole_within_its_budget(term: g.Term) -> None:
    files = term.links["code"]
    assert len(files) <= MAX_FILES, f"{term.id}: {len(files)} files to read, at most {MAX_FILES}"
    assert len(set(files)) == len(files), f"{term.id}: a file named twice"
    for f in files:
        assert code_file(f) == ROOT / f, f"{term.id}: {f} is not a file of the package"
    counts = {f: code_lines(ROOT / f) for f in files}
    budget = BUDGET.get(term.id, DEFAULT_BUDGET)
    assert sum(counts.values()) <= budget, (
        f"{term.id}: {sum(counts.values())} code lines to read ({counts}), budget {budget}")


@pytest.mark.parametrize("path", core_files())
def test_a_core_holds_no_instrumentation(path: str) -> None:
    assert instrumentation(path) == []


def test_the_instrumentation_check_finds_what_it_forbids(tmp_path: Path, monkeypatch) -> None:
    bad = ("import time\nfrom minipar.memory import Ledger\nfrom . import measure\n"
           "from .engine import X\n\ndef f(comm, notes):\n    t = time.perf_counter()\n"
           "    return comm.stats.bytes_sent('x')\n")
    pkg = tmp_path / "minipar" / "parallel" / "fam"
    pkg.mkdir(parents=True)
    (pkg / "core.py").write_text(bad)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    found = instrumentation("minipar/parallel/fam/core.py")
    for what in ("imports time", "imports minipar.memory", "imports minipar.parallel.fam.measure",
                 "imports minipar.parallel.fam.engine", "perf_counter", "stats", "bytes_sent",
                 "notes"):
        assert any(what in p for p in found), (what, found)
    (pkg / "core.py").write_text("import numpy as np\n\ndef f(x):\n    return np.sum(x)\n")
    assert instrumentation("minipar/parallel/fam/core.py") == []


def test_code_lines_counts_what_a_learner_reads() -> None:
    src = ('"""Module doc,\n\nlong."""\n\nimport numpy as np  # a comment\n\n\n'
           'def f(x):\n    """Doc."""\n    # why\n    y = (x +\n         1)\n    return y\n')
    assert code_lines(src) == 5  # import, def, the two lines of y, return
    assert code_lines("x = '''not a docstring\n'''\n") == 2  # an assigned string is code


def test_a_card_prints_each_core_file_with_its_code_lines() -> None:
    for term in coded_terms():
        text = card(term, status=True)
        assert "Read the code:" in text
        for f in term.links["code"]:
            line = next(x for x in text.splitlines() if x.strip().startswith(f))
            assert re.search(rf"\b{code_lines(ROOT / f)} code lines", line), line


FAMILIES = ("data_parallel", "zero", "tensor_parallel", "context_parallel", "expert_parallel",
            "pipeline", "offload")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_says_where_to_start(family: str) -> None:
    """Its ``__init__`` docstring begins with "The technique: read ``X.py`` (N code lines)".

    Every ``X.py`` (N code lines) it names is counted by the same counter, so the
    number a learner reads there stays true."""
    init = ROOT / "minipar" / "parallel" / family / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    assert "The technique: read" in doc, f"{family}: its __init__ does not say where to start"
    named = re.findall(r"``([\w/.]+\.py)``\s+\((\d+)\s+code\s+lines\)", doc)
    assert named, f"{family}: no ``file.py`` (N code lines) in its __init__"
    for rel, n in named:
        path = (init.parent / rel) if (init.parent / rel).is_file() else ROOT / rel
        assert path.is_file(), f"{family}: {rel} named but not found"
        assert code_lines(path) == int(n), (
            f"{family}: {rel} has {code_lines(path)} code lines, says {n}")


def test_each_techniques_notebook_shows_its_core() -> None:
    """A technique's notebook prints its core itself (``show_source`` of a function or class
    defined in one of the term's ``code`` files), read from the package beside the picture."""
    import json

    for term in coded_terms():
        defined = set()
        for f in term.links["code"]:
            tree = ast.parse((ROOT / f).read_text(encoding="utf-8"))
            defined |= {n.name for n in tree.body
                        if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        for nb in term.links.get("notebooks", []):
            cells = json.loads((ROOT / "notebooks" / nb).read_text(encoding="utf-8"))["cells"]
            code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            shown = {part for dotted in re.findall(r"show_source\(\s*([\w.]+)", code)
                     for part in dotted.split(".")}  # StageLoop.run shows StageLoop
            assert shown & defined, f"{term.id}: {nb} shows none of {sorted(defined)}"


def test_the_architecture_table_counts_are_true() -> None:
    """docs/ARCHITECTURE.md's "Core and shell" table: every ``file.py`` N it gives (a bare
    name lives in the folder of the path before it) is that file's count now."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = doc.split("## Core and shell", 1)[1].split("\n## ", 1)[0]
    folder, seen = "", 0
    for rel, n in re.findall(r"`([\w/]+\.py)` (\d+)", section):
        if "/" in rel:
            folder = rel.rsplit("/", 1)[0]
        else:
            rel = f"{folder}/{rel}"
        path = next(p for p in (ROOT / "minipar" / "parallel" / rel, ROOT / "minipar" / rel,
                                ROOT / rel) if p.is_file())
        assert code_lines(path) == int(n), (
            f"ARCHITECTURE: {rel} has {code_lines(path)} lines, says {n}")
        seen += 1
    assert seen >= 20


def test_a_code_link_resolves_next_to_the_running_package(tmp_path: Path, monkeypatch) -> None:
    """In a wheel the files sit in site-packages/minipar/...: the link's repo-root path is
    found next to whichever ``minipar`` runs, not next to a checkout."""
    import minipar.glossary.code_lines as cl

    pkg = tmp_path / "site-packages" / "minipar"
    (pkg / "parallel" / "zero").mkdir(parents=True)
    (pkg / "parallel" / "zero" / "step.py").write_text("x = 1\n")
    monkeypatch.setattr(cl, "PKG_DIR", pkg)
    assert cl.code_file("minipar/parallel/zero/step.py") == pkg / "parallel" / "zero" / "step.py"
    assert cl.code_file("minipar/parallel/zero/hooks.py") is None
    assert cl.code_file("docs/ARCHITECTURE.md") is None
