"""Cutting the model into pipeline stages: which units each rank (and each chunk) runs.

EN model partitioning (pipeline stages) · RU разбиение модели на стадии · ZH 模型切分（流水线阶段）

GPipe (Huang et al. 2018, arXiv 1811.06965) cuts the L transformer blocks
into K partitions, one per device; interleaved 1F1B (Narayanan et al. 2021,
arXiv 2104.04473, §2.2.2) cuts them into p·v *virtual stages* and gives rank
s the v chunks s, s + p, s + 2p, ... (chunk c of rank s = virtual stage
c·p + s, :func:`~minipar.parallel.pipeline.stage_loop.virtual_stage`).  Here

    virtual stage j holds blocks  [Σ_{i<j} balance_i,  Σ_{i<=j} balance_i)

with the embedding added to virtual stage 0 and the head (ln_f, lm_head,
then the loss) to the last.  ``balance`` defaults to the even split
(:func:`minipar.spans.counts`: the first L mod pv stages take one block
more); torchgpipe and DeepSpeed call the same list ``balance`` / ``parts``.

:func:`check_pipeline` is every check a pipeline run makes before its first
message — the launcher runs it before MPI starts, every rank runs it again:
more stages than blocks, m < 1, more micro-batches than a replica's rows, a
balance list of the wrong length or sum, interleaving with m not a multiple
of p or blocks not divisible by p·v, a remat interval < 1 or more than a
chunk's units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minipar import checks, spans
from minipar.parallel.pipeline.dualpipe import DUALPIPE
from minipar.parallel.pipeline.schedule import KINDS
from minipar.parallel.pipeline.stage_loop import ends, virtual_stage

__all__ = ["check_pipeline", "chunk_blocks", "chunk_units", "parse_balance", "stage_units"]


def parse_balance(text: str | Sequence[int] | None) -> list[int] | None:
    """``"2,1,1"`` or ``[2, 1, 1]`` -> ``[2, 1, 1]`` (None stays None); ValueError otherwise."""
    if text is None:
        return None
    if isinstance(text, str):
        try:
            return [int(t) for t in text.split(",")]
        except ValueError:
            raise ValueError(f"--balance must be integers separated by commas, "
                             f"e.g. 2,2; got {text!r}") from None
    return list(text)


def check_pipeline(layers: int, p: int, m: int, schedule: str = "1f1b", v: int = 1,
                   balance: Sequence[int] | None = None, rows: int | None = None,
                   remat: Any = None) -> list[int]:
    """Every check of a pipeline run; returns the blocks per virtual stage (length p·v).

    ``layers``: transformer blocks L; ``p`` stages; ``m`` micro-batches; ``v``
    chunks per stage; ``rows``: the fewest rows a data-parallel replica holds
    (each micro-batch needs one); ``remat``: None, True or k >= 1 units per
    segment.  One ``ValueError`` naming the numbers."""
    checks.one_of("--schedule", schedule, KINDS)
    checks.integer("the number of stages p", p, 1)
    checks.integer("--micro-batches m", m, 1)
    checks.integer("--chunks v", v, 1)
    if schedule in ("zb-v", *DUALPIPE) and v != 2:
        raise ValueError(f"--schedule {schedule} holds exactly 2 model chunks per stage, got "
                         f"--chunks {v} (leave --chunks out: {schedule} is not interleaved)")
    if schedule not in ("interleaved", "zb-v", *DUALPIPE) and v != 1:
        raise ValueError(f"--chunks {v} model chunks per stage needs --schedule interleaved, "
                         f"not {schedule}")
    if schedule == "dualpipe" and (p % 2 or m % 2 or m < 2 * p):
        raise ValueError(f"--schedule dualpipe needs an even number of stages and an even "
                         f"--micro-batches >= 2 x stages, got {p} stages and m={m} (use "
                         f"{p + p % 2} stages and --micro-batches {2 * (p + p % 2)})")
    if schedule == "dualpipev" and m < 2 * p:
        raise ValueError(f"--schedule dualpipev needs --micro-batches >= PP = 2 x {p} ranks "
                         f"= {2 * p}, got {m}")
    pv = p if schedule == "dualpipe" else p * v  # dualpipe: two copies of p stages
    if pv > layers:
        what = f"{p} stages x {v} chunks = {pv} virtual stages" if pv > p else f"{p} stages"
        raise ValueError(f"{what} but the model has only {layers} layer{'s' * (layers != 1)}"
                         f": every stage needs at least one transformer block (use --layers "
                         f">= {pv})")
    if schedule == "interleaved":
        if m % p:
            raise ValueError(f"interleaved 1F1B sends micro-batches in groups of p: "
                             f"m={m} micro-batches is not a multiple of p={p} stages")
        if layers % pv:
            raise ValueError(f"interleaved 1F1B needs the {layers} layers divisible by "
                             f"p·v = {p}·{v} = {pv} virtual stages")
    if rows is not None and m > rows:
        raise ValueError(f"m={m} micro-batches but a data-parallel replica has only {rows} rows "
                         f"of the batch: each micro-batch needs at least one row")
    if remat is not None and remat is not True:
        checks.integer("remat interval", remat, 1, why="units per checkpointed segment")
    bal = spans.counts(layers, pv) if balance is None else list(balance)
    if balance is None:
        return _check_remat(bal, remat, v)
    if len(bal) != pv or not all(checks.is_integer(b) for b in bal):
        raise ValueError(f"--balance needs {pv} whole numbers (one per "
                         f"{'virtual ' if v > 1 else ''}stage), got {bal}")
    if any(b < 1 for b in bal):
        raise ValueError(f"--balance {','.join(map(str, bal))}: every stage needs at least one "
                         "layer")
    if sum(bal) != layers:
        raise ValueError(f"--balance {','.join(map(str, bal))} sums to {sum(bal)} layers, but "
                         f"the model has {layers}")
    return _check_remat(bal, remat, v)


def chunk_units(balance: Sequence[int]) -> list[int]:
    """Units of each virtual stage: its blocks, plus the embedding (first) and the head (last)."""
    last = len(balance) - 1
    return [b + (j == 0) + (j == last) for j, b in enumerate(balance)]


def _check_remat(balance: list[int], remat: Any, v: int) -> list[int]:
    """A remat interval K (units per segment) must fit the smallest chunk, as ``--remat``
    must fit the model's units in ``minipar run dp``."""
    if remat is None or remat is True:
        return balance
    units = chunk_units(balance)
    j = units.index(min(units))
    if remat > units[j]:
        u, b = units[j], balance[j]
        raise ValueError(f"remat interval {remat} is more than the {u} unit{'s' * (u != 1)} of "
                         f"{'virtual ' * (v > 1)}stage {j} ({b} block{'s' * (b != 1)}"
                         f"{' + embedding' * (j == 0)}{' + head' * (j == len(units) - 1)}): "
                         f"use 1..{u}, or remat alone (each stage keeps only its input)")
    return balance


