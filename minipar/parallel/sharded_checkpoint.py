"""Sharded checkpoints of ZeRO training: save by shard, load on any number of ranks.

EN sharded checkpoint · RU шардированная контрольная точка · ZH 分片检查点

Not to be confused with *activation* checkpointing (Chen et al. 2016,
arXiv 1604.06174; "remat"), which saves no file at all: it keeps a few layer
inputs during the forward pass and recomputes the rest in the backward pass
to save memory (built in :mod:`minipar.parallel.remat`; glossary term
``activation-checkpointing``).  This module saves the *training state* to
disk so that a run can stop and resume; hence the name ``sharded_checkpoint``.

Under ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054) no rank holds the whole
model state, so no rank can write the whole checkpoint: each rank writes the
slice it owns, ``[lo_r, hi_r)`` of the flat buffer (``numpy.array_split``
rule, the same for every stage), and a manifest ties the slices together.
PyTorch's Distributed Checkpoint (``torch.distributed.checkpoint``) and
DeepSpeed's universal checkpoints work the same way.

Layout on disk (a directory per step; every rank sees the same filesystem)::

    ROOT/step_00000002/shard_00000_of_00004.npz   rank 0's slice: params, master
                      /shard_00001_of_00004.npz   weights, optimizer moments
                      /...
                      /manifest.json              written LAST, by rank 0

**Atomicity.**  Every file is written to a temporary name, flushed,
``fsync``-ed and renamed with ``os.replace`` (atomic on POSIX), then its
directory is fsync-ed.  Rank 0 writes the manifest only after a barrier,
i.e. after every shard is durable; it records each shard's range and SHA-256.
A checkpoint *exists* exactly when its manifest does: a crash while saving
leaves a directory without a manifest, which :func:`latest` skips and
:func:`load` refuses, so the previous checkpoint stays the one to resume.

**Resharding.**  The shards are contiguous ranges of one flat buffer, so a
run on M ranks rebuilds any range it needs from the overlapping old ranges:
save on 4 ranks, resume on 3, or consolidate into one ``.npz`` of the full
parameter dict (:func:`consolidate`) that the serial ``GPT`` loads.

**What the tests check** (tests/test_checkpoint.py): resuming on the same
ranks continues bit-identically to an uninterrupted run; resuming on another
number of ranks or another stage equals it within the float64 parity
tolerance; a crash before the manifest leaves the previous checkpoint
loadable; another model, precision or optimizer is refused with a message
naming what differs; the consolidated file equals the trained parameters.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from minipar.parallel.zero.shard import shard_range

MANIFEST = "manifest.json"
FORMAT = "minipar-zero-checkpoint/1"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, corrupt, or of another model or setting."""


def layout_hash(names: Any, shapes: Any) -> str:
    """SHA-256 of the flat buffer's layout: parameter names and shapes, in order."""
    text = json.dumps([[n, list(s)] for n, s in zip(names, shapes)])
    return hashlib.sha256(text.encode()).hexdigest()


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"step_{int(step):08d}"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _holdings(eng: Any) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (array this rank holds, index of its first element in the flat buffer)."""
    params = eng.params if eng.params is not None else eng.states.params
    out = {"params": (params, eng.param_range[0])}
    o0, opt = eng.opt_range[0], eng.states.optimizer
    if eng.states.master is not None:
        out["master"] = (eng.states.master, o0)
    for name in ("m", "v", "buf"):  # AdamW moments or SGD momentum
        if getattr(opt, name, None) is not None:
            out["opt." + name] = (getattr(opt, name), o0)
    return out


def _to_disk(a: np.ndarray) -> np.ndarray:
    """.npz has no bfloat16: store its bits as uint16 (the manifest records the dtype)."""
    return a.view(np.uint16) if a.dtype == np.dtype(ml_dtypes.bfloat16) else a


def _dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def describe(eng: Any) -> dict[str, Any]:
    """What must match for a checkpoint to load into ``eng`` (model, precision, optimizer)."""
    model = {k: v for k, v in asdict(eng.model.cfg).items() if k != "dtype"}
    return {"model": model, "precision": eng.policy.name, "psi": eng.layout.size,
            "layout_sha256": layout_hash(eng.layout.names, eng.layout.shapes),
            "optimizer": eng.optimizer_name}


def save(eng: Any, root: str | os.PathLike[str],
         on_shard_written: Callable[[Path], None] | None = None) -> Path:
    """Every rank writes its shard of ``eng`` (a :class:`~minipar.parallel.zero.engine.ZeRO`)
    after ``eng.step_count`` steps; rank 0 then writes the manifest.  Collective:
    call it on every rank.  ``on_shard_written(path)`` runs after this rank's shard
    is durable, before the barrier (tests use it to simulate a crash).
    Returns the checkpoint directory."""
    d = step_dir(root, eng.step_count)
    if (d / MANIFEST).exists():  # checked on every rank before any message
        raise CheckpointError(f"{d} already holds a complete checkpoint; checkpoints are "
                              "immutable: save under another root or remove it first")
    d.mkdir(parents=True, exist_ok=True)
    comm, (lo, hi) = eng.comm, eng.shard
    arrays = {k: _to_disk(a[lo - start: hi - start]) for k, (a, start) in _holdings(eng).items()}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    name = f"shard_{comm.rank:05d}_of_{comm.size:05d}.npz"
    _atomic_write(d / name, buf.getvalue())
    if on_shard_written is not None:
        on_shard_written(d / name)
    comm.Barrier()  # every shard is durable
    if comm.rank == 0:
        shards = []
        for r in range(comm.size):
            f = d / f"shard_{r:05d}_of_{comm.size:05d}.npz"
            a, b = shard_range(eng.layout.size, comm.size, r)
            shards.append({"file": f.name, "lo": a, "hi": b,
                           "sha256": hashlib.sha256(f.read_bytes()).hexdigest()})
        sc = eng.states.scaler
        manifest = {"format": FORMAT, **describe(eng), "step": eng.step_count,
                    "world_size": comm.size, "stage": eng.stage,
                    "names": list(eng.layout.names), "shapes": [list(s) for s in eng.layout.shapes],
                    "optimizer_t": eng.states.optimizer.t, "opt_kwargs": eng.opt_kwargs,
                    "scaler": None if sc is None else {"scale": sc.scale, "good_steps": sc.good_steps,
                                                       "skipped": sc.skipped},
                    "dtypes": {k: str(a.dtype) for k, (a, _) in _holdings(eng).items()},
                    "shards": shards}
        _atomic_write(d / MANIFEST, json.dumps(manifest, indent=1).encode())
    comm.Barrier()  # nobody returns before the checkpoint exists
    return d


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint (one with a manifest) under ``root``, or None."""
    root = Path(root)
    found = [(int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else [])
             if (m := _STEP_DIR.match(p.name)) and (p / MANIFEST).exists()]
    return max(found)[1] if found else None


