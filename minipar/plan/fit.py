"""Fit the step model's constants on PTD-P Table 1, and its leave-one-out residuals.

EN calibration fit · RU подгонка констант · ZH 常数拟合

``python -m minipar.plan.fit`` prints the fitted constants and the leave-one-out
table that docs/plan-calibration.md records.  The fit minimises Σ log²(predicted /
published) of TFLOP/s per GPU over the rows (the error of a ratio, symmetric in
over- and under-estimates) by coordinate search on a grid that halves its step
(deterministic, no random start): ``gemm_efficiency`` η in [0.4, 1],
``kernel_overhead_us`` t₀ in [0, 10] (a launch and a tail wave: a few µs), ``link_efficiency`` in [0.3, 1].
Leave-one-out: for each row, fit on the other nine and predict it.
"""

from __future__ import annotations

import math

from minipar.plan.calibration import PTDP_TABLE_1
from minipar.plan.cluster import load_cluster
from minipar.plan.layouts import Layout, gpt_model
from minipar.plan.step_time import estimate

FITTED = ("gemm_efficiency", "kernel_overhead_us", "link_efficiency")
#: where every fit starts (the middle of plausible values, never the stored fit itself, so
#: a leave-one-out fit sees nothing of the row it predicts)
START = {"gemm_efficiency": 0.7, "kernel_overhead_us": 5.0, "link_efficiency": 0.8}
BOUNDS = {"gemm_efficiency": (0.4, 1.0), "kernel_overhead_us": (0.0, 10.0),
          "link_efficiency": (0.3, 1.0)}


def table_1_layout(row: dict) -> tuple:
    """(model, layout, global batch) of one PTD-P Table 1 row: s = 2048, V = 51200, full
    recomputation, no sequence parallelism (2021), micro-batch and v of run_table_1.sh."""
    model = gpt_model(row["l"], row["h"], 51200, 2048, heads=row["a"])
    d = row["n"] // (row["t"] * row["p"])
    lay = Layout(d, row["t"], row["p"], 1, 0, "full", row["b"], row["B"] // (d * row["b"]),
                 v=row["v"], sp=False, overlap=row["overlap"])
    return model, lay, row["B"]


def predict(rows, constants: dict[str, float] | None = None, cluster: str = "dgx-a100"
            ) -> list[float]:
    """Predicted TFLOP/s per GPU (PTD-P's eq. 3 count) of each row."""
    c = load_cluster(cluster)
    return [float(estimate(*table_1_layout(r)[:2], c, table_1_layout(r)[2],
                           constants=constants)["tflops_per_gpu"]) for r in rows]


def loss(rows, constants: dict[str, float]) -> float:
    return sum(math.log(x / r["tflops"]) ** 2 for x, r in zip(predict(rows, constants), rows))


def fit(rows=PTDP_TABLE_1, start: dict[str, float] | None = None) -> dict[str, float]:
    """The constants that minimise :func:`loss` on ``rows`` (coordinate search)."""
    cur = {k: (start or START)[k] for k in FITTED}
    cur = {k: min(max(v, BOUNDS[k][0]), BOUNDS[k][1]) for k, v in cur.items()}
    step = {k: (hi - lo) / 4 for k, (lo, hi) in BOUNDS.items()}
    best = loss(rows, cur)
    for _ in range(7):  # the step halves each round: 1/256 of the range at the end
        improved = True
        while improved:
            improved = False
            for k in FITTED:
                for sign in (1, -1):
                    x = min(max(cur[k] + sign * step[k], BOUNDS[k][0]), BOUNDS[k][1])
                    if x == cur[k]:
                        continue
                    trial = {**cur, k: x}
                    f = loss(rows, trial)
                    if f < best - 1e-12:
                        cur, best, improved = trial, f, True
        step = {k: v / 2 for k, v in step.items()}
    return cur


def leave_one_out(rows=PTDP_TABLE_1) -> list[dict[str, object]]:
    """For each row: the constants fitted on the others and the row's prediction."""
    out = []
    for i, r in enumerate(rows):
        k = fit(rows[:i] + rows[i + 1:])
        pred = predict([r], k)[0]
        out.append({"name": r["name"], "published": r["tflops"], "predicted": pred,
                    "ratio": pred / r["tflops"], "constants": k})
    return out


def residual_table(loo: list[dict[str, object]]) -> str:
    """The leave-one-out residuals as a text table."""
    lines = [(f"{'run':>6} {'published':>10} {'predicted':>10} {'error':>7}   constants (fit "
             "on the other nine)")]
    for x in loo:
        k = x["constants"]
        lines.append(f"{x['name']:>6} {x['published']:>10.0f} {x['predicted']:>10.1f} "
                     f"{x['ratio'] - 1:>+7.1%}   η {k['gemm_efficiency']:.3f}, t₀ "
                     f"{k['kernel_overhead_us']:.2f} µs, links {k['link_efficiency']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    k = fit()
    print("fitted on all ten rows:", {a: round(b, 4) for a, b in k.items()})
    for r, x in zip(PTDP_TABLE_1, predict(PTDP_TABLE_1, k)):
        print(f"  {r['name']:>6} {r['tflops']:>5} {x:7.1f} {x / r['tflops'] - 1:+.1%}")
    print(residual_table(leave_one_out()))
