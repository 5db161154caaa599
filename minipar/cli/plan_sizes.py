"""``minipar plan``'s sizes: the parameter count and GPT shape options, and the default heads.

EN plan size options · RU параметры размеров плана · ZH 规划尺寸选项

Shared by both paths of the verb, the formula tables (:mod:`minipar.cli.plan`)
and the layout planner (:mod:`minipar.cli.plan_layouts`).  A bad value is
argparse's one line (:mod:`minipar.cli.options`), exit 2.
"""

from __future__ import annotations

import argparse

_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
#: largest accepted size (ranks, layers, widths, sequence, batch, heads, t) and parameter count
MAX_SIZE = 10**12
MAX_PARAMS = 1e30


def param_count(text: str) -> float:
    """'7.5e9', '7.5B', '175e9', '1T' -> a whole number of parameters in [1, MAX_PARAMS]."""
    t = text.strip()
    scale = _SUFFIX.get(t[-1:].upper(), 1.0) if t else 1.0
    try:
        v = float(t[:-1] if scale != 1.0 else t) * scale
    except ValueError:
        v = float("nan")
    if not (1 <= v <= MAX_PARAMS and v == round(v)):
        raise argparse.ArgumentTypeError(
            f"must be a whole number of parameters from 1 to {MAX_PARAMS:.0e} "
            f"(examples: 7.5e9, 7.5B, 1T), got {text!r}"
        )
    return v


def gpt_sizes(text: str) -> tuple[int, int, int, int]:
    """'12,768,50257,1024' -> (n_layer, d_model, vocab, n_ctx), each from 1 to MAX_SIZE."""
    try:
        sizes = tuple(int(p) for p in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 4 or not all(1 <= v <= MAX_SIZE for v in sizes):
        raise argparse.ArgumentTypeError(
            "must be four integers from 1 to 1e12, n_layer,d_model,vocab,n_ctx "
            f"(e.g. 12,768,50257,1024), got {text!r}"
        )
    return sizes  # type: ignore[return-value]


def default_heads(d_model: int) -> int:
    """GPT-2's heads of 64 columns (d_model/64), else the largest divisor of d_model below that."""
    a = max(1, d_model // 64)
    while d_model % a:
        a -= 1
    return a
