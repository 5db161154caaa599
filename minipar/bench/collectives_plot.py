"""``minipar bench collectives --plot FILE.png``: bus bandwidth against size, one picture.

EN bus bandwidth plot · RU график пропускной способности шины · ZH 总线带宽图

One panel per collective (all-reduce, reduce-scatter, all-gather), one line
per algorithm, MPI's own in black: ``busbw`` (GB/s, nccl-tests' convention,
see :mod:`minipar.bench.collectives`) against the buffer size S (bytes), both
axes logarithmic.  Read it as the α-β cost model draws it: at small S the time
is the latency α x (messages), so busbw grows in proportion to S (a slope-1
line, the lower the later it bends); at large S the time is S / bandwidth and
busbw flattens at what the link (here: shared memory) gives.  An algorithm
whose line lies on MPI's is as fast; the gap between two lines at one size is
that size's ``x_mpi``.

Drawn with Matplotlib's object API on the Agg canvas (a PNG file, no window,
no ``pyplot`` state): safe in a terminal, a notebook or a test.
"""

from __future__ import annotations

import os
from typing import Any

#: MPI's own line: the reference every other line is read against
MPI_STYLE = {"color": "black", "linewidth": 2.0, "linestyle": "--"}


def plot_busbw(rows: list[dict[str, Any]], path: str | os.PathLike[str] | None = None) -> Any:
    """The figure of ``rows`` (the bench's rows: collective, algorithm, size, busbw_GBs);
    saved as PNG to ``path`` when given.  Returns the Matplotlib ``Figure``: its axes are
    the collectives in the rows' order, each line labelled with its algorithm and holding
    that algorithm's (size, busbw) points sorted by size.

    Raises ``ValueError`` for no rows, or a busbw <= 0 (a log axis cannot show it: one
    rank, where busbw is 0, is refused by the bench)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("no rows to plot")
    bad = [r for r in rows if not r["busbw_GBs"] > 0]
    if bad:
        raise ValueError(f"busbw must be > 0 on a log axis, got {bad[0]['busbw_GBs']} for "
                         f"{bad[0]['collective']} {bad[0]['algorithm']} at {bad[0]['size']} B")
    colls = list(dict.fromkeys(r["collective"] for r in rows))
    fig = Figure(figsize=(5.0 * len(colls), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(colls), squeeze=False)[0]
    n = rows[0]["ranks"]
    for ax, coll in zip(axes, colls):
        mine = [r for r in rows if r["collective"] == coll]
        for algo in dict.fromkeys(r["algorithm"] for r in mine):
            pts = sorted((r["size"], r["busbw_GBs"]) for r in mine if r["algorithm"] == algo)
            style = MPI_STYLE if algo == "mpi" else {"marker": "o", "markersize": 3}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=algo, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{coll}, {n} ranks")
        ax.set_xlabel("buffer size S (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("minipar bench collectives: bus bandwidth against size (float32)")
    if path is not None:
        fig.savefig(path, format="png", dpi=100)
    return fig
