"""``minipar checkpoint info`` / ``export`` and the safetensors format they write.

The exported file is read with the real ``safetensors`` library and must hold the
engine's ``full_params()`` to the bit, under the serial model's names and in its
dtype (float64; bfloat16 under mixed precision; ``--kind master`` the fp32 master
weights).  :mod:`minipar.safetensors_io` is checked against the library both ways.
Everything runs in-process through ``minipar.cli.main`` on one rank (the 4-rank
export: tests/test_checkpoint.py); usage errors: tests/test_bad_input.py.
"""

from __future__ import annotations

import functools
import json
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from minipar import cli, safetensors_io
from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.nn import GPT
from minipar.parallel import checkpoint
from minipar.parallel.common import RunSpec
from minipar.parallel.zero.engine import ZeRO
from minipar.registry import VERBS

SPEC = RunSpec(steps=4)
BF16 = np.dtype(ml_dtypes.bfloat16)


@functools.cache
def grid() -> Grid:
    return Grid(TracedComm(MPI.COMM_SELF), dp=1)


def call(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main(["checkpoint", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    """The one line of a refused ``minipar checkpoint ARGV`` (exit 2, nothing on stdout)."""
    code, out, err = call(capsys, *argv)
    assert (code, out) == (2, ""), (argv, code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def bits(params: dict[str, np.ndarray]) -> dict[str, tuple[str, tuple, bytes]]:
    return {n: (str(v.dtype), v.shape, v.tobytes()) for n, v in params.items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """ZeRO-3 on one rank, float64 and mixed, saved at steps 2 and 4; a partial step 6
    (its shard file and no manifest, as a killed save leaves it).  The parameters and
    master weights at step 4, as the engine returned them."""
    out = {}
    for spec in (SPEC, SPEC.with_(precision="mixed")):
        root = tmp_path_factory.mktemp(spec.precision)
        eng = ZeRO(grid(), spec, stage=3)
        for s in range(4):
            eng.step(spec.batch_at(s))
            if s in (1, 3):
                checkpoint.save(eng, root, grid().world, spec=spec)
        partial = checkpoint.step_dir(root, 6)
        partial.mkdir()
        shutil.copy(checkpoint.step_dir(root, 4) / "shard_00000_of_00001.npz", partial)
        master = None if eng.states.master is None else eng.layout.unflatten(eng.states.master)
        out[spec.precision] = {"root": root, "params": eng.full_params(), "master": master}
    return out


def test_the_verb_is_registered() -> None:
    assert VERBS["checkpoint"][0] == "minipar.cli.checkpoint"


def test_info_is_one_block_with_what_the_run_recorded(saved: dict, capsys) -> None:
    root = saved["float64"]["root"]
    code, out, err = call(capsys, "info", root)
    assert code == 0 and err == ""
    d4 = checkpoint.step_dir(root, 4)
    lines = out.splitlines()
    assert lines[0] == f"checkpoint {d4}"
    row = {ln[2:20].strip(): ln[20:] for ln in lines[1:] if ln[2:20].strip()}
    assert row["format"] == "minipar-checkpoint/2"
    assert row["step"].startswith("4 ")
    assert row["model"].startswith("vocab_size 10, block_size 8, n_layer 2, n_head 2, "
                                   "d_model 16, d_ff 64,")
    assert row["precision"] == "float64"
    assert row["optimizer"] == "adamw (t 4, lr 0.01, b1 0.9, b2 0.999, eps 1e-08, weight_decay 0.01)"
    assert row["saved on"].startswith("1 rank ")
    shapes = GPT(SPEC.config()).param_shapes()
    assert row["tensors"] == f"{len(shapes)} serial tensors, {GPT(SPEC.config()).n_params():,} parameters"
    assert row["arrays"] == "param float64, exp_avg float64, exp_avg_sq float64"
    for f in ("shard_00000_of_00001.npz", "manifest.json"):
        size = (d4 / f).stat().st_size
        assert any(ln.split() == [f, f"{size:,}", "bytes"] for ln in lines), f
    assert row["checkpoints"].startswith("step_00000002, step_00000004 (complete")
    assert row["partial, ignored"].startswith("step_00000006 (1 shard file, no manifest.json")
    assert "not in manifest" not in row


def test_info_json_and_a_step_directory(saved: dict, capsys) -> None:
    root = saved["mixed"]["root"]
    code, out, _ = call(capsys, "info", "--json", root)
    s = json.loads(out)
    assert code == 0 and s["path"] == str(checkpoint.step_dir(root, 4)) and s["step"] == 4
    assert s["model"] == checkpoint.describe(SPEC)["model"] and s["precision"] == "mixed"
    assert s["dtypes"] == {"param": "bfloat16", "master": "float32", "exp_avg": "float32",
                           "exp_avg_sq": "float32"}
    assert s["world_size"] == 1 and s["optimizer_state"]["t"] == 4
    assert s["params"] == GPT(SPEC.config()).n_params()
    assert s["checkpoints"] == ["step_00000002", "step_00000004"]
    assert s["partial"] == [{"dir": "step_00000006", "shard_files": ["shard_00000_of_00001.npz"]}]
    assert s["bytes"] == sum(f["bytes"] for f in s["files"])
    code, out, _ = call(capsys, "info", "--json", checkpoint.step_dir(root, 2))
    s = json.loads(out)
    assert code == 0 and s["step"] == 2 and "partial" not in s and "checkpoints" not in s


@pytest.mark.parametrize("precision, kind", [("float64", "param"), ("mixed", "param"),
                                             ("mixed", "master")])
def test_export_loads_with_safetensors_equal_to_the_engine(saved: dict, tmp_path: Path,
                                                            precision: str, kind: str,
                                                            capsys) -> None:
    out = tmp_path / "model.safetensors"
    code, text, err = call(capsys, "export", saved[precision]["root"], out, "--kind", kind)
    assert code == 0 and err == ""
    want = saved[precision]["params" if kind == "param" else "master"]
    assert text.startswith(f"wrote {out}: {len(want)} tensors, ")
    got = load_file(str(out))
    assert bits(got) == bits(want)  # names, dtypes, shapes, every bit
    assert {v.dtype for v in got.values()} == {np.dtype(
        {"float64": "float64", "mixed": BF16 if kind == "param" else "float32"}[precision])}
    if kind == "master":  # the bfloat16 parameters are the master weights rounded
        params = saved[precision]["params"]
        assert all(v.astype(BF16).tobytes() == params[n].tobytes() for n, v in got.items())
    with safe_open(str(out), "np") as f:
        meta = f.metadata()
    assert meta["step"] == "4" and meta["kind"] == kind and meta["precision"] == precision
    assert json.loads(meta["model"]) == checkpoint.describe(SPEC)["model"]
    assert "format" not in meta  # transformers reads that key as the framework ("pt")


def test_export_refuses_without_writing(saved: dict, tmp_path: Path, capsys) -> None:
    root = saved["float64"]["root"]
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"keep")
    assert "m.safetensors exists; --force replaces it" in refused(capsys, "export", root, out)
    assert out.read_bytes() == b"keep"
    assert "holds no master arrays" in refused(capsys, "export", root, out, "--force",
                                               "--kind", "master")
    assert out.read_bytes() == b"keep"
    assert call(capsys, "export", root, out, "--force")[0] == 0
    assert bits(load_file(str(out))) == bits(saved["float64"]["params"])
    # a damaged checkpoint: one line naming the file, nothing written
    bad = shutil.copytree(checkpoint.step_dir(root, 4), tmp_path / "bad" / "step_00000004")
    shard = bad / "shard_00000_of_00001.npz"
    shard.write_bytes(shard.read_bytes()[:-10])
    new = tmp_path / "new.safetensors"
    line = refused(capsys, "export", bad, new)
    assert line.startswith(f"minipar checkpoint export: {shard} does not match the manifest's "
                           "SHA-256")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "m.safetensors"]


def test_info_refuses_a_damaged_or_partial_checkpoint(saved: dict, tmp_path: Path,
                                                      capsys) -> None:
    root = shutil.copytree(saved["float64"]["root"], tmp_path / "c")
    only_partial = tmp_path / "p"
    shutil.copytree(root / "step_00000006", only_partial / "step_00000006")
    assert refused(capsys, "info", only_partial) == (
        f"minipar checkpoint info: no complete checkpoint (step_*/manifest.json) under "
        f"{only_partial}: step_00000006 partial (no manifest.json: a save that did not "
        "finish), ignored")
    assert "has no manifest.json: the save was interrupted" in refused(
        capsys, "info", root / "step_00000006")
    shard = root / "step_00000004" / "shard_00000_of_00001.npz"
    raw = bytearray(shard.read_bytes())
    raw[-50] ^= 1
    shard.write_bytes(bytes(raw))
    assert f"{shard} does not match the manifest's SHA-256" in refused(capsys, "info", root)
    (root / "step_00000002" / "manifest.json").write_text("{\"format\": ")
    assert "step_00000002/manifest.json is damaged: not JSON" in refused(
        capsys, "info", root / "step_00000002")


# -- the format -------------------------------------------------------------------

TENSORS = {
    "f64": np.arange(12, dtype=np.float64).reshape(3, 4) / 7,
    "f32": np.linspace(-1, 1, 5, dtype=np.float32),
    "f16": np.array([[1.5, -2.25, 65504.0]], dtype=np.float16),
    "bf16": np.array([1 / 3, -7.0, 3e38], dtype=np.float32).astype(BF16),
    "i64": np.array([-(2**62), 0, 2**62 + 5], dtype=">i8"),  # big-endian in: little on disk
    "scalar": np.array(2.5),
    "empty": np.zeros((0, 3), dtype=np.float32),
}


def test_what_minipar_writes_the_library_reads(tmp_path: Path) -> None:
    raw = safetensors_io.encode(TENSORS, {"step": "4"})
    (tmp_path / "t.safetensors").write_bytes(raw)
    got = load_file(str(tmp_path / "t.safetensors"))
    assert set(got) == set(TENSORS)
    for name, want in TENSORS.items():
        assert got[name].shape == want.shape and got[name].dtype == want.dtype.newbyteorder("=")
        assert got[name].tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes()
    with safe_open(str(tmp_path / "t.safetensors"), "np") as f:
        assert f.metadata() == {"step": "4"}
    # the layout: an 8-byte little-endian length, a JSON header padded with spaces to a
    # multiple of 8, tensors by element size (largest first), each aligned to its size
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8:8 + n]
    assert n % 8 == 0 and text.rstrip(b" ").endswith(b"}") and text.startswith(b"{")
    header = json.loads(text)
    assert header.pop("__metadata__") == {"step": "4"}
    order = sorted(header, key=lambda k: header[k]["data_offsets"])
    assert order == ["f64", "i64", "scalar", "f32", "empty", "f16", "bf16"]
    for name in order:
        begin, _ = header[name]["data_offsets"]
        assert (8 + n + begin) % np.dtype(safetensors_io.DTYPES[header[name]["dtype"]]).itemsize == 0


def test_what_the_library_writes_minipar_reads(tmp_path: Path) -> None:
    arrays = {k: np.ascontiguousarray(v.astype(v.dtype.newbyteorder("="))) for k, v in
              TENSORS.items() if k != "bf16"}  # the library's numpy API has no bfloat16
    save_file(arrays, str(tmp_path / "lib.safetensors"), metadata={"who": "safetensors"})
    got, meta = safetensors_io.decode((tmp_path / "lib.safetensors").read_bytes())
    assert meta == {"who": "safetensors"}
    assert bits(got) == bits(arrays)
    back, _ = safetensors_io.decode(safetensors_io.encode(TENSORS))
    assert bits(back) == bits({k: v.astype(v.dtype.newbyteorder("=")) for k, v in TENSORS.items()})


def test_bad_tensors_and_bad_files_are_one_line() -> None:
    for tensors, words in (({"z": np.zeros(2, np.complex128)}, "complex128 is not one of"),
                           ({"b": np.zeros(2, bool)}, "bool is not one of"),
                           ({"": np.zeros(2)}, "non-empty string"),
                           ({"__metadata__": np.zeros(2)}, "other than")):
        with pytest.raises(ValueError, match=words):
            safetensors_io.encode(tensors)
    with pytest.raises(ValueError, match="metadata must map str to str"):
        safetensors_io.encode({"a": np.zeros(2)}, {"step": 4})  # type: ignore[dict-item]
    raw = safetensors_io.encode({"a": np.zeros(4), "b": np.ones(2)})
    for damaged, words in ((raw[:5], "shorter than the 8-byte"),
                           (raw[:-8], "the tensors cover 48 bytes, the data holds 40"),
                           (raw + b"\0" * 8, "cover 48 bytes, the data holds 56"),
                           (struct.pack("<Q", 10**9) + raw[8:], "exceeds the file"),
                           (raw[:8] + b"[" + raw[9:], "not JSON"),
                           (raw.replace(b'"F64"', b'"C64"', 1), "'C64', not one of"),
                           (raw.replace(b"[32,48]", b"[40,56]"), "a hole or an overlap")):
        with pytest.raises(ValueError, match=words) as e:
            safetensors_io.decode(damaged)
        assert "\n" not in str(e.value)
