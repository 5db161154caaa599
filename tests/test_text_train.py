"""``minipar train --text``, ``minipar sample`` and checkpoints at the command line (issue 20).

The single-process side of real text: ``minipar train --text FILE`` (and the
embedded corpus) prints the validation loss beside the text's unigram entropy
and writes ``--json`` / ``--plot``; a small GPT on a small trilingual text
learns it (validation far below the unigram entropy, greedy samples from a
Russian and a Chinese prompt continue in Cyrillic and in Chinese); a run
resumed from its checkpoint continues the uninterrupted run to the bit (float32
and float64); every resume that cannot continue the run, and every save that
would overwrite one, is one line and exit 2 naming what differs; ``minipar
sample`` prints the prompt and its continuation, repeatably, and never raises
on bytes that are not UTF-8.  Two ``minipar run`` launches on 2 ranks: a
data-parallel text run saved, resumed under ZeRO-2 into the same folder (the
multi-rank kill drills are elsewhere).

Training runs in a child process with one BLAS thread (``launch.THREAD_VARS``):
on a busy machine a model this small trains several times slower with a thread
pool than without.  Refusals run in-process through ``minipar.cli.main``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import refused_before_mpi, run_minipar

from minipar import cli, launch
from minipar.data import corpus
from minipar.parallel import checkpoint
from minipar.parallel.common import RunSpec
from minipar.parallel.engine import SerialEngine

#: one BLAS thread in the children that train
ONE_THREAD = {var: "1" for var in launch.THREAD_VARS}
#: a model that trains in a fraction of a second
TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "8"]
#: three languages, three scripts: 1 byte per Latin letter, 2 per Cyrillic, 3 per Chinese
LINES = "The cat sat on the mat.\nКошка сидит на ковре.\n猫坐在垫子上。\n"
#: what the learning test trains (found by experiment over 5 seeds: 200 steps reach a
#: validation loss of 0.08-0.28 against a unigram entropy of 3.38, i.e. 0.02-0.08 of it,
#: and greedy samples with 9-18 Cyrillic letters and 5-6 Chinese characters; 100 steps
#: reach 0.10-0.14 of it but write as few as 3 Chinese characters)
LEARN = ["--d-model", "16", "--layers", "1", "--heads", "2", "--seq", "32", "--batch", "8",
         "--steps", "200", "--lr", "1e-2"]


def trilingual(folder: Path, repeat: int = 20, name: str = "tri.txt") -> Path:
    """A UTF-8 file of :data:`LINES` ``repeat`` times (1,700 bytes for 20)."""
    path = folder / name
    path.write_text(LINES * repeat, encoding="utf-8")
    return path


def train(folder: Path, *argv: str | Path, tag: str = "run") -> tuple[str, dict[str, Any]]:
    """``minipar train ARGV --quiet --json`` in a child: (its stdout, its JSON record)."""
    record = folder / f"{tag}.json"
    proc = run_minipar("train", *map(str, argv), "--quiet", "--json-out", str(record),
                       env=ONE_THREAD)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout, json.loads(record.read_text(encoding="utf-8"))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *names: str) -> str:
    """``minipar ARGV`` in-process: exit 2, one line naming every one of ``names``."""
    assert cli.main([*argv, *(["--quiet"] if argv[0] == "train" else [])]) == 2, argv
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and "Traceback" not in err, (argv, out, err)
    assert lines[0].startswith(f"minipar {argv[0]}: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def sample(capsys: pytest.CaptureFixture[str], d: Path, *argv: str) -> str:
    """What ``minipar sample D ARGV`` prints (exit 0, on stderr at most the note that the
    checkpoint is too young to read), print's newline off."""
    assert cli.main(["sample", str(d), *argv]) == 0
    out, err = capsys.readouterr()
    assert err in ("", young_note(d)) and out.endswith("\n"), err
    return out[:-1]


