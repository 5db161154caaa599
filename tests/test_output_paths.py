"""Every option that names a file or folder minipar writes is checked before any work.

One table over all verbs with such an option (``--json-out``, ``--timeline``,
``--trace``, ``-o``, ``--plot``, ``--save``, ``--offload-dir``, ``checkpoint export
OUT``, ``glossary --export-md``): a path inside a folder that does not exist exits 2
with one line naming the option, and nothing was launched (the launcher is replaced
by one that fails the test) -- the run would otherwise end only to find it cannot
write its figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minipar import cli, launch

BAD = "/no/such/folder/out.json"
CASES = [
    (["run", "pp", "-n", "2", "--timeline", BAD], "--timeline"),
    (["run", "dp", "-n", "2", "--trace", BAD], "--trace"),
    (["run", "dp", "-n", "2", "--json-out", BAD], "--json-out"),
    (["run", "dp", "-n", "2", "--save", "/no/such/folder/ckpt"], "--save"),
    (["run", "dp", "-n", "2", "--remat", "--offload", "disk", "--offload-dir", "/no/such/folder"],
     "--offload-dir"),
    (["train", "--json-out", BAD], "--json-out"),
    (["train", "--plot", "/no/such/folder/loss.png"], "--plot"),
    (["bench", "model", "--json-out", BAD], "--json-out"),
    (["bench", "remat", "--json-out", BAD], "--json-out"),
    (["bench", "offload", "--json-out", BAD], "--json-out"),
    (["bench", "train", "--json-out", BAD], "--json-out"),
    (["bubble", "--schedule", "gpipe", "--stages", "2", "--micro-batches", "2", "-o",
      "/no/such/folder/b.png"], "-o"),
    (["bubble", "--schedule", "gpipe", "--stages", "2", "--micro-batches", "2", "--trace", BAD],
     "--trace"),
    (["glossary", "--export-md", "/no/such/folder/g.md"], "--export-md"),
]


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"launched before the output path was checked: {args}")
    monkeypatch.setattr(launch, "run", refuse)


@pytest.mark.parametrize("argv, option", CASES, ids=[" ".join(c[0][:2]) + " " + c[1] for c in CASES])
def test_an_unwritable_output_path_is_refused_before_the_work(
        argv: list[str], option: str, no_launch: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "/no/such/folder" in lines[0], err
    assert "unrecognized" not in lines[0], err  # the option exists: refused for its path


def test_checkpoint_export_checks_its_output_before_reading(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["checkpoint", "export", str(tmp_path), "/no/such/folder/m.safetensors"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "/no/such/folder" in err, err


def test_run_json_out_writes_the_summary_it_prints_with_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``minipar run --json-out FILE`` (the one meaning of --json across verbs): FILE holds
    the summary ``--json`` prints."""
    import json

    out = tmp_path / "summary.json"
    assert cli.main(["run", "dp", "-n", "2", "--steps", "1", "--json", "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(printed[printed.index("{"):])


def test_a_path_the_permission_bits_allow_but_the_file_system_refuses(
        tmp_path: Path, no_launch: None, capsys: pytest.CaptureFixture[str]) -> None:
    """As root, ``os.access`` says yes to ``/proc``; the file is really opened (created and
    removed at once), so the refusal still comes before the work; a good path is left as
    it was (a new one not created, an existing one not emptied)."""
    from minipar.cli.options import check_output_file

    if Path("/proc/self").is_dir():  # Linux: /proc takes no new files, whoever asks
        assert cli.main(["bench", "model", "--json-out", "/proc/minipar-x.json"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--json-out" in err[0] and "/proc/minipar-x.json" in err[0], err
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("kept")
    assert check_output_file(str(new)) is None and not new.exists()
    assert check_output_file(str(old)) is None and old.read_text() == "kept"