def read_manifest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """(directory, manifest) of a checkpoint directory, or of the latest one under a root."""
    p = Path(path)
    if not (p / MANIFEST).exists():
        if _STEP_DIR.match(p.name):
            raise CheckpointError(f"{p} has no {MANIFEST}: the save was interrupted before it "
                                  "completed; load the previous checkpoint (checkpoint.latest)")
        found = latest(p)
        if found is None:
            raise CheckpointError(f"no complete checkpoint (step_*/{MANIFEST}) under {p}")
        p = found
    m = json.loads((p / MANIFEST).read_text())
    if m.get("format") != FORMAT:
        raise CheckpointError(f"{p}: not a minipar ZeRO checkpoint (format {m.get('format')!r})")
    return p, m


class _Shards:
    """Reads ranges of the flat buffer from a checkpoint's shard files (each verified once)."""

    def __init__(self, d: Path, manifest: dict[str, Any]) -> None:
        self.d, self.m, self.cache = d, manifest, {}

    def _file(self, s: dict[str, Any]) -> Any:
        if s["file"] not in self.cache:
            raw = (self.d / s["file"]).read_bytes() if (self.d / s["file"]).exists() else b""
            if hashlib.sha256(raw).hexdigest() != s["sha256"]:
                raise CheckpointError(f"{self.d / s['file']} is missing or does not match the "
                                      "manifest's SHA-256: the checkpoint is damaged")
            self.cache[s["file"]] = np.load(io.BytesIO(raw))
        return self.cache[s["file"]]

    def read(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Elements [lo, hi) of array ``name`` (params, master, opt.m, ...), assembled from
        every shard whose range overlaps."""
        dt = _dtype(self.m["dtypes"][name])
        out = np.empty(hi - lo, dt)
        for s in self.m["shards"]:
            a, b = max(lo, s["lo"]), min(hi, s["hi"])
            if a < b:
                out[a - lo: b - lo] = self._file(s)[name].view(dt)[a - s["lo"]: b - s["lo"]]
        return out


def _check_compatible(eng: Any, d: Path, m: dict[str, Any]) -> None:
    want = describe(eng)
    diffs = [f"{k}: checkpoint {m['model'].get(k)!r}, this run {v!r}"
             for k, v in want["model"].items() if m["model"].get(k) != v]
    for key in ("precision", "optimizer"):
        if m[key] != want[key]:
            diffs.append(f"{key}: checkpoint {m[key]!r}, this run {want[key]!r}")
    if not diffs and m["layout_sha256"] != want["layout_sha256"]:
        diffs.append("the parameter layout (names and shapes) differs")
    if diffs:
        raise CheckpointError(f"{d} is a checkpoint of another model or setting; refusing to "
                              "load it: " + "; ".join(diffs))
    if set(m["dtypes"]) != set(_holdings(eng)):
        raise CheckpointError(f"{d} holds {sorted(m['dtypes'])}, this run needs "
                              f"{sorted(_holdings(eng))}")


def load(eng: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Fill ``eng`` (any stage, any number of ranks) from a checkpoint; returns its manifest.

    ``path`` is a checkpoint directory or a root (its latest complete checkpoint).
    Every rank reads the ranges it holds; no communication.  Continue training
    at step ``eng.step_count`` (the data of step s is a function of s)."""
    d, m = read_manifest(path)
    _check_compatible(eng, d, m)
    shards = _Shards(d, m)
    for name, (a, start) in _holdings(eng).items():
        a[...] = shards.read(name, start, start + a.size)
    eng.states.optimizer.t, eng.step_count = int(m["optimizer_t"]), int(m["step"])
    if eng.states.scaler is not None and m["scaler"] is not None:
        for k, v in m["scaler"].items():
            setattr(eng.states.scaler, k, v)
    return m


def consolidate(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write one ``.npz`` with the full parameter dict {name: array} (serial model order).

    The precise copy is written: the fp32 master weights under mixed precision
    (the 16-bit parameters are their rounding), the parameters otherwise."""
    d, m = read_manifest(path)
    key = "master" if "master" in m["dtypes"] else "params"
    flat = _Shards(d, m).read(key, 0, m["psi"])
    params, at = {}, 0
    for name, shape in zip(m["names"], m["shapes"]):
        size = int(np.prod(shape, dtype=np.int64))
        params[name] = flat[at: at + size].reshape(shape)
        at += size
    buf = io.BytesIO()
    np.savez(buf, **params)
    out = Path(out)
    _atomic_write(out, buf.getvalue())
    return out


def load_consolidated(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The parameter dict of a consolidated ``.npz``, in the file's (the model's) order."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}
