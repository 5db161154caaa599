"""Figures of notebook 12: the number formats' bits, quantization error, loss curves, bytes.

EN low-precision figures · RU рисунки низкой точности · ZH 低精度图示

Every number is read from the formats themselves (``ml_dtypes`` and NumPy's ``finfo``)
or measured (:mod:`minipar.quantize`, :mod:`minipar.bench.precision`); these functions
only lay them out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: name -> (dtype name, exponent bits, mantissa bits): every format has one sign bit
FORMATS: dict[str, tuple[str, int, int]] = {
    "E4M3": ("float8_e4m3fn", 4, 3),
    "E5M2": ("float8_e5m2", 5, 2),
    "fp16": ("float16", 5, 10),
    "bf16": ("bfloat16", 8, 7),
}


def dtype(name: str) -> np.dtype:
    """The NumPy dtype of format ``name`` (:data:`FORMATS`)."""
    import ml_dtypes

    code = FORMATS[name][0]
    return np.dtype(getattr(ml_dtypes, code, None) or code)


def format_rows() -> list[dict[str, Any]]:
    """Per format: its bits, largest finite value, smallest normal and subnormal, epsilon
    (the gap after 1), all read from ``finfo``; the bit widths checked against it."""
    import ml_dtypes

    rows = []
    for name, (_, e, m) in FORMATS.items():
        dt = dtype(name)
        fi = ml_dtypes.finfo(dt) if dt.itemsize == 1 or name == "bf16" else np.finfo(dt)
        assert fi.nmant == m and 1 + e + m == 8 * dt.itemsize, name
        rows.append({"name": name, "bits": 8 * dt.itemsize, "exponent": e, "mantissa": m,
                     "max": float(fi.max), "smallest_normal": float(fi.smallest_normal),
                     "smallest_subnormal": float(fi.smallest_subnormal),
                     "eps": float(fi.eps)})
    return rows


def draw_formats(ax: Any = None) -> Any:
    """One bar per format, a box per bit: sign, exponent, mantissa, each in its colour,
    and the largest finite value beside it."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.6))
    colours = {"sign": "#d62728", "exponent": "#1f77b4", "mantissa": "#2ca02c"}
    rows = format_rows()
    for y, r in enumerate(reversed(rows)):
        fields = [("sign", 1), ("exponent", r["exponent"]), ("mantissa", r["mantissa"])]
        x = 0
        for field, n in fields:
            for _ in range(n):
                ax.add_patch(plt.Rectangle((x, y + 0.1), 0.8, 0.8, color=colours[field]))
                x += 1
        ax.text(-0.4, y + 0.5, r["name"], ha="right", va="center", fontsize=10)
        ax.text(17, y + 0.5, f"max {r['max']:.4g}, smallest normal {r['smallest_normal']:.3g}",
                va="center", fontsize=9)
    for field, colour in colours.items():
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, color=colour, label=field))
    ax.set_xlim(-3, 34)
    ax.set_ylim(0, len(rows) + 1)  # a free row on top for the legend: no note covered
    ax.axis("off")
    ax.legend(loc="upper left", ncol=3, fontsize=8, frameon=False)
    ax.set_title("bits of each format (one box per bit)")
    return ax


def plot_error_vs_block(widths: list[int], errors: dict[str, list[float]], ax: Any = None,
                        title: str = "") -> Any:
    """Relative error against the tile width (log-log), one line per format."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for fmt, errs in errors.items():
        ax.plot(widths, errs, marker="o", label=fmt)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tile width (1 x w elements share a scale)")
    ax.set_ylabel("relative error")
    ax.set_title(title)
    ax.legend()
    return ax


def loss_curves(rows: list[dict[str, Any]], ax: Any = None) -> Any:
    """Validation loss against step, one line per row of ``minipar bench precision``."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        if r["validation"]:
            steps, losses = zip(*r["validation"])
            ax.plot(steps, losses, marker=".", label=r["name"],
                    linestyle="-" if r["kind"] == "precision" else "--")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.legend(fontsize=8)
    return ax


def bytes_bars(rows: list[dict[str, Any]], ax: Any = None,
               title: str = "ZeRO++: bytes each rank sends per step") -> Any:
    """Bytes sent per rank per step, stacked: inside a node and across nodes (ticks with
    thousands separators, each bar's total written on it)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["name"] for r in rows]
    inter = np.array([r["inter_node_bytes_per_step"] for r in rows])
    total = np.array([r["bytes_per_step"] for r in rows])
    ax.bar(names, total - inter, label="inside a node")
    ax.bar(names, inter, bottom=total - inter, label="across nodes")
    for i, t in enumerate(total):
        ax.text(i, t, f"{t:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_ylabel("bytes sent per rank per step")
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=20)
    ax.legend()
    return ax


__all__ = ["FORMATS", "bytes_bars", "draw_formats", "format_rows",
           "loss_curves", "plot_error_vs_block"]