def young_note(d: Path) -> str:
    """The one line ``minipar sample`` writes to stderr for a checkpoint of few steps."""
    from minipar.parallel import checkpoint

    step = checkpoint.read_manifest(d)[1]["step"]
    return (f"(minipar sample: this checkpoint holds step {step}; on the default model the "
            "text reads as words only after about 1,500 steps: train longer with --steps, or "
            "--resume it)\n")


def cyrillic(text: str) -> int:
    return sum("\u0400" <= c <= "\u04ff" for c in text)


def han(text: str) -> int:
    return sum("\u4e00" <= c <= "\u9fff" for c in text)


# ---------------------------------------------------------------- minipar train --text


def test_train_on_a_file_prints_validation_and_entropy_and_writes_json_and_plot(
        tmp_path: Path) -> None:
    text = trilingual(tmp_path, repeat=6)  # 510 bytes: a validation split of 51
    plot = tmp_path / "curve.png"
    out, rec = train(tmp_path, "--text", text, *TINY, "--steps", "30", "--plot", plot)
    line = out.strip()
    m = re.fullmatch(r"gpt: \d+ parameters, float32, 30 steps in .*; loss (\S+) -> (\S+); "
                     r"validation (\S+) after step 30 \(unigram entropy (\S+)\)", line)
    assert m, line
    assert len(rec["losses"]) == 30 and rec["start"] == 0
    assert float(m[1]) == round(rec["losses"][0], 4) and float(m[2]) == round(rec["losses"][-1], 4)
    # --eval-every defaults to a tenth of the steps with --text
    assert sorted(map(int, rec["validation"])) == list(range(3, 31, 3))
    assert float(m[3]) == round(rec["validation"]["30"], 4)
    assert float(m[4]) == round(rec["unigram_entropy"], 4)
    assert rec["text"]["sha256"] == hashlib.sha256(text.read_bytes()).hexdigest()
    assert rec["text"]["name"] == str(text) and rec["text"]["bytes"] == 510
    assert rec["text"]["tokenizer"] == "utf-8 bytes" and rec["args"]["vocab"] == 256
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_on_the_embedded_corpus(tmp_path: Path) -> None:
    out, rec = train(tmp_path, "--text", *TINY, "--steps", "30")
    assert re.search(r"; validation \S+ after step 30 \(unigram entropy \S+\)$", out.strip()), out
    assert rec["text"]["name"] == corpus.NAME
    assert rec["text"]["sha256"] == hashlib.sha256(corpus.data()).hexdigest()
    assert rec["text"]["bytes"] > 100_000  # the glossary in three languages and the docs
    assert 3.0 < rec["unigram_entropy"] < 5.55  # below ln 256: bytes are far from uniform
    assert rec["losses"][-1] < rec["losses"][0]


