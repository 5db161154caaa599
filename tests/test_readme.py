"""README.md and docs/REFERENCES.md stay true: the set-up commands, the learning path,
the layout, and every module and test the references page names."""

from __future__ import annotations

import re
from pathlib import Path

from minipar.exercises import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
REFERENCES = (ROOT / "docs" / "REFERENCES.md").read_text(encoding="utf-8")


def section(text: str, title: str) -> str:
    """The body of the level-2 section ``## title`` (up to the next level-2 heading)."""
    assert f"\n## {title}\n" in text, title
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_set_up_commands_are_unchanged_and_activation_is_said() -> None:
    setup = section(README, "Set up")
    assert ("python3 -m venv .venv && .venv/bin/pip install -e '.[notebooks]' && "
            ".venv/bin/minipar demo -n 4") in setup
    assert ("python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && "
            ".venv/bin/python -m pytest -q") in setup  # what CI runs
    assert "source .venv/bin/activate" in setup


def test_learning_path_names_every_notebook_and_only_existing_exercises() -> None:
    path = section(README, "Learning path")
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert nb.stem in path, f"notebook {nb.name} is missing from the learning path"
    named = set(re.findall(r"`([a-z0-9_]+)`", path)) | set(
        re.findall(r"minipar exercise (?:start|check) ([a-z0-9_]+)", path))
    exercises = {n for n in named if "_" in n and not n[:2].isdigit()}
    assert {"ring_allreduce", "dp_grad_sync", "zero1_step"} <= exercises
    assert exercises <= set(EXERCISES), exercises - set(EXERCISES)


def test_layout_lists_every_package() -> None:
    layout = section(README, "Layout")
    packages = sorted(p.name for p in (ROOT / "minipar").iterdir()
                      if (p / "__init__.py").is_file())
    for name in packages:
        assert re.search(rf"^\s+{name}/\s", layout, re.MULTILINE), f"minipar/{name}/ not in Layout"


def test_references_name_only_existing_or_planned_modules() -> None:
    for paragraph in re.split(r"\n(?=- |### |\| )", REFERENCES):
        flat = " ".join(paragraph.split())
        for mod in set(re.findall(r"`(minipar(?:\.[a-z_]+)+)`", flat)):
            rel = ROOT / Path(*mod.split("."))
            if not (rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()):
                assert "planned" in flat, f"{mod} does not exist and is not marked planned"


def test_references_name_only_existing_tests() -> None:
    cited = re.findall(r"`(test_[a-z0-9_]+)(?:::(test_[a-z0-9_]+))?`", REFERENCES)
    assert len(cited) > 30
    for file, test in cited:
        source = (ROOT / "tests" / f"{file}.py").read_text(encoding="utf-8")
        assert not test or f"def {test}(" in source, f"{file}::{test}"


def test_documentation_cites_the_references_page_that_exists() -> None:
    """Every mention of REFERENCES.md in the package and docs is docs/REFERENCES.md."""
    for f in [*(ROOT / "minipar").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]:
        for line in f.read_text(encoding="utf-8").splitlines():
            for m in re.finditer(r"[\w/.]*REFERENCES\.md", line):
                ok = m.group() in ("docs/REFERENCES.md", "REFERENCES.md") and (
                    m.group() == "docs/REFERENCES.md" or f.parent.name == "docs")
                assert ok, f"{f.relative_to(ROOT)}: {line.strip()}"
