"""Who holds which slice: cutting the serial parameters for tensor parallelism, and back —
срезы параметров тензорного параллелизма — 张量并行的参数切片.

EN tensor slicing (Megatron) · RU разрезание тензоров · ZH 张量切分

Rank r of t holds a slice of each weight, cut from the full, partition-independent
initialisation (``GPT(cfg).init(seed)``, then :func:`shard_params`), so every run, on any
t, starts from the serial model (Shoeybi et al. 2019, arXiv 1909.08053, §3).
:func:`kind_of` says how a tensor is cut:

    columns   W_in, b_in (the MLP's first linear), lm_head (vocabulary columns)
    qkv       W_qkv, b_qkv: the q, k and v columns of this rank's heads (three groups):
              H/t query heads, and K/t key/value heads when t divides K; when K < t
              (grouped-query attention, K dividing t) the one key/value head its query
              heads read, replicated on t/K ranks (:func:`kv_heads_of`)
    rows      W_out (of the MLP and of attention), tok_emb (vocabulary rows)
    replicated  LayerNorms, b_out, pos_emb, the router: whole on every rank

:func:`placements` says where each slice sits in the global tensor (a
:class:`~minipar.parallel.engine.Shard`: what a checkpoint needs to resume on any
layout); :func:`unshard_params` and :func:`gather_params` put the slices back together
(for reports and tests); :func:`check_tp` is the one divisibility rule.
"""

from __future__ import annotations

from typing import Any

from minipar import checks, spans
from minipar.backend import xp
from minipar.collectives.ring import all_gather
from minipar.comm.traced import traced
from minipar.nn.gpt import param_shapes
from minipar.nn.gpt_config import GPTConfig
from minipar.parallel.engine import Piece, Shard
from minipar.plan.tensor import check_tp_sizes

__all__ = ["check_tp", "gather_params", "kind_of", "placement", "placements", "shard_params",
           "split_columns", "split_rows", "split_sequence", "unshard_params"]


def check_tp(cfg: GPTConfig, t: int, sequence_parallel: bool = False,
             seq: int | None = None) -> None:
    """ValueError naming the numbers unless ``cfg`` can be sliced ``t`` ways (local check:
    every rank raises alike, before any message).  SP also needs ``seq`` % t == 0."""
    checks.integer("the tensor-parallel size", t, 1)
    check_tp_sizes(t, cfg.n_head, cfg.d_ff, cfg.vocab_size, seq if sequence_parallel else None,
                   sequence_parallel=sequence_parallel, experts=cfg.n_experts,
                   kv_heads=cfg.n_kv_head)


