"""Checkpoints of any engine: every rank saves what it holds, any layout loads it.

EN distributed checkpoint · RU распределённая контрольная точка · ZH 分布式检查点

Not to be confused with *activation* checkpointing (Chen et al. 2016,
arXiv 1604.06174; "remat"), which saves no file at all: it keeps a few layer
inputs during the forward pass and recomputes the rest in the backward pass
to save memory (built in :mod:`minipar.parallel.remat`; glossary term
``activation-checkpointing``).  This module saves the *training state* to
disk so that a run can stop and resume.

It works through the engine interface only (:class:`minipar.parallel.engine.Engine`):
``engine.state_dict()`` gives every array a rank holds with its
:class:`~minipar.parallel.engine.Shard` — the serial tensor it is part of and
the pieces of it, e.g. a ZeRO rank's flat range cut per tensor, a tensor-parallel
rank's column groups — so one module serves every strategy.  Megatron's
``dist_checkpointing``, nanotron's sharded tensors, PyTorch's Distributed
Checkpoint (``torch.distributed.checkpoint``) and DeepSpeed's universal
checkpoints work the same way.

Layout on disk (a directory per step; every rank sees the same filesystem)::

    ROOT/step_00000002/shard_00000_of_00004.npz   rank 0's arrays of replica 0 (params,
                      /shard_00001_of_00004.npz   master weights, optimizer moments),
                      /...                        with their Shards and the rank's scalars
                      /manifest.json              written LAST, by rank 0

Each rank writes the arrays of its state whose ``replica`` is 0 (a data-parallel
copy is saved once), an index of their Shards and the state's scalars (step,
optimizer step count and hyperparameters, loss scale).  The manifest lists every
file with its SHA-256 and index, the serial tensors (names and global shapes) and,
when ``spec`` is given, the model, precision and optimizer.

**Atomicity.**  Every file is written to a temporary name, flushed,
``fsync``-ed and renamed with ``os.replace`` (atomic on POSIX), then its
directory is fsync-ed.  Rank 0 writes the manifest only after a barrier,
i.e. after every file is durable.  A checkpoint *exists* exactly when its
manifest does: a crash while saving leaves a directory without a manifest,
which :func:`latest` skips and :func:`load` refuses, so the previous
checkpoint stays the one to resume.  A full disk is such a crash that can
speak: ``write(2)`` fails with ``ENOSPC`` (or ``EFBIG`` past a size limit),
the temporary file is removed and :func:`save` raises one line naming the
file and the reason; no manifest is written, and the earlier step directories
are never touched (each step has its own).

**Refusals change nothing.**  :func:`load` reads and checks everything —
the manifest (JSON, its keys, one file per rank), the model and settings, the
SHA-256 of every file it needs — before the engine's ``load_state_dict`` is
called, so a checkpoint that is missing, partial, damaged or of another
model is one line (:class:`CheckpointError`) and the engine is as it was.

**Any layout resumes any other.**  :func:`load` asks the engine for its own
state (what it holds, where in the global tensors), opens only the files holding
an overlapping piece (each verified against its SHA-256) and hands them to
``engine.load_state_dict``, which reads, for each local piece, the overlapping
saved pieces (:func:`~minipar.parallel.engine.read_region`,
:func:`~minipar.parallel.engine.load_pieces`): save on 4 ranks under ZeRO-2,
resume on 3 under ZeRO-3, or :func:`consolidate` into one ``.npz`` of the full
parameter dict that the serial ``GPT`` loads, or :func:`export` it as a
safetensors file (:mod:`minipar.safetensors_io`) that other tools read;
:func:`summary` is what ``minipar checkpoint info`` shows.

**What the tests check** (tests/test_checkpoint.py): resuming on the same
ranks continues bit-identically to an uninterrupted run; resuming on another
number of ranks or another stage equals it within the float64 parity
tolerance (a ZeRO-2 checkpoint of 4 ranks resumed on 2: the parameters exactly
the saved ones); a crash before the manifest leaves the previous checkpoint
loadable; a full disk (ENOSPC injected at ``os.write``) and a real file-size
limit (RLIMIT_FSIZE) while saving are one line and keep the previous
checkpoint; another model, precision or optimizer is refused with a message
naming what differs; a damaged, truncated or missing file and a damaged
manifest are named, and the engine is left unchanged; the consolidated file
equals the trained parameters, and the exported safetensors file, read by the
``safetensors`` library, equals ``full_params()`` bit for bit
(tests/test_checkpoint_cli.py too).  The drills run on 4 and 8 ranks through the
launcher and ``loop.fit`` (tests/test_drills.py): a rank killed by SIGKILL after a
checkpoint, or after its file and before the manifest, is named in one line, and the
run resumed from the folder continues to the bit (float64 and float32; also
``minipar run`` killed from outside); a checkpoint of ZeRO-3 or DDP resumes as
dp2 x tp2 x pp2, TP 2 and PP 2 within the parity verdict; a file-size limit on one
rank (its shard, or rank 0's manifest) is one line and leaves the previous checkpoint
as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from minipar.backend import to_host
from minipar.data import corpus
from minipar.nn.dtypes import as_dtype
from minipar.parallel.engine import Piece, Shard, State, assemble

MANIFEST = "manifest.json"
FORMAT = "minipar-checkpoint/2"
INDEX = "__index__"  # the member of a rank's .npz holding its Shards and scalars (JSON)
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, corrupt, or of another model or setting."""


