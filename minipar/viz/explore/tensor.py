"""Tensor and sequence parallelism: where f and g sit, bytes per block, activations against t.

EN tensor / sequence parallelism explorer · RU тензорный и последовательностный параллелизм ·
ZH 张量并行与序列并行

:func:`tensor` draws one transformer block as Megatron splits it over t ranks (Shoeybi et
al. 2019, arXiv 1909.08053): attention by heads and the MLP by columns then rows, with
the conjugate operators f (forward identity, backward all-reduce) before each and g
(forward all-reduce, backward identity) after; with sequence parallelism (Korthikanti et
al. 2022, arXiv 2205.05198) f becomes an all-gather of the sequence and g a
reduce-scatter, and the LayerNorms and dropouts between them work on s/t positions.
Beside it, against t: the bytes one rank sends per block (the same for TP and TP+SP:
an all-reduce is a reduce-scatter and an all-gather;
:func:`minipar.plan.tensor.tp_bytes_per_rank_per_layer`) and the activation bytes per
block (:func:`minipar.plan.activations.activation_bytes_per_layer`, Table 2).  A mode is
one entry of :data:`MODES`.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from minipar.plan.activations import activation_bytes_per_layer
from minipar.plan.tensor import tp_bytes_per_rank_per_layer
from minipar.viz.explore.memory import MODELS
from minipar.viz.explore.view import View

#: label -> Korthikanti's activation mode for t > 1 (sequence parallel or not, selective)
MODES: dict[str, str] = {"TP": "tp", "TP + SP": "tp+sp", "TP + selective": "tp+selective",
                         "TP + SP + selective": "tp+sp+selective"}
DENSE = tuple(k for k, (_, moe) in MODELS.items() if moe is None)
TS = (1, 2, 4, 8, 16)
CONTROLS: dict[str, Any] = {"model": DENSE, "t": TS, "sp": True, "selective": False,
                            "b": (1, 2, 4, 8)}


def _mode(t: int, sp: bool, selective: bool) -> str:
    if t == 1:
        return "tp+sp+selective" if selective else "none"
    return MODES["TP" + (" + SP" if sp else "") + (" + selective" if selective else "")]


def tensor(model: str = "GPT-3 175B", t: int = 8, sp: bool = True, selective: bool = False,
           b: int = 1) -> View:
    """Bytes per block and activation bytes per block on one of t ranks (16-bit elements).

    ``numbers``: ``bytes_per_block`` (one rank, forward and backward), ``activation_bytes``
    (one block, this mode), ``by_t`` (t -> both, for every t that divides the heads),
    ``collectives`` (the block's four, in order), ``mode``.
    """
    spec, _ = MODELS[model]
    s, h, a = spec.seq, spec.hidden, spec.heads
    if a % t or spec.d_ff % t:
        raise ValueError(f"t = {t} must divide the {a} heads and d_ff {spec.d_ff}")
    by_t = {}
    for tt in TS:
        if a % tt == 0 and spec.d_ff % tt == 0:
            by_t[tt] = {"bytes_per_block": tp_bytes_per_rank_per_layer(b, s, h, tt),
                        "activation_bytes": activation_bytes_per_layer(
                            s, b, h, a, tt, _mode(tt, sp, selective))}
    f, g = ("all-gather", "reduce-scatter") if sp and t > 1 else ("f", "g")
    seq = ["LayerNorm", f, "attention (a/t heads)", g, "LayerNorm", f, "MLP (d_ff/t)", g]
    numbers = {"model": model, "t": t, "mode": _mode(t, sp, selective), **by_t[t],
               "by_t": by_t, "collectives": [x for x in seq if x in (f, g)] if t > 1 else []}
    lines = [f"{model}: s = {s}, h = {h}, a = {a}, b = {b}; t = {t}, mode {numbers['mode']}",
             "one block: " + " → ".join(seq),
             f"bytes one rank sends per block (forward + backward): "
             f"{numbers['bytes_per_block'] / 1e6:,.1f} MB "
             + ("(the same as TP's all-reduces: RS + AG = AR)" if sp and t > 1 else ""),
             f"activations kept per block: {numbers['activation_bytes'] / 1e6:,.1f} MB "
             f"(t = 1: {by_t[1]['activation_bytes'] / 1e6:,.1f} MB)"]
    return View(numbers, lines, lambda: _figure(seq, by_t, t, f, g))


def _figure(seq: list[str], by_t: dict[int, dict[str, float]], t: int, f: str, g: str
            ) -> Figure:
    fig = Figure(figsize=(10, 3.6))
    ax, bx = fig.subplots(1, 2)
    ts = sorted(by_t)
    ax.plot(ts, [by_t[x]["bytes_per_block"] / 1e6 for x in ts], "o-")
    ax.axvline(t, color="grey", ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("t")
    ax.set_ylabel("MB sent per rank per block")
    ax.set_title("four collectives of b·s·h: 2(t−1)/t each", fontsize=9)
    bx.plot(ts, [by_t[x]["activation_bytes"] / 1e6 for x in ts], "o-", color="#c44e52")
    bx.axvline(t, color="grey", ls=":")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("t")
    bx.set_ylabel("MB of activations per block")
    bx.set_title(" → ".join(x if x not in (f, g) else f"[{x}]" for x in seq), fontsize=7)
    fig.tight_layout()
    return fig
