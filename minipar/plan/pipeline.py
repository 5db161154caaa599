"""Pipeline parallelism: bubble, micro-batches in flight, activation memory, bytes.

EN pipeline parallelism · RU конвейерный параллелизм · ZH 流水线并行

GPipe (Huang et al. 2018, arXiv 1811.06965): K stages, M micro-batches.
All forwards, then all backwards; the idle share of the time is the bubble

    bubble fraction = (K − 1) / (M + K − 1)          (negligible when M ≥ 4K)

and re-materialisation (keep only each stage's input per micro-batch,
recompute the rest in backward) brings peak activation memory from O(N×L)
to O(N + (L/K)×(N/M)), N the mini-batch size, L the layers.

1F1B / PipeDream-Flush (Narayanan et al. 2021, arXiv 2104.04473), p
stages, m micro-batches: the same bubble, stated relative to the ideal
(bubble-free) time, bubble / ideal = (p − 1)/m — and at most p micro-batches
in flight per stage instead of m.  Interleaved 1F1B with v model chunks per
device: (1/v)(p − 1)/m, at v × the point-to-point communication.
"""

from __future__ import annotations

from fractions import Fraction

from minipar.plan._check import count, non_negative, positive


def bubble_formula(kind: str, p: int, m: int, v: int = 1) -> dict[str, Fraction]:
    """The papers' bubble of schedule ``kind`` for p equal stages, exact:
    ``{"ratio": r, "fraction": r/(1 + r)}`` — bubble over ideal time, and idle share of
    the step.

    ``naive`` (one micro-batch in the pipeline at a time): r = p − 1, fraction
    (p − 1)/p; ``gpipe`` and ``1f1b``: r = (p − 1)/m, fraction (p − 1)/(m + p − 1)
    (Huang et al. 2018; Narayanan et al. 2021); ``interleaved`` with v chunks per
    rank: r = (1/v)(p − 1)/m.  The one home of the formula: the simulator's exact
    bubble is checked against it, and every float below is this ``Fraction`` rounded.
    """
    p, m, v = count("p", p), count("m", m), count("v", v)
    if kind in ZERO_BUBBLE_KINDS:
        return zero_bubble_formula(kind, p, m)
    if kind in DUALPIPE_KINDS:
        return dualpipe_formula(kind, p, m)
    r = Fraction(p - 1) if kind == "naive" else Fraction(p - 1, v * m)
    return {"ratio": r, "fraction": r / (1 + r)}


#: the zero-bubble schedules (Qi et al. 2023, arXiv 2401.10241)
ZERO_BUBBLE_KINDS = ("zb-h1", "zb-h2", "zb-v")


def zero_bubble_holds(kind: str, p: int, m: int) -> bool:
    """Whether Table 2's figure applies: m >= p for ZB-H1, m >= 2p − 1 for ZB-H2 and ZB-V
    (1F1B: any m); below that the schedule's bubble is the simulator's.  DualPipe and
    DualPipe-V: m >= 2p, the smallest m they run at."""
    return m >= {"zb-h1": p, "zb-h2": 2 * p - 1, "zb-v": 2 * p - 1, "dualpipe": 2 * p,
                 "dualpipev": 2 * p}.get(kind, 0)


#: DeepSeek-V3's schedules (DeepSeek-AI 2024, arXiv 2412.19437, §3.2.1)
DUALPIPE_KINDS = ("dualpipe", "dualpipev")


def dualpipe_formula(kind: str, p: int, m: int, t_f: float = 1, t_b: float = 2,
                     t_w: float = 1, t_fb: float | None = None) -> dict:
    """The DualPipe repository's table, p ranks, costs per chunk (one of the PP stages):
    F a forward, B a *whole* backward (input and weight parts), W its weight part, F&B an
    overlapped pair of a forward and a backward (default F + B, one core's)::

        dualpipe    PP = p     bubble (PP/2 − 1)(F&B + B − 3W)   params 2x   acts PP + 1
        dualpipev   PP = 2p    the same                          params 2x   acts PP + 1

    ``{"bubble", "ratio": bubble / ideal, "fraction": bubble / (bubble + ideal), "pp",
    "in_flight": PP + 1}``, ideal = one rank's work: m(F + B) for dualpipe (m/2 micro-
    batches each way, two chunks), 2m(F + B) for dualpipev (m micro-batches, two chunks).
    Exact ``Fraction`` values for exact costs."""
    p, m = count("p", p), count("m", m)
    exact = all(isinstance(x, (int, Fraction)) for x in (t_f, t_b, t_w, t_fb or 0))
    f, b, w = (Fraction(x) if exact else float(x) for x in (t_f, t_b, t_w))
    fb = f + b if t_fb is None else (Fraction(t_fb) if exact else float(t_fb))
    pp = p if kind == "dualpipe" else 2 * p
    bubble = (Fraction(pp, 2) - 1 if exact else pp / 2 - 1) * (fb + b - 3 * w)
    ideal = (m if kind == "dualpipe" else 2 * m) * (f + b)
    return {"bubble": bubble, "ratio": bubble / ideal, "fraction": bubble / (bubble + ideal),
            "pp": pp, "in_flight": pp + 1}


