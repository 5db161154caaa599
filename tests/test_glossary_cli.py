"""``minipar glossary``: cards, JSON, scan, list, export, bad input; light imports; works from a wheel."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from minipar.cli import glossary as glossary_cli
from minipar.cli import main as minipar

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "glossary" / "_seeds"
GLOSSARY_DEPS = ("snowballstemmer", "rapidfuzz", "jieba")  # pyproject.toml's dependencies for it


def run_cli(*args: str, stdin: bytes | None = None, cwd: Path | None = None,
            exe: list[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "80"
    cmd = (exe or [sys.executable, "-m", "minipar.cli"]) + ["glossary", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=60, cwd=cwd or ROOT, env=env,
                          check=False)


def test_card_in_three_languages(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "72")
    assert minipar(["glossary", "контрольных", "точек", "активации"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("── activation-checkpointing ")
    for text in ("Activation checkpointing", "Контрольные точки активаций", "激活检查点",
                 "Correction:", "Chen, Xu, Zhang, Guestrin 2016", "minipar.parallel.remat"):
        assert text in out
    assert max(glossary_cli.display_width(line) for line in out.splitlines()) <= 72


def test_card_one_language(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "ZeRO-2", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    assert "在 ZeRO-1 基础上再分片梯度" in out and "ZeRO-1 plus partitioned gradients" not in out


def test_card_marks_exactly_the_missing_links_planned() -> None:
    """Whatever has landed by now: a link reads "(planned)" iff its file does not exist yet."""
    for term in glossary_cli.g.terms():
        text = glossary_cli.card(term, width=400)
        for kind, targets in term.links.items():
            for t in targets:
                planned = glossary_cli.link_status(kind, t) == "planned"
                assert (f"{t} (planned)" in text) == planned, (term.id, t)


def test_json_matches_best_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "All Reduce", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits[0] == {**hits[0], "id": "all-reduce", "en": "All-reduce", "zh": "全归约", "score": 1.0}
    assert {"id", "en", "ru", "zh", "score"} <= set(hits[1])
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


@pytest.mark.parametrize("word", ["quantization", "квантование", "квантизация", "量化"])
def test_quantization_is_one_card_in_every_language(word: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", word, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == "block-scaling"


def test_unknown_query_says_no_match_and_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "alreduse-xq"]) == 1
    err = capsys.readouterr().err
    assert "no match" in err and "all-reduce" in err


def test_nonsense_query_says_so_without_suggestions(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "xyzzyq"]) == 1
    err = capsys.readouterr().err
    assert err == ("minipar glossary: no match for 'xyzzyq'. No term is similar enough to suggest "
                   "(similarity >= 0.5); `minipar glossary --list` shows every term.\n")


@pytest.mark.parametrize("query", ["sharding", "шардинг", "шардирование"])
def test_a_family_word_prints_the_family(query: str, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert minipar(["glossary", query]) == 0
    out = capsys.readouterr().out
    assert out.startswith("«sharding") and "family of 8 terms" in out and "──" not in out
    for tid in ("sharded-data-parallelism", "zero-1", "zero-2", "zero-3", "fsdp", "zero-plus-plus"):
        assert f"\n  {tid}\n" in out
    assert "A card: minipar glossary sharded-data-parallelism" in out


def test_run_lines_follow_the_strategy_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """`minipar run hybrid` reads planned until registry.STRATEGIES has it (and its module exists)."""
    from minipar.glossary import links as glinks

    monkeypatch.setattr(glinks, "STRATEGIES", {k: v for k, v in glinks.STRATEGIES.items() if k != "hybrid"})
    term = glossary_cli.g.by_id()["3d-parallelism"]
    line = "minipar run hybrid --dp 2 --tp 2 --pp 2 -n 8"
    assert f"{line} (planned)" in glossary_cli.card(term, width=400)
    zero = glossary_cli.card(glossary_cli.g.by_id()["zero"], width=400)
    assert "Run: minipar run zero --stage 2 -n 4\n" in zero + "\n" and "(planned)" not in zero.split("Run:")[1]
    monkeypatch.setattr(glinks, "STRATEGIES", {**glinks.STRATEGIES, "hybrid": ("minipar.run.dp", "stand-in")})
    assert f"{line} (planned)" not in glossary_cli.card(term, width=400)


def test_card_names_the_seed_by_title(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "zero"]) == 0
    out = capsys.readouterr().out
    assert "As written in a machine-translated Chinese article (errors kept):" in out
    assert "As written in a Russian AI glossary (errors kept):" in out and "Seed" not in out
    assert ".txt" not in out


def test_every_option_shows_its_default() -> None:
    for action in glossary_cli._parser()._actions:
        if action.help is not None and action.dest != "help":
            assert "default" in action.help, action.option_strings or action.dest


@pytest.mark.parametrize("args", [[""], ["   "], []])
def test_empty_query_is_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", *args]) == 2
    assert "empty query" in capsys.readouterr().err


def test_list_has_every_term(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "--list"]) == 0
    out = capsys.readouterr().out
    n = len(glossary_cli.g.terms())
    assert f"{n} terms." in out and "全归约" in out and "1f1b" in out
    assert minipar(["glossary", "--list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == n


@pytest.mark.parametrize("width", [60, 80, 100])
def test_list_never_cuts_a_name(width: int) -> None:
    """Every name appears whole: its cell's wrapped lines, joined, give the name back."""
    out = glossary_cli.table(width=width)
    assert "…" not in out
    lines = out.splitlines()
    if width >= 80:
        assert max(glossary_cli.display_width(line) for line in lines) <= width
    header = lines[0]
    starts = [header.index(label) for label in ("EN", "RU", "ZH")]
    ids = [t.id for t in glossary_cli.g.terms()]
    rows: dict[str, list[str]] = {}
    current = ""
    for line in lines[2:lines.index("")]:  # the table ends at the blank line before "N terms."
        head = line.split(" ", 1)[0]
        if head in ids:
            current = head
        rows.setdefault(current, []).append(line)
    for t in glossary_cli.g.terms():
        for la, start in zip(("en", "ru", "zh"), starts):
            # cut the cell out by display column, then glue the wrapped pieces
            pieces = [_columns(line, start, starts[starts.index(start) + 1] if start != starts[-1] else None)
                      for line in rows[t.id]]
            glued = "".join(p if p.endswith("-") or not p else p + " " for p in pieces if p)
            assert _squash(glued) == _squash(t.names[la]), (t.id, la, pieces)


