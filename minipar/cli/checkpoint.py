"""``minipar checkpoint``: what a saved checkpoint holds, and its tensors for other tools.

EN checkpoint · RU контрольная точка · ZH 检查点

    minipar checkpoint info ckpt/                      # the latest complete step under a root
    minipar checkpoint info ckpt/step_00000004 --json  # one step directory, as JSON
    minipar checkpoint export ckpt/ model.safetensors  # the full tensors, serial names

A checkpoint (:mod:`minipar.parallel.checkpoint`) is a folder per step: one
``shard_RRRRR_of_NNNNN.npz`` per rank of the run that saved it, and the
``manifest.json`` written last, which makes it complete.  ``info`` verifies every
file against the manifest's SHA-256 and prints one block: the format, the step,
the model (what the run's RunSpec recorded), precision and optimizer (with its
state: step count, learning rate, betas), the world size it was saved on, the
files with their sizes, the serial tensors and their parameter count; under a
root, the other complete steps and the partial ones (no manifest: a save that
did not finish), which every load ignores.

``export`` assembles each serial tensor from the pieces every rank saved
(:func:`~minipar.parallel.checkpoint.full_tensors`: the same arrays as the
engine's ``full_params()``, under the serial model's names) and writes them as
one safetensors file (:mod:`minipar.safetensors_io`), which
``safetensors.numpy.load_file``, PyTorch and JAX read; ``--kind master`` writes
the fp32 master weights of a mixed-precision run instead of its bfloat16
parameters.  The file is written atomically (a temporary name, fsync, rename);
an existing OUT is replaced only with ``--force``.

Bad input, one line and exit 2: DIR missing or not a checkpoint, only partial
checkpoints, a damaged file (SHA-256) or manifest, OUT in a folder that does not
exist or already there.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from minipar.cli.options import ArgumentParser, error_line, output_file

PROG = "minipar checkpoint"
SUFFIX = ".safetensors"


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    where = ("a checkpoint: one step directory (step_*/ with manifest.json) or a root holding "
             "them (its latest complete one)")
    info = sub.add_parser("info", help="what a checkpoint holds, every file verified",
                          description="What a checkpoint holds, every file verified (SHA-256).")
    info.add_argument("dir", metavar="DIR", help=where)
    info.add_argument("--json", action="store_true", help="print the same as one JSON object")
    ex = sub.add_parser("export", help="the full tensors, serial names, as OUT.safetensors",
                        description="The full tensors under their serial names, as a "
                        "safetensors file (other tools read it).")
    ex.add_argument("dir", metavar="DIR", help=where)
    ex.add_argument("out", metavar="OUT.safetensors", type=output_file,
                    help="the file to write, in a folder that exists")
    ex.add_argument("--kind", choices=("param", "master"), default="param",
                    help="param: the parameters, as full_params() returns them (bfloat16 under "
                    "mixed precision); master: the fp32 master weights of a mixed-precision "
                    "run (default %(default)s)")
    ex.add_argument("--force", action="store_true",
                    help="replace OUT if it exists (without it, an existing OUT is refused)")
    return p


def _pairs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def render(s: dict[str, Any]) -> str:
    """The block ``info`` prints, from :func:`minipar.parallel.checkpoint.summary`."""
    width = 20
    lines = [f"checkpoint {s['path']}"]

    def row(label: str, text: str) -> None:
        wrapped = textwrap.wrap(text, 96 - width) or [""]
        lines.append(f"  {label:<{width - 2}}{wrapped[0]}")
        lines.extend(" " * width + more for more in wrapped[1:])

    row("format", s["format"])
    row("step", f"{s['step']} (steps done; training continues at step {s['step']})")
    row("model", _pairs(s["model"]) if s["model"] else "not recorded (saved without a RunSpec)")
    data = s.get("data")
    if data:
        task = (f"{data.get('name')} ({data.get('bytes', 0):,} bytes, {data.get('tokenizer')}, "
                f"SHA-256 {str(data.get('sha256'))[:12]}…)" if data.get("task") == "text"
                else "the modular-sum task")
        row("data", f"{task}; batch {data['batch']}, seq {data['seq']}, data seed "
            f"{data['data_seed']} (a resume must give the same)")
    row("precision", s["precision"] or "not recorded")
    opt = s["optimizer"] or "not recorded"
    row("optimizer", f"{opt} ({_pairs(s['optimizer_state'])})" if s["optimizer_state"] else opt)
    ranks = s["world_size"]
    row("saved on", f"{ranks} rank{'s' if ranks != 1 else ''} (one shard file per rank; "
        "it loads on any layout)")
    row("tensors", f"{s['tensors']} serial tensors, {s['params']:,} parameters")
    row("arrays", _pairs(s["dtypes"]))
    row("files", f"{len(s['files'])} files, {s['bytes']:,} bytes, every one matches the "
        "manifest's SHA-256")
    name_w = max(len(f["file"]) for f in s["files"])
    for f in s["files"]:
        lines.append(" " * width + f"{f['file']:<{name_w}}  {f['bytes']:>12,} bytes")
    if s["not_in_manifest"]:
        row("not in manifest", ", ".join(s["not_in_manifest"]) +
            " (debris of an interrupted save: not read)")
    if "checkpoints" in s:
        row("checkpoints", ", ".join(s["checkpoints"]) + " (complete; shown: the latest)")
        for q in s["partial"]:
            n = len(q["shard_files"])
            row("partial, ignored", f"{q['dir']} ({n} shard file{'s' if n != 1 else ''}, "
                "no manifest.json: a save that did not finish)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``minipar checkpoint info|export``: 0 when done; 2 (one line on stderr) on bad input,
    a damaged or partial checkpoint, or an OUT that cannot be written."""
    a = _parser().parse_args(argv)
    from minipar.parallel import checkpoint  # NumPy only once the command line is good

    prog = f"{PROG} {a.command}"
    if a.command == "info":
        try:
            s = checkpoint.summary(a.dir)
        except ValueError as e:  # CheckpointError: what is wrong, naming the path
            return error_line(prog, e)
        print(json.dumps(s, indent=1) if a.json else render(s))
        return 0
    out = Path(a.out)
    if out.suffix != SUFFIX:
        return error_line(prog, f"OUT must end in {SUFFIX}, got {a.out!r}")
    if out.exists() and not a.force:
        return error_line(prog, f"{out} exists; --force replaces it")
    try:
        checkpoint.export(a.dir, out, kind=a.kind)
        d, m = checkpoint.read_manifest(a.dir)
    except ValueError as e:  # CheckpointError, or a dtype safetensors lacks
        return error_line(prog, e)
    params = sum(math.prod(shape) for shape in m["tensors"].values())
    print(f"wrote {out}: {len(m['tensors'])} tensors, {params:,} parameters "
          f"({a.kind}, {m['dtypes'][a.kind]}) of {d.name}, {out.stat().st_size:,} bytes "
          "(safetensors)")
    return 0