def kv_heads_of(n_head: int, n_kv_head: int, t: int, r: int) -> tuple[int, int]:
    """``(first, count)`` of the key/value heads rank r of t holds: K/t of them when t
    divides K; else (K divides t) the one its H/t query heads read, head r // (t/K),
    held also by the other t/K − 1 ranks of its group (vLLM's replication)."""
    if n_kv_head % t == 0:
        return r * (n_kv_head // t), n_kv_head // t
    return r // (t // n_kv_head), 1


def _qkv_columns(heads: tuple[int, int], width: int, t: int, r: int) -> list[tuple[int, int]]:
    """[(start, length)] of rank r's columns of a fused qkv of ``width`` columns: its query
    heads, then its key heads, then its value heads (``heads`` = (H, K))."""
    h, kv = heads
    dh = width // (h + 2 * kv)
    first, n = kv_heads_of(h, kv, t, r)
    return [(r * (h // t) * dh, h // t * dh), ((h + first) * dh, n * dh),
            ((h + kv + first) * dh, n * dh)]


def split_columns(a: Any, t: int, r: int, parts: int = 1) -> Any:
    """Rank r's columns (last axis) of ``a``: each of ``parts`` equal groups cut t ways and
    rank r's pieces concatenated (``parts=3``: the q, k and v columns of its heads)."""
    groups = xp.split(a, parts, axis=-1)
    return xp.ascontiguousarray(xp.concatenate([xp.split(g, t, axis=-1)[r] for g in groups],
                                               axis=-1))


def split_rows(a: Any, t: int, r: int) -> Any:
    """Rank r's rows (first axis) of ``a``, cut in t equal blocks."""
    return xp.ascontiguousarray(xp.split(a, t, axis=0)[r])


def split_sequence(x: Any, t: int, r: int, axis: int = 1) -> Any:
    """Rank r's positions of ``x`` along ``axis`` (the ``numpy.array_split`` rule)."""
    lo, hi = spans.span(x.shape[axis], t, r)
    return xp.ascontiguousarray(x[(slice(None),) * (axis % x.ndim) + (slice(lo, hi),)])


def kind_of(name: str) -> str:
    """How a GPT parameter is sliced: ``"rows"``, ``"columns"``, ``"qkv"`` (columns per
    head), or ``"replicated"`` (every rank holds all of it)."""
    leaf = name.rsplit(".", 1)[-1]
    if name == "tok_emb":
        return "rows"  # vocabulary rows
    if name == "lm_head":
        return "columns"  # vocabulary columns
    if leaf in ("w_qkv", "b_qkv"):
        return "qkv"
    if leaf in ("w_in", "b_in"):
        return "columns"
    if leaf == "w_out":
        return "rows"
    return "replicated"  # embeddings of positions, LayerNorms, router, b_out


def _slice(name: str, a: Any, t: int, r: int, heads: tuple[int, int]) -> Any:
    k = kind_of(name)
    if k == "rows":
        return split_rows(a, t, r)
    if k == "qkv":
        return xp.ascontiguousarray(xp.concatenate(
            [a[..., lo:lo + n] for lo, n in _qkv_columns(heads, a.shape[-1], t, r)], axis=-1))
    if k == "columns":
        return split_columns(a, t, r)
    return xp.array(a, copy=True)


def shard_params(full: dict[str, Any], cfg: GPTConfig, t: int, r: int) -> dict[str, Any]:
    """Rank r's shard of the full parameters, same names and order (:func:`kind_of`)."""
    check_tp(cfg, t)
    heads = (cfg.n_head, cfg.n_kv_head)
    return {n: _slice(n, full[n], t, r, heads) for n in param_shapes(cfg)}


def placement(name: str, shape: tuple[int, ...], t: int, r: int,
              heads: tuple[int, int] | None = None) -> Shard:
    """Where rank r's slice of ``name`` (global ``shape``) sits: the pieces of :func:`_slice`
    (rows one block of axis 0; columns one block of the last axis; ``w_qkv``/``b_qkv``
    three pieces, the rank's columns of q, of k and of v, ``heads`` = (H, K), default
    t heads of each; a replicated tensor whole)."""
    full = tuple(slice(0, n) for n in shape)
    k = kind_of(name)
    if k == "replicated":
        return Shard(name, shape, (Piece(full, full),))
    axis = 0 if k == "rows" else len(shape) - 1
    n = shape[axis] // t
    cols = (_qkv_columns(heads or (t, t), shape[axis], t, r) if k == "qkv"
            else [(r * n, n)])
    pieces, at = [], 0
    for lo, n in cols:
        local = full[:axis] + (slice(at, at + n),) + full[axis + 1:]
        pieces.append(Piece(local, full[:axis] + (slice(lo, lo + n),) + full[axis + 1:]))
        at += n
    return Shard(name, shape, tuple(pieces))


def placements(cfg: GPTConfig, t: int, r: int) -> dict[str, Shard]:
    """Where each tensor of rank r's shard (:func:`shard_params`) sits in the global one:
    rows and columns one piece each, ``w_qkv`` / ``b_qkv`` three (its q, k and v columns),
    replicated tensors whole.  E.g. t = 2, d = 4, rank 1's ``w_qkv`` (4, 6) holds global
    columns 2:4, 6:8 and 10:12 (the ``Shard`` example of :mod:`minipar.parallel.engine`)."""
    check_tp(cfg, t)
    heads = (cfg.n_head, cfg.n_kv_head)
    return {n: placement(n, tuple(s), t, r, heads) for n, s in param_shapes(cfg).items()}


def unshard_params(shards: list[dict[str, Any]], cfg: GPTConfig) -> dict[str, Any]:
    """The full parameters from every rank's shard (rank order); replicated ones from rank 0."""
    t, out = len(shards), {}
    for n in param_shapes(cfg):
        k, ps = kind_of(n), [s[n] for s in shards]
        if k == "rows":
            out[n] = xp.concatenate(ps, axis=0)
        elif k == "columns":
            out[n] = xp.concatenate(ps, axis=-1)
        elif k == "qkv":  # each rank's q, k, v columns put back (a replicated head: alike)
            out[n] = xp.empty(param_shapes(cfg)[n], dtype=ps[0].dtype)
            for r, p in enumerate(ps):
                for piece in placement(n, out[n].shape, t, r, (cfg.n_head, cfg.n_kv_head)).pieces:
                    out[n][piece.global_] = p[piece.local]
        else:
            out[n] = ps[0]
    assert t >= 1
    return out


def gather_params(comm: Any, shard: dict[str, Any], cfg: GPTConfig,
                  op: str = "tp_full_params") -> dict[str, Any]:
    """The full parameters (or gradients) on every rank of ``comm``: every rank's shard,
    flattened in the serial order (the same shapes on every rank), ring all-gathered —
    counted under ``op`` — and put back together by :func:`unshard_params`."""
    names = list(param_shapes(cfg))
    flat = xp.concatenate([xp.ravel(shard[n]) for n in names])
    c = traced(comm)
    with c.operation(op):
        every = all_gather(c, flat).reshape(c.size, flat.size)
    shards = []
    for row in every:
        out, at = {}, 0
        for n in names:
            k = shard[n].size
            out[n] = row[at:at + k].reshape(shard[n].shape)
            at += k
        shards.append(out)
    return unshard_params(shards, cfg)