def chunk_blocks(balance: Sequence[int], stage: int, p: int, chunk: int,
                 placement: str = "loop") -> range:
    """The block indices of rank ``stage``'s chunk ``chunk`` (virtual stage chunk·p + stage;
    ZB-V's ``placement="v"``: stage, then 2p − 1 − stage; DualPipe's ``"dual"``: stage
    s, then stage p − 1 − s of the same p, ``balance`` one entry per stage)."""
    j = virtual_stage(stage, chunk, p, placement)
    j = j % p if placement == "dual" else j
    lo = sum(balance[:j])
    return range(lo, lo + balance[j])


def stage_units(units: Sequence[Any], balance: Sequence[int], stage: int, p: int,
                v: int = 1, placement: str = "loop") -> list[tuple[Any, ...]]:
    """Rank ``stage``'s units, one tuple per chunk: ``units`` = embed, block 0..L-1, head
    (:func:`minipar.nn.gpt.gpt_units`); embed joins virtual stage 0, head the last."""
    n_blocks = len(units) - 2
    n = p if placement == "dual" else p * v
    if sum(balance) != n_blocks or len(balance) != n:
        raise ValueError(f"balance {list(balance)} does not cut {n_blocks} blocks into "
                         f"{n} virtual stages")
    out = []
    for c in range(v):
        blocks = chunk_blocks(balance, stage, p, c, placement)
        chunk = [units[1 + i] for i in blocks]
        first, last = ends(virtual_stage(stage, c, p, placement), p, v, placement)
        if first:
            chunk.insert(0, units[0])
        if last:
            chunk.append(units[-1])
        out.append(tuple(chunk))
    return out