def layout_hash(names: Any, shapes: Any) -> str:
    """SHA-256 of the serial tensors: names and global shapes, in order."""
    text = json.dumps([[n, list(s)] for n, s in zip(names, shapes)])
    return hashlib.sha256(text.encode()).hexdigest()


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"step_{int(step):08d}"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file, fsync, rename over ``path``, fsync the directory.

    ``os.write`` may write less than it is given: the loop writes the rest.  If the
    disk fills (``ENOSPC``), a size limit is hit (``EFBIG``) or anything else fails,
    the temporary file is removed and ``path`` is as it was: :class:`CheckpointError`
    ``cannot write PATH: No space left on device``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)  # a full disk may only show here, or at close
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write {path}: {e.strerror or e}") from e
        raise


def _to_disk(a: np.ndarray) -> np.ndarray:
    """.npz has no bfloat16: store its bits as uint16 (the index records the dtype)."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _dtype(name: str) -> np.dtype:
    return as_dtype(name)


def _slices(sl: tuple[slice, ...]) -> list[list[int]]:
    return [[s.start, s.stop] for s in sl]


def _unslices(pairs: list[list[int]]) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in pairs)


def describe(spec: Any) -> dict[str, Any]:
    """What must match for a checkpoint to load (model, precision, optimizer) of a
    :class:`~minipar.parallel.common.RunSpec`."""
    model = {k: v for k, v in asdict(spec.config()).items() if k != "dtype"}
    out = {"model": model, "precision": spec.precision, "optimizer": spec.optimizer}
    if hasattr(spec, "weight_decay"):  # what a resume must not change (a new --lr may)
        out["optimizer_settings"] = {"weight_decay": spec.weight_decay}
        if spec.optimizer == "adamw":
            out["optimizer_settings"].update(betas=list(spec.betas), eps=spec.eps)
    if hasattr(spec, "describe_data"):  # the data a resume must see again (RunSpec)
        out["data"] = spec.describe_data()
    return out


#: what of the data must be the same for a resume to see the batches the run would have
DATA_KEYS = ("task", "batch", "seq", "data_seed", "sha256")

#: the model's fields as the command line spells them (``minipar train``, ``minipar run``),
#: so that a refused resume names the option to change; the others keep their field names
MODEL_OPTIONS = {"vocab_size": "--vocab", "block_size": "--seq", "n_layer": "--layers",
                 "n_head": "--heads", "n_kv_head": "--kv-heads", "d_model": "--d-model",
                 "n_experts": "--experts",
                 "top_k": "--top-k", "capacity_factor": "--capacity-factor",
                 "aux_loss_coef": "--aux-loss-coef"}


class OneProcess:
    """The communicator of a run without MPI (``minipar train``): rank 0 of 1, a barrier
    that has no one to wait for.  :func:`save` takes it like an MPI communicator."""

    rank, size = 0, 1

    def Barrier(self) -> None:  # MPI spells it so
        pass


def _file_name(rank: int, size: int) -> str:
    return f"shard_{rank:05d}_of_{size:05d}.npz"


def save(engine: Any, root: str | os.PathLike[str], comm: Any, *, spec: Any = None,
         on_shard_written: Callable[[Path], None] | None = None) -> Path:
    """Every rank of ``comm`` writes the replica-0 arrays of ``engine.state_dict()``
    after its ``step`` steps; rank 0 then writes the manifest.  Collective: call it on
    every rank (``comm``: the engine's ranks, e.g. ``grid.world``).  ``spec``: the run's
    :class:`~minipar.parallel.common.RunSpec`, recorded so that :func:`load` can name
    what differs.  ``on_shard_written(path)`` runs after this rank's file is durable,
    before the barrier (tests use it to simulate a crash).  Returns the directory."""
    state = engine.state_dict()
    d = step_dir(root, state.scalars["step"])
    if (d / MANIFEST).exists():  # checked on every rank before any message
        raise CheckpointError(f"{d} already holds a complete checkpoint; checkpoints are "
                              "immutable: save under another root or remove it first")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create {d}: {e.strerror or e}") from e
    arrays, index = {}, []
    for (kind, name), (shard, arr) in state.arrays.items():
        if shard.replica != 0:
            continue
        host = np.ascontiguousarray(to_host(arr))
        key = f"a{len(index)}"
        arrays[key] = _to_disk(host)
        index.append({"key": key, "kind": kind, "name": name, "dtype": str(host.dtype),
                      "global_shape": list(shard.global_shape),
                      "pieces": [[_slices(p.local), _slices(p.global_)] for p in shard.pieces]})
    blob = json.dumps({"arrays": index, "scalars": state.scalars}).encode()
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{INDEX: np.frombuffer(blob, dtype=np.uint8)})
    name = _file_name(comm.rank, comm.size)
    _write_part(d, name, buf.getvalue())
    if on_shard_written is not None:
        on_shard_written(d / name)
    comm.Barrier()  # every file is durable
    if comm.rank == 0:
        _write_part(d, MANIFEST, json.dumps(_manifest(d, comm.size, spec), indent=1).encode())
    comm.Barrier()  # nobody returns before the checkpoint exists
    return d


def _write_part(d: Path, name: str, data: bytes) -> None:
    """One file of the checkpoint in ``d``; a failure says that ``d`` does not count.

    A rank that fails raises; the others wait at the barrier until the launcher
    (``python -m mpi4py``) ends the job, and no manifest is written."""
    try:
        _atomic_write(d / name, data)
    except CheckpointError as e:
        raise CheckpointError(f"{e}; {d.name} has no {MANIFEST}, so it is partial and ignored: "
                              "the previous checkpoint is untouched") from e.__cause__


def _manifest(d: Path, size: int, spec: Any) -> dict[str, Any]:
    """The manifest of the ``size`` files in ``d`` (rank 0, after the barrier)."""
    files, tensors, dtypes, scalars = [], {}, {}, {}
    for r in range(size):
        raw = (d / _file_name(r, size)).read_bytes()
        with np.load(io.BytesIO(raw)) as z:
            idx = json.loads(z[INDEX].tobytes())
        files.append({"file": _file_name(r, size), "sha256": hashlib.sha256(raw).hexdigest(),
                      "bytes": len(raw), "arrays": idx["arrays"]})
        for a in idx["arrays"]:
            tensors.setdefault(a["name"], a["global_shape"])
            dtypes.setdefault(a["kind"], a["dtype"])
        for k, v in idx["scalars"].items():
            scalars.setdefault(k, v)
    names = list(tensors)
    if spec is not None:  # the serial model's order, for consolidate
        order = list(spec.model().param_shapes())
        names = [n for n in order if n in tensors] + [n for n in names if n not in order]
    return {"format": FORMAT, **(describe(spec) if spec is not None else {}),
            "step": scalars.get("step"), "world_size": size,
            "tensors": {n: tensors[n] for n in names},
            "layout_sha256": layout_hash(names, [tensors[n] for n in names]),
            "dtypes": dtypes, "scalars": scalars, "files": files}


def scan(root: str | os.PathLike[str]) -> tuple[list[Path], list[Path]]:
    """(complete, partial): the ``step_*`` directories under ``root``, oldest first; a
    partial one has no manifest (a save that did not finish) and is ignored."""
    root = Path(root)
    found = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else [])
                   if (m := _STEP_DIR.match(p.name)) and p.is_dir())
    complete = [p for _, p in found if (p / MANIFEST).exists()]
    return complete, [p for _, p in found if not (p / MANIFEST).exists()]


def prune(root: str | os.PathLike[str], keep_last: int,
          spare: tuple[str | os.PathLike[str], ...] = ()) -> list[Path]:
    """Remove all but the newest ``keep_last`` complete checkpoints under ``root`` (one
    process: rank 0, after its manifest is written), except those in ``spare`` (the one
    this run resumed from: the serial check loads it after the run); returns the removed
    folders, oldest first.  Partial folders (a save that did not finish) are left for a
    person to look at."""
    import shutil

    complete, _ = scan(root)
    kept = {Path(p).resolve() for p in spare}
    old = [p for p in (complete[:-keep_last] if keep_last > 0 else [])
           if p.resolve() not in kept]
    for p in old:
        (p / MANIFEST).unlink()  # first: a folder half removed is partial, never "complete"
        shutil.rmtree(p)
    return old


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint (one with a manifest) under ``root``, or None."""
    complete, _ = scan(root)
    return complete[-1] if complete else None


#: what every manifest holds (a manifest without one of them is damaged)
MANIFEST_KEYS = ("format", "step", "world_size", "tensors", "dtypes", "scalars", "files")


def read_manifest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """(directory, manifest) of a checkpoint directory, or of the latest one under a root.

    :class:`CheckpointError`, one line naming the path, when it does not exist, is a
    file, holds only partial checkpoints or none, or its manifest is unreadable or
    incomplete (a manifest is written whole, atomically: a damaged one is not an
    interrupted save)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p} does not exist")
    if not p.is_dir():
        raise CheckpointError(f"{p} is a file; a checkpoint is a folder (step_*/ holding "
                              f"{MANIFEST}) or a root holding such folders")
    if not (p / MANIFEST).exists():
        if _STEP_DIR.match(p.name):
            raise CheckpointError(f"{p} has no {MANIFEST}: the save was interrupted before it "
                                  "completed; give an earlier step_* folder, or the folder "
                                  "above it (its latest complete checkpoint)")
        complete, partial = scan(p)
        if not complete:
            ignored = (f": {', '.join(q.name for q in partial)} partial (no {MANIFEST}: a save "
                       "that did not finish), ignored" if partial else "")
            raise CheckpointError(f"no complete checkpoint (step_*/{MANIFEST}) under {p}{ignored}")
        p = complete[-1]
    mf = p / MANIFEST
    try:
        m = json.loads(mf.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(f"cannot read {mf}: {e.strerror or e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{mf} is damaged: not JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        got = m.get("format") if isinstance(m, dict) else type(m).__name__
        raise CheckpointError(f"{p}: not a minipar checkpoint (format {got!r}, "
                              f"expected {FORMAT!r})")
    missing = [k for k in MANIFEST_KEYS if k not in m]
    size = m.get("world_size")
    if not missing and not (isinstance(size, int) and size >= 1 and [
            f.get("file") if isinstance(f, dict) else None for f in m["files"]] == [
            _file_name(r, size) for r in range(size)]):
        missing = [f"the list of {size} files (one per rank) of its world size"]
    if missing:
        raise CheckpointError(f"{mf} is damaged: it lacks {', '.join(missing)}")
    return p, m


def _shard(a: dict[str, Any]) -> Shard:
    return Shard(a["name"], tuple(a["global_shape"]),
                 tuple(Piece(_unslices(lo), _unslices(gl)) for lo, gl in a["pieces"]))


def _verified(d: Path, f: dict[str, Any]) -> bytes:
    """The bytes of one file of the manifest, checked against its SHA-256 (and size)."""
    path = d / f["file"]
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing (the manifest lists it): the checkpoint is "
                              "damaged") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from e
    if hashlib.sha256(raw).hexdigest() != f["sha256"]:
        size = f.get("bytes")
        sizes = f" ({len(raw):,} bytes, saved {size:,})" if size not in (None, len(raw)) else ""
        raise CheckpointError(f"{path} does not match the manifest's SHA-256{sizes}: the "
                              "checkpoint is damaged")
    return raw


def verify(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """:func:`read_manifest`, then every file checked against its SHA-256 (reads them all)."""
    d, m = read_manifest(path)
    for f in m["files"]:
        _verified(d, f)
    return d, m


def _read_file(d: Path, f: dict[str, Any], scalars: dict[str, Any]) -> State:
    """The :class:`State` saved in one file of the manifest, verified against its SHA-256."""
    raw = _verified(d, f)
    st = State(scalars=dict(scalars))
    with np.load(io.BytesIO(raw)) as z:
        for a in f["arrays"]:
            st.arrays[(a["kind"], a["name"])] = (_shard(a), z[a["key"]].view(_dtype(a["dtype"])))
    return st


def _overlaps(a: tuple[slice, ...], b: tuple[slice, ...]) -> bool:
    return all(max(x.start, y.start) < min(x.stop, y.stop) for x, y in zip(a, b))


def _needed(target: State, m: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's files holding a piece that overlaps one of ``target``'s."""
    want: dict[tuple[str, str], list[tuple[slice, ...]]] = {}
    for key, (shard, _) in target.arrays.items():
        want.setdefault(key, []).extend(p.global_ for p in shard.pieces)
    out = []
    for f in m["files"]:
        for a in f["arrays"]:
            mine = want.get((a["kind"], a["name"]), [])
            if any(_overlaps(g, _unslices(gl)) for _, gl in a["pieces"] for g in mine):
                out.append(f)
                break
    return out


def _spec_diffs(d: Path, m: dict[str, Any], spec: Any) -> list[str]:
    """What differs between a checkpoint's recorded run and ``spec`` (model, precision,
    optimizer), each named by its option (``--seq: checkpoint 16, this run 8``);
    CheckpointError at once when the data differ (another task or text, batch, sequence
    length or data seed) — the task first, since it also changes the vocabulary."""
    if spec is None or "model" not in m:
        return []
    want = describe(spec)
    saved, now = m.get("data"), want.get("data")
    if saved is not None and now is not None and saved.get("task") != now.get("task"):
        _refuse_data(d, [_data_diff("task", saved, now)])
    model = {"n_kv_head": m["model"].get("n_head"), **m["model"]}  # older: no GQA, K = H
    diffs = [f"{MODEL_OPTIONS.get(k, k)}: checkpoint {model.get(k)!r}, this run {v!r}"
             for k, v in want["model"].items() if model.get(k) != v
             and not (k == "d_ff" and model.get("d_model") != want["model"]["d_model"])]
    for key in ("precision", "optimizer"):
        if m[key] != want[key]:
            diffs.append(f"--{key}: checkpoint {m[key]!r}, this run {want[key]!r}")
    was, now_opt = m.get("optimizer_settings"), want.get("optimizer_settings")
    if not diffs and was is not None and now_opt is not None:  # older manifests: not recorded
        diffs += [f"--{k.replace('_', '-')}: checkpoint {_plain(was.get(k))}, this run "
                  f"{_plain(v)} (give --{k.replace('_', '-')} {_plain(was.get(k), ' ')} to "
                  "continue it; a new --lr is allowed)"
                  for k, v in now_opt.items() if was.get(k) != v]
    if not diffs and saved is not None and now is not None:
        _refuse_data(d, [_data_diff(k, saved, now) for k in DATA_KEYS
                         if saved.get(k) != now.get(k)])
    return diffs


def _plain(v: Any, sep: str = ", ") -> str:
    """An option's value as the command line writes it: 0.01, or 0.9 0.999 (betas)."""
    return sep.join(f"{x:g}" for x in v) if isinstance(v, list) else f"{v:g}"


def _refuse_data(d: Path, data: list[str]) -> None:
    if data:
        raise CheckpointError(f"{d} was trained on other data; a resume must see the "
                              "batches the run would have seen: " + "; ".join(data))


def _refuse(d: Path, diffs: list[str]) -> None:
    if diffs:
        raise CheckpointError(f"{d} is a checkpoint of another model or setting; refusing to "
                              "load it: " + "; ".join(diffs))


def check_resume(path: str | os.PathLike[str], spec: Any) -> tuple[Path, dict[str, Any]]:
    """(directory, manifest) of the checkpoint a run of ``spec`` resumes from, checked
    before any engine is built or any rank started: complete, the same model, precision,
    optimizer and data, and short of ``spec.steps`` (the total).  CheckpointError: one
    line naming what is wrong (a damaged file too: every file is checked against its
    SHA-256 here, so that no rank starts on a checkpoint it cannot read)."""
    d, m = verify(path)
    _refuse(d, _spec_diffs(d, m, spec))
    step = int(m.get("step") or 0)
    if step >= spec.steps:
        raise CheckpointError(f"{d} is at step {step}, and --steps {spec.steps} is the total, "
                              f"not the steps to add: give --steps > {step} to train on")
    return d, m


def _check_compatible(target: State, d: Path, m: dict[str, Any], spec: Any) -> None:
    diffs = _spec_diffs(d, m, spec)
    mine = {name: shard.global_shape for (_, name), (shard, _) in target.arrays.items()}
    theirs = {n: tuple(s) for n, s in m["tensors"].items()}
    if not diffs and any(theirs.get(n) != s for n, s in mine.items()):
        diffs.append("the parameter layout (names and shapes) differs")
    opt = target.scalars.get("optimizer")
    if not diffs and opt is not None and m["scalars"].get("optimizer", opt) != opt:
        diffs.append(f"optimizer: checkpoint {m['scalars']['optimizer']}, this run {opt}")
    _refuse(d, diffs)
    kinds = {k for k, _ in target.arrays}
    if not kinds <= set(m["dtypes"]):
        raise CheckpointError(f"{d} holds {sorted(m['dtypes'])}, this run needs {sorted(kinds)}")
    for (kind, name), (_, arr) in target.arrays.items():
        if str(arr.dtype) != m["dtypes"][kind]:
            raise CheckpointError(f"{d} holds {kind} in {m['dtypes'][kind]}, this run in "
                                  f"{arr.dtype}: another precision")


def _task(data: dict[str, Any]) -> str:
    """The task of a recorded ``data`` as a sentence says it."""
    if data.get("task") == "text":
        return f"the text {data.get('name')}"
    return "the modular-sum task" if data.get("task") == "modular_sum" else repr(data.get("task"))


def _data_diff(key: str, saved: dict[str, Any], now: dict[str, Any]) -> str:
    """One difference of the recorded data (``saved``) and this run's (``now``), named
    by its option."""
    if key == "task":
        hint = ""
        if saved.get("task") == "text":
            same = "" if saved.get("name") == corpus.NAME else f" {saved.get('name')}"
            hint = f" (give --text{same}, as the saved run did)"
        return f"--text: checkpoint on {_task(saved)}, this run on {_task(now)}{hint}"
    if key == "sha256":
        name = now.get("name")
        sha = f"SHA-256 {str(saved.get(key))[:12]}… then, {str(now.get(key))[:12]}… now"
        if saved.get("name") != name:
            return f"--text: checkpoint {saved.get('name')}, this run {name} ({sha})"
        why = ": it changes whenever minipar's docs do" if name == corpus.NAME else ""
        return f"--text: {name} changed since the save ({sha}){why}"
    option = {"batch": "--batch", "seq": "--seq", "data_seed": "--data-seed"}[key]
    return f"{option}: checkpoint {saved.get(key)!r}, this run {now.get(key)!r}"


def load(engine: Any, path: str | os.PathLike[str], *, spec: Any = None) -> dict[str, Any]:
    """Fill ``engine`` (any strategy, any layout) from a checkpoint; returns its manifest.

    ``path`` is a checkpoint directory or a root (its latest complete checkpoint);
    ``spec``: this run's RunSpec, compared with the saved one.  Every rank reads the
    files that hold pieces it needs; no communication.  Continue training at step
    ``manifest["step"]`` (the data of step s is a function of s)."""
    d, m = read_manifest(path)
    target = engine.state_dict()
    _check_compatible(target, d, m, spec)
    sources = [State(scalars=dict(m["scalars"]))]
    sources += [_read_file(d, f, m["scalars"]) for f in _needed(target, m)]
    engine.load_state_dict(sources)
    return m


def full_tensors(path: str | os.PathLike[str], kind: str | None = None
                 ) -> tuple[Path, dict[str, Any], dict[str, np.ndarray]]:
    """(directory, manifest, {serial name: whole tensor}) of one ``kind`` of array
    (``param``, ``master``, ``exp_avg``, ...), assembled from every file's pieces
    (:func:`~minipar.parallel.engine.assemble`), in the manifest's order (the serial
    model's when saved with its spec).  ``kind=None``: the precise copy, the fp32
    master weights under mixed precision (the 16-bit parameters are their
    rounding), the parameters otherwise.  A tensor held only as a ``buffer`` (the loss-free
    expert bias) is given whole too, whatever ``kind``."""
    d, m = read_manifest(path)
    if kind is None:
        kind = "master" if "master" in m["dtypes"] else "param"
    if kind not in m["dtypes"]:
        raise CheckpointError(f"{d} holds no {kind} arrays (it holds "
                              f"{', '.join(sorted(m['dtypes']))})")
    sources = [_read_file(d, f, m["scalars"]) for f in m["files"]]
    # state that is not a parameter (the loss-free expert bias, kind "buffer") comes along:
    # the model routes with it
    buffers = {n for s in sources for k, n in s.arrays if k == "buffer"}
    return d, m, {n: assemble(sources, "buffer" if n in buffers else kind, n, tuple(s))
                  for n, s in m["tensors"].items()}


def consolidate(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write one ``.npz`` with the full parameter dict {name: array}: :func:`full_tensors`
    of the precise copy (fp32 master weights under mixed precision)."""
    _, _, params = full_tensors(path)
    buf = io.BytesIO()
    np.savez(buf, **params)
    out = Path(out)
    _atomic_write(out, buf.getvalue())
    return out


def export(path: str | os.PathLike[str], out: str | os.PathLike[str],
           kind: str = "param") -> Path:
    """Write the whole tensors of ``kind`` under their serial names as a safetensors file
    (:mod:`minipar.safetensors_io`), atomically; other tools read it (``safetensors``,
    PyTorch, JAX).  ``kind="param"``: what ``full_params()`` returns (bfloat16 under
    mixed precision); ``"master"``: the fp32 master weights.  The header's metadata
    (str -> str) records the checkpoint: its step, the kind, and the model,
    precision and optimizer as JSON (no ``format`` key: transformers reads that one
    as the framework)."""
    _, m, tensors = full_tensors(path, kind)
    meta = {"minipar_checkpoint": m["format"], "step": str(m["step"]), "kind": kind,
            "saved_world_size": str(m["world_size"])}
    meta.update({k: m[k] if isinstance(m[k], str) else json.dumps(m[k])
                 for k in ("model", "precision", "optimizer") if k in m})
    out = Path(out)
    from minipar import safetensors_io  # loads ml_dtypes (bfloat16): only for an export

    _atomic_write(out, safetensors_io.encode(tensors, meta))
    return out


def summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``minipar checkpoint info`` shows, every file verified (SHA-256): the checkpoint
    (of ``path``, or the latest under a root), its model, precision, optimizer and state,
    the world size it was saved on, its files with sizes, the serial tensors and their
    parameters; for a root, its complete and partial (ignored) step directories."""
    p = Path(path)
    d, m = verify(p)
    listed = {f["file"] for f in m["files"]} | {MANIFEST}
    files = [{"file": f["file"], "bytes": (d / f["file"]).stat().st_size, "sha256": f["sha256"]}
             for f in m["files"]]
    files.append({"file": MANIFEST, "bytes": (d / MANIFEST).stat().st_size})
    out: dict[str, Any] = {
        "path": str(d), "format": m["format"], "step": m["step"],
        "model": m.get("model"), "data": m.get("data"), "precision": m.get("precision"),
        "optimizer": m.get("optimizer") or m["scalars"].get("optimizer"),
        "optimizer_state": {k.split(".", 1)[1]: v for k, v in m["scalars"].items()
                            if k.startswith("optimizer.")},
        "world_size": m["world_size"], "dtypes": m["dtypes"],
        "tensors": len(m["tensors"]),
        "params": sum(math.prod(s) for s in m["tensors"].values()),
        "files": files, "bytes": sum(f["bytes"] for f in files), "verified": "sha256",
        "not_in_manifest": sorted(q.name for q in d.iterdir() if q.name not in listed),
        "scalars": m["scalars"],
    }
    if d != p:  # a root: what else is there
        complete, partial = scan(p)
        out["checkpoints"] = [q.name for q in complete]
        out["partial"] = [{"dir": q.name, "shard_files": sorted(x.name for x in q.glob("shard_*"))}
                          for q in partial]
    return out


def load_consolidated(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The parameter dict of a consolidated ``.npz``, in the file's (the model's) order."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}