def zero_bubble_formula(kind: str, p: int, m: int, t_f: float = 1, t_b: float = 1,
                        t_w: float = 1) -> dict:
    """Qi et al. 2023, Table 2: the bubble of ``kind`` with per-stage costs T_F, T_B, T_W
    (B: input gradient, W: weight gradient), iteration time = the longest stage's span:

        1f1b   (p − 1)(T_F + T_B + T_W)
        zb-h1  (p − 1)(T_F + T_B − T_W)                 m >= p
        zb-h2  max(0, (p − 1)(T_F + T_B − 2T_W))        m >= 2p − 1
        zb-v   max(0, (p − 1)(T_F + T_B − 2T_W))        m >= 2p − 1 (zero when equal)

    ``{"bubble", "ratio": bubble / m(T_F + T_B + T_W), "fraction": bubble / (bubble +
    ideal)}``; exact ``Fraction`` values for exact costs.  (ZB-V's line for unequal costs
    is ZB-H2's expression: the paper states ZB-V's zero for equal costs.)"""
    p, m = count("p", p), count("m", m)
    exact = all(isinstance(x, (int, Fraction)) for x in (t_f, t_b, t_w))
    f, b, w = (Fraction(x) if exact else float(x) for x in (t_f, t_b, t_w))
    bubble = {"1f1b": (p - 1) * (f + b + w), "zb-h1": (p - 1) * (f + b - w),
              "zb-h2": max(0, (p - 1) * (f + b - 2 * w)),
              "zb-v": max(0, (p - 1) * (f + b - 2 * w))}[kind]
    ideal = m * (f + b + w)
    return {"bubble": bubble, "ratio": bubble / ideal, "fraction": bubble / (bubble + ideal)}


def gpipe_bubble_fraction(K: int, M: int) -> float:
    """Idle share of a GPipe step: (K − 1)/(M + K − 1) (Huang et al. 2018, arXiv 1811.06965).

    Bubble time over *total* time, for K stages and M micro-batches.
    """
    K, M = count("K", K), count("M", M)
    return float(bubble_formula("gpipe", K, M)["fraction"])


def bubble_time_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal time: (1/v)(p − 1)/m (Narayanan et al. 2021, arXiv 2104.04473).

    1F1B (v = 1) and interleaved 1F1B (v model chunks per device).  For
    v = 1 it is the GPipe bubble measured against the ideal time instead of
    the total: r/(1 + r) = (p − 1)/(m + p − 1).
    """
    return float(bubble_formula("interleaved" if v != 1 else "1f1b", p, m, v)["ratio"])


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of the total step time for any of the schedules: r / (1 + r), r = bubble_time_ratio."""
    return float(bubble_formula("interleaved" if v != 1 else "1f1b", p, m, v)["fraction"])


def peak_microbatches_in_flight(p: int, m: int, schedule: str = "1f1b") -> int:
    """Micro-batches whose activations the first stage holds at its peak.

    ``gpipe``: all m (every forward before any backward); ``1f1b``:
    min(p, m) (a stage starts backward after p − stage forwards).
    """
    p, m = count("p", p), count("m", m)
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p, m)
    raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")


def pipeline_p2p_bytes_per_rank(
    b: int, s: int, h: int, m: int, v: int = 1, bytes_per_elem: float = 2
) -> float:
    """Bytes a (not last) pipeline rank sends per step: 2 × m × v × b·s·h × bytes.

    Per micro-batch each of the rank's v chunks sends its output activation
    (b·s·h elements) forward and the gradient of its input backward; with
    interleaving (v > 1) that is v × the communication (arXiv 2104.04473).
    """
    b, s, h, m, v = (count(n, x) for n, x in (("b", b), ("s", s), ("h", h), ("m", m), ("v", v)))
    return 2.0 * m * v * b * s * h * positive("bytes_per_elem", bytes_per_elem)


def gpipe_activation_bytes(
    N: int, L: int, K: int, M: int, layer_bytes_per_sample: float,
    boundary_bytes_per_sample: float, rematerialize: bool = True,
) -> float:
    """Peak activation bytes on one of K GPipe partitions (Huang et al. 2018, §2.3).

    N mini-batch samples in M micro-batches, L layers split evenly (L/K per
    partition); a layer keeps ``layer_bytes_per_sample`` per sample for its
    backward, a partition's input is ``boundary_bytes_per_sample`` per sample
    (s·h·2 for a 16-bit transformer; Korthikanti's per-layer bytes with b = 1
    for the layer).

    - without re-materialisation: (L/K) × N × layer bytes — O(N × L/K);
    - with it: N × boundary bytes (every micro-batch's partition input is
      kept) + (L/K) × (N/M) × layer bytes (one micro-batch's activations,
      recomputed during its backward) — the paper's O(N + (L/K)(N/M)).
    """
    N, L, K, M = count("N", N), count("L", L), count("K", K), count("M", M)
    if M > N:
        raise ValueError(f"M={M} micro-batches cannot split a mini-batch of N={N} samples")
    layer = non_negative("layer_bytes_per_sample", layer_bytes_per_sample)
    boundary = non_negative("boundary_bytes_per_sample", boundary_bytes_per_sample)
    if not rematerialize:
        return L / K * N * layer
    return N * boundary + L / K * (N / M) * layer