def test_eval_every_0_turns_validation_off_and_k_sets_it(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    text = str(trilingual(tmp_path))
    for every, steps in (("0", []), ("2", [2, 4])):
        record = tmp_path / f"every{every}.json"
        assert cli.main(["train", "--text", text, *TINY, "--steps", "4", "--eval-every", every,
                         "--quiet", "--json-out", str(record)]) == 0
        line, rec = capsys.readouterr().out.strip(), json.loads(record.read_text())
        assert line.endswith(f"(unigram entropy {rec['unigram_entropy']:.4f})"), line
        assert ("validation" in line) == bool(steps), line
        assert sorted(map(int, rec["validation"])) == steps


# ---------------------------------------------------------------- it learns


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The small GPT of :data:`LEARN`, trained on 20 x :data:`LINES`, saved."""
    folder = tmp_path_factory.mktemp("learned")
    text = trilingual(folder)
    out, rec = train(folder, "--text", text, *LEARN, "--save", folder / "ckpt")
    return {"dir": folder / "ckpt", "record": rec, "out": out, "text": text}


def test_a_small_gpt_learns_a_trilingual_text(learned: dict[str, Any],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rec = learned["record"]
    validation, entropy = rec["validation"]["200"], rec["unigram_entropy"]
    assert validation < 0.25 * entropy, (validation, entropy)  # seen: 0.02-0.08 x
    russian = sample(capsys, learned["dir"], "--prompt", "Кошка", "--tokens", "40",
                     "--temperature", "0")
    chinese = sample(capsys, learned["dir"], "--prompt", "猫", "--tokens", "30",
                     "--temperature", "0")
    assert russian.startswith("Кошка") and chinese.startswith("猫")
    assert cyrillic(russian[len("Кошка"):]) >= 6, russian  # seen: 9-18
    assert han(chinese[1:]) >= 3, chinese  # seen: 5-6


# ---------------------------------------------------------------- resume at the CLI


def whole_run(folder: Path, precision: str) -> tuple[Path, dict[str, Any]]:
    """An uninterrupted 30-step text run of :data:`TINY` in ``precision``, saving at
    steps 10, 20 and 30: (its checkpoint root, its JSON record)."""
    text = trilingual(folder)
    _, rec = train(folder, "--text", text, *TINY, "--precision", precision, "--steps", "30",
                   "--save", folder / "whole", "--save-every", "10", tag="whole")
    return folder / "whole", rec


@pytest.fixture(scope="module")
def whole32(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return whole_run(tmp_path_factory.mktemp("whole32"), "float32")


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_a_resumed_run_continues_the_uninterrupted_one_to_the_bit(
        precision: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    root, whole = (request.getfixturevalue("whole32") if precision == "float32"
                   else whole_run(tmp_path, precision))
    assert sorted(p.name for p in root.iterdir()) == [f"step_000000{k}0" for k in (1, 2, 3)]
    out, resumed = train(tmp_path, "--text", root.parent / "tri.txt", *TINY, "--precision",
                         precision, "--steps", "30", "--resume", root / "step_00000010",
                         tag="resumed")
    assert out.startswith(f"gpt: 11760 parameters, {precision}, steps 11-30 in "), out
    assert resumed["start"] == 10 and resumed["losses"] == whole["losses"][10:]
    assert resumed["validation"] == {k: v for k, v in whole["validation"].items()
                                     if int(k) > 10}


def test_a_resume_from_a_root_continues_from_its_latest(saved: dict[str, Any],
                                                        whole32: tuple[Path, dict[str, Any]],
                                                        tmp_path: Path) -> None:
    """``--steps 20 --save D --save-every 10``, then ``--steps 30 --resume D``: step 21 on."""
    _, whole = whole32
    assert saved["record"]["losses"] == whole["losses"][:20]  # saving changes nothing
    _, resumed = train(tmp_path, "--text", saved["text"], *TINY, "--steps", "30", "--resume",
                       saved["ck"])
    assert resumed["start"] == 20 and resumed["losses"] == whole["losses"][20:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A float32 text run of :data:`TINY`, 20 steps, checkpoints at 10 and 20 (and its
    JSON record); a second text; a checkpoint of the modular-sum task."""
    folder = tmp_path_factory.mktemp("saved")
    text, other = trilingual(folder), trilingual(folder, repeat=21, name="other.txt")
    ck = folder / "ck"
    _, record = train(folder, "--text", text, *TINY, "--steps", "20", "--save", ck,
                      "--save-every", "10")
    modular = folder / "modular"
    assert cli.main(["train", "--steps", "2", "--d-model", "16", "--layers", "1", "--heads", "2",
                     "--batch", "4", "--quiet", "--save", str(modular)]) == 0
    return {"folder": folder, "text": text, "other": other, "ck": ck, "modular": modular,
            "record": record}


#: (the options that change, what the one line must name): a resume that cannot continue
RESUME_REFUSED = [
    (["--steps", "10"], ["step_00000020 is at step 20", "--steps 10 is the total",
                         "--steps > 20"]),
    (["--steps", "20"], ["--steps > 20"]),
    (["--batch", "4"], ["other data", "--batch: checkpoint 8, this run 4"]),
    (["--seq", "8"], ["another model", "--seq: checkpoint 16, this run 8"]),
    (["--data-seed", "3"], ["other data", "--data-seed: checkpoint 0, this run 3"]),
    (["--d-model", "32"], ["--d-model: checkpoint 16, this run 32"]),
    (["--layers", "2"], ["--layers: checkpoint 1, this run 2"]),
    (["--heads", "4"], ["--heads: checkpoint 2, this run 4"]),
    (["--precision", "float64"], ["--precision: checkpoint 'float32', this run 'float64'"]),
    (["--optimizer", "sgd"], ["--optimizer: checkpoint 'adamw', this run 'sgd'"]),
    # the optimizer's settings (train's weight decay is 0, run's 0.01): a new --lr is allowed
    (["--weight-decay", "0.01"], ["--weight-decay: checkpoint 0, this run 0.01",
                                  "give --weight-decay 0 to continue it"]),
    (["--betas", "0.9", "0.95"], ["--betas: checkpoint 0.9, 0.999, this run 0.9, 0.95",
                                  "give --betas 0.9 0.999"]),
    (["--eps", "1e-6"], ["--eps: checkpoint 1e-08, this run 1e-06"]),
]


@pytest.mark.parametrize("change,names", RESUME_REFUSED,
                         ids=[" ".join(c) for c, _ in RESUME_REFUSED])
def test_a_resume_that_cannot_continue_is_one_line(saved: dict[str, Any], change: list[str],
                                                   names: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = files(saved["ck"])
    argv = ["train", "--text", str(saved["text"]), *TINY, "--steps", "30", *change,
            "--resume", str(saved["ck"])]
    refused(argv, capsys, *names)
    assert files(saved["ck"]) == before


def test_another_text_or_task_is_refused_naming_both(saved: dict[str, Any],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    ck, text, other = str(saved["ck"]), str(saved["text"]), str(saved["other"])
    steps = [*TINY, "--steps", "30", "--resume"]
    refused(["train", "--text", other, *steps, ck], capsys, "other data",
            f"--text: checkpoint {text}, this run {other}", "SHA-256")
    refused(["train", "--text", *steps, ck], capsys,
            f"--text: checkpoint {text}, this run {corpus.NAME}")
    refused(["train", *steps, ck], capsys,  # no --text: the task, not the vocabulary, named
            f"--text: checkpoint on the text {text}, this run on the modular-sum task",
            f"give --text {text}")
    refused(["train", "--text", text, *steps, str(saved["modular"])], capsys,
            "--text: checkpoint on the modular-sum task, this run on the text")


def test_a_text_file_changed_since_the_save_is_refused(tmp_path: Path) -> None:
    text = trilingual(tmp_path)
    assert cli.main(["train", "--text", str(text), *TINY, "--steps", "2", "--quiet", "--save",
                     str(tmp_path / "ck")]) == 0
    text.write_text(LINES * 20 + "one more line\n", encoding="utf-8")
    proc = run_minipar("train", "--text", str(text), *TINY, "--steps", "4", "--quiet",
                       "--resume", str(tmp_path / "ck"), env=ONE_THREAD)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--text: {text} changed since the save (SHA-256 " in proc.stderr, proc.stderr


def test_save_and_resume_options_refused_before_any_work(saved: dict[str, Any], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    ck, text = saved["ck"], str(saved["text"])
    run = ["train", "--text", text, *TINY, "--steps", "30"]
    before = files(ck)
    # a folder that holds a checkpoint is not saved into without --resume: nothing overwritten
    refused([*run, "--save", str(ck)], capsys, f"--save {ck} already holds a checkpoint "
            "(step_00000020)", f"--resume {ck}")
    refused([*run, "--save", str(ck), "--resume", str(ck / "step_00000010")], capsys,
            "already holds a checkpoint")  # step 20 would be saved over
    refused([*run, "--save-every", "5"], capsys, "--save-every needs --save DIR")
    refused([*run, "--keep-last", "2"], capsys, "--keep-last needs --save DIR")
    refused([*run, "--keep-last", "0", "--save", str(tmp_path / "k")], capsys, "--keep-last")
    refused([*run, "--save", text], capsys, "a file, not a folder")
    refused([*run, "--save", str(tmp_path / "no" / "such")], capsys,
            "its parent folder does not exist")
    assert files(ck) == before
    # --resume of what is not a complete, sound checkpoint
    refused([*run, "--resume", str(tmp_path / "nothing")], capsys, "nothing does not exist")
    refused([*run, "--resume", text], capsys, "is a file")
    (tmp_path / "empty").mkdir()
    refused([*run, "--resume", str(tmp_path / "empty")], capsys, "no complete checkpoint")
    partial = tmp_path / "partial"
    shutil.copytree(ck / "step_00000010", partial / "step_00000010")
    (partial / "step_00000010" / checkpoint.MANIFEST).unlink()
    refused([*run, "--resume", str(partial)], capsys, "step_00000010 partial", "ignored")
    refused([*run, "--resume", str(partial / "step_00000010")], capsys,
            "has no manifest.json", "an earlier step_* folder")
    damaged = tmp_path / "damaged"
    shutil.copytree(ck, damaged)
    (damaged / "step_00000020" / checkpoint.MANIFEST).write_text("{not json")
    refused([*run, "--resume", str(damaged)], capsys, "manifest.json is damaged")
    shard = damaged / "step_00000010" / "shard_00000_of_00001.npz"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    refused([*run, "--resume", str(damaged / "step_00000010")], capsys,
            "shard_00000_of_00001.npz does not match the manifest's SHA-256", "damaged")


# ---------------------------------------------------------------- minipar sample


def test_sample_prints_the_prompt_and_its_continuation_repeatably(
        learned: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d = learned["dir"]
    greedy = sample(capsys, d, "--prompt", "The ", "--tokens", "40", "--temperature", "0")
    assert greedy.startswith("The ")
    # 40 bytes, less the first bytes of a character the 40th byte cut short
    assert 40 - 3 <= len(greedy.encode()) - len(b"The ") <= 40, greedy
    assert "\ufffd" not in greedy, greedy  # a model that learned writes UTF-8
    assert sample(capsys, d, "--prompt", "The ", "--tokens", "40", "--temperature", "0") == greedy
    assert sample(capsys, d, "--prompt", "The ", "--tokens", "40", "--top-k", "1",
                  "--temperature", "1") == greedy  # the likeliest byte only: greedy again
    hot = ["--prompt", "The ", "--tokens", "60", "--temperature", "2"]
    one = sample(capsys, d, *hot, "--seed", "1")
    assert sample(capsys, d, *hot, "--seed", "1") == one
    assert sample(capsys, d, *hot, "--seed", "2") != one
    assert sample(capsys, d, "--prompt", "Кошка", "--tokens", "0") == "Кошка"
    assert cli.main(["sample", str(d.parent)]) == 2  # the folder above: no checkpoint there
    capsys.readouterr()


def forced(tmp_path: Path, byte: int) -> Path:
    """A text checkpoint whose model predicts ``byte`` after any context: the last
    LayerNorm outputs its bias (gain 0), and the head maps that bias onto ``byte`` only."""
    text = trilingual(tmp_path)
    spec = RunSpec(text=str(text), vocab=256, seq=16, d_model=16, layers=1, heads=2,
                   precision="float32")
    engine = SerialEngine(spec.model(), spec.precision, spec.optimizer, spec.seed,
                          **spec.opt_kwargs())
    views = engine.views
    views["ln_f.gamma"][:] = 0.0
    views["ln_f.beta"][:] = 1.0
    views["lm_head"][:] = 0.0
    views["lm_head"][:, byte] = 1.0
    return checkpoint.save(engine, tmp_path / f"forced_{byte:02x}", checkpoint.OneProcess(),
                           spec=spec)


def test_bytes_that_are_not_utf8_print_as_replacement_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 0x80 is a continuation byte: each one alone is invalid, one U+FFFD each
    d = forced(tmp_path, 0x80)
    assert sample(capsys, d, "--prompt", "Кошка", "--tokens", "6", "--temperature", "0") == (
        "Кошка" + "\ufffd" * 6)
    # 0xD0 starts a 2-byte character that the next 0xD0 does not continue: invalid, except
    # the last one, a character cut short at the end (left out: not the model's mistake)
    d = forced(tmp_path, 0xD0)
    assert sample(capsys, d, "--prompt", "猫", "--tokens", "5", "--temperature", "0") == (
        "猫" + "\ufffd" * 4)
    assert sample(capsys, d, "--prompt", "猫", "--tokens", "1", "--temperature", "0") == "猫"
    # an output that cannot show Cyrillic (PYTHONIOENCODING=ascii): "?", not a traceback
    proc = run_minipar("sample", str(d), "--prompt", "Кошка", "--tokens", "3",
                       "--temperature", "0", env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and proc.stderr == young_note(d), proc.stderr
    assert proc.stdout == "?????" + "?" * 2 + "\n", proc.stdout


def test_sample_refuses_bad_input_in_one_line(saved: dict[str, Any], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ck = str(saved["ck"])
    refused(["sample", str(saved["modular"])], capsys,
            "trained on the modular-sum task, not on text", "minipar train --text")
    for option, value, names in (("--top-k", "0", ["--top-k", "from 1 to 256"]),
                                 ("--top-k", "257", ["--top-k", "got 257"]),
                                 ("--tokens", "-1", ["--tokens", "-1"]),
                                 ("--tokens", "100001", ["--tokens", "100000", "got 100001"]),
                                 ("--tokens", "many", ["--tokens", "'many'"]),
                                 ("--temperature", "-1", ["--temperature", ">= 0"]),
                                 ("--temperature", "nan", ["--temperature"]),
                                 ("--seed", "-1", ["--seed"]),
                                 ("--prompt", "", ["--prompt is empty"])):
        refused(["sample", ck, option, value], capsys, *names)
    refused(["sample", str(tmp_path / "nothing")], capsys, "does not exist")
    refused(["sample", str(saved["text"])], capsys, "is a file")
    (tmp_path / "step_00000003").mkdir()
    refused(["sample", str(tmp_path / "step_00000003")], capsys, "has no manifest.json")
    refused(["sample"], capsys, "DIR")


def test_sample_of_a_float64_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = trilingual(tmp_path)
    assert cli.main(["train", "--text", str(text), *TINY, "--steps", "3", "--precision",
                     "float64", "--quiet", "--save", str(tmp_path / "ck")]) == 0
    capsys.readouterr()
    _, manifest = checkpoint.read_manifest(tmp_path / "ck")
    assert manifest["precision"] == "float64" and manifest["dtypes"]["param"] == "float64"
    out = sample(capsys, tmp_path / "ck", "--prompt", "猫", "--tokens", "9", "--seed", "3")
    assert out.startswith("猫") and len(out) <= 1 + 9  # a byte is at most one character
    params = checkpoint.full_tensors(tmp_path / "ck")[2]
    assert all(a.dtype == np.float64 for a in params.values())


# ---------------------------------------------------------------- minipar run, 2 ranks


def test_a_text_run_saved_on_dp_resumes_under_zero_2_into_the_same_folder(
        tmp_path: Path) -> None:
    d = tmp_path / "ck"
    first = run_minipar("run", "dp", "-n", "2", "--text", "--steps", "4", "--save", str(d),
                        "--timeout", "120", timeout=180)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "final parameters: equal to the serial run" in first.stdout
    # resume from the root (its latest, step 4) and save into it: the serial oracle must
    # load step 4 too, not the step 6 this run has just written there
    second = run_minipar("run", "zero", "--stage", "2", "-n", "2", "--text", "--steps", "6",
                         "--resume", str(d), "--save", str(d), "--eval-every", "1", "--json",
                         "--timeout", "120", timeout=180)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    s = json.loads(second.stdout)
    assert s["start"] == 4 and len(s["losses"]) == len(s["serial_losses"]) == 2, s
    assert s["verdict"]["status"] == "equal", s["verdict"]
    assert sorted(s["validation"]) == ["5", "6"]
    assert any("resumed at step 4 from " + str(d / "step_00000004") in n for n in s["notes"])
    assert sorted(p.name for p in d.iterdir()) == ["step_00000004", "step_00000006"]


@pytest.mark.parametrize("change,names", [
    (["--steps", "4"], ["is at step 4", "--steps > 4"]),
    (["--steps", "6", "--seq", "16"], ["--seq: checkpoint 8, this run 16"]),
])
def test_a_multi_rank_resume_that_cannot_continue_is_refused_before_mpi(
        saved: dict[str, Any], tmp_path: Path, change: list[str], names: list[str]) -> None:
    # a one-rank checkpoint of minipar run's default model (seq 8), made here
    spec = RunSpec(text=str(saved["text"]), vocab=256, steps=4)
    engine = SerialEngine(spec.model(), spec.precision, spec.optimizer, spec.seed,
                          **spec.opt_kwargs())
    for s in range(4):
        engine.step(spec.batch_at(s))
    checkpoint.save(engine, tmp_path / "ck", checkpoint.OneProcess(), spec=spec)
    line = refused_before_mpi(["run", "dp", "-n", "2", "--text", str(saved["text"]), *change,
                               "--resume", str(tmp_path / "ck")], tmp_path).stderr.strip()
    assert line.startswith("minipar run: "), line
    for name in names:
        assert name in line, line


def test_sample_says_a_young_checkpoint_is_young_and_stops_cleanly_on_ctrl_c(
        saved: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from minipar.cli import sample as verb

    d = saved["ck"]
    assert cli.main(["sample", str(d), "--prompt", "Ab", "--tokens", "2"]) == 0
    assert capsys.readouterr().err == young_note(d)  # step < 1,500: said, on stderr only

    def interrupted(*args: Any, **kwargs: Any) -> Any:  # Ctrl-C after three bytes
        def new() -> Any:
            yield from b"xyz"
            raise KeyboardInterrupt
        return new(), {"step": 2000}

    monkeypatch.setattr(verb, "sampler", interrupted)
    assert cli.main(["sample", str(d), "--prompt", "Ab", "--tokens", "9"]) == 130
    out, err = capsys.readouterr()
    assert out == "Abxyz\n"  # what was generated before Ctrl-C, then the usual line
    assert err.endswith("minipar: interrupted\n") and "holds step" not in err


def test_keep_last_keeps_the_newest_checkpoints_and_the_one_resumed_from(
        saved: dict[str, Any], tmp_path: Path) -> None:
    from minipar.parallel import checkpoint

    d = tmp_path / "ck"
    train(tmp_path, "--text", saved["text"], *TINY, "--steps", "12", "--save", d,
          "--save-every", "3", "--keep-last", "2")
    assert [p.name for p in checkpoint.scan(d)[0]] == ["step_00000009", "step_00000012"]
    assert checkpoint.scan(d)[1] == []  # nothing half removed
    # resumed from step 12 with --keep-last 1: step 12 stays (the serial check reads it);
    # a new learning rate is allowed on a resume (notebook 11 lowers it), unlike --eps & co
    train(tmp_path, "--text", saved["text"], *TINY, "--steps", "18", "--resume", d, "--save", d,
          "--save-every", "3", "--keep-last", "1", "--lr", "1e-3", tag="resumed")
    assert [p.name for p in checkpoint.scan(d)[0]] == ["step_00000012", "step_00000018"]