def _columns(line: str, start: int, end: int | None) -> str:
    """The text of ``line`` between display columns [start, end)."""
    out, col = "", 0
    for c in line:
        if col >= start and (end is None or col < end):
            out += c
        col += glossary_cli.display_width(c)
    return out.strip()


def _squash(s: str) -> str:
    return "".join(s.split())


def test_export_md(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "--export-md", str(tmp_path / "g.md")]) == 0
    assert (tmp_path / "g.md").read_text(encoding="utf-8") == glossary_cli.markdown()


def test_export_md_refuses_a_missing_folder_in_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "docs" / "g.md"
    assert minipar(["glossary", "--export-md", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"minipar glossary: --export-md: cannot write {target}: the folder {target.parent} "
        "does not exist (minipar does not create it)\n")
    assert not target.parent.exists()


def test_scan_a_seed_file(capsys: pytest.CaptureFixture[str]) -> None:
    path = SEEDS / "004_9ffc8ddddd5da86d.txt"
    assert minipar(["glossary", "--scan", str(path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    text = path.read_text(encoding="utf-8")
    assert {"ring-all-reduce", "mixture-of-experts", "router"} <= {m["id"] for m in found}
    assert all(text[m["start"]:m["end"]] == m["text"] for m in found)
    assert minipar(["glossary", "--scan", str(path)]) == 0
    assert "mentions of 27 terms" in capsys.readouterr().out


def test_scan_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert minipar(["glossary", "--scan", "/no/such/file.txt"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_stdin_bad_utf8_big_input_and_light_imports() -> None:
    """Subprocesses: invalid UTF-8 and 1 MB on stdin, a huge query; no traceback, no NumPy/mpi4py."""
    proc = run_cli("--scan", "-", "--json", stdin=b"\xff\xfe DP \xc3( \xe6\x95\xb0\xe6\x8d\xae\xe5\xb9\xb6\xe8\xa1\x8c")
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr
    assert b"not valid UTF-8" in proc.stderr
    found = json.loads(proc.stdout)
    assert [m["id"] for m in found] == ["data-parallelism", "data-parallelism"]

    big = ("ring all-reduce и параллелизм данных; 张量并行. " * 20000).encode()[:1_000_000]
    proc = run_cli("--scan", "-", stdin=big)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr
    assert b"mentions of 3 terms" in proc.stdout

    proc = subprocess.run([sys.executable, "-m", "minipar.cli", "glossary", b"\xff\xfe"],
                          capture_output=True, timeout=60, cwd=ROOT, check=False)  # undecodable argv
    assert proc.returncode == 1 and b"no match" in proc.stderr and b"Traceback" not in proc.stderr

    proc = run_cli("x" * 5000)
    assert proc.returncode == 2 and b"--scan" in proc.stderr and b"Traceback" not in proc.stderr

    probe = ("import sys; from minipar.cli import main; main(['glossary', 'all-reduce']); "
             "main(['glossary', '--scan', sys.argv[1]]); "
             "print('HEAVY', sorted(m for m in ('numpy', 'mpi4py', 'matplotlib') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe, str(SEEDS / "000_1e5fa01697d9c096.txt")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("HEAVY []")


def test_installed_wheel_ships_the_glossary(tmp_path: Path) -> None:
    """Build the wheel, install it (not editable) into a fresh venv, look a term up from elsewhere."""
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)]
    try:
        import hatchling  # noqa: F401  (present: build offline, without isolation)

        build.insert(5, "--no-build-isolation")
    except ImportError:
        pass
    subprocess.run(build, check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "dist").glob("minipar-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "minipar/_glossary/all-reduce.toml" in names and "minipar/_glossary/_normalise.toml" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=120)
    # the glossary's own dependencies, offline: this environment's copies, linked in (no NumPy)
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in GLOSSARY_DEPS:
        (deps / name).symlink_to(importlib.util.find_spec(name).submodule_search_locations[0])
    (next(venv.glob("lib/python*/site-packages")) / "glossary-deps.pth").write_text(f"{deps}\n")
    proc = run_cli("all-reduce", "--json", cwd=tmp_path, exe=[str(venv / "bin" / "minipar")])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["zh"] == "全归约"
    where = subprocess.run([str(py), "-c", "from minipar import glossary as g; print(g.data_dir())"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert where.stdout.strip() == str(next(venv.glob("lib/python*/site-packages")) / "minipar" / "_glossary")
