"""Equal to the serial run: the parity verdict and its tolerance, derived in one place.

EN parity with the serial run · RU совпадение с последовательным запуском · ZH 与串行运行一致

Every parallel strategy claims to train *the same model* as the serial run
(:func:`minipar.parallel.common.serial_reference`).  In float64 that cannot mean
bit for bit: the parallel run adds the same numbers in another order.  This
module says what it does mean; :func:`compare` is the one verdict that every
strategy, every test and ``minipar run`` use.

**A correct run's difference.**  Floating-point addition is not associative
(Goldberg 1991, "What every computer scientist should know about floating-point
arithmetic"; Higham 2002, *Accuracy and Stability of Numerical Algorithms*, §4):
re-associating a sum of k terms changes it by up to about k·u·S, u = 2^-53
(eps = 2^-52), S = Σ|terms|.  The data-parallel gradient Σ_r (b_r/B)·∇ℓ_r is summed
by a ring, a tree or a server in an order the serial run never uses, so an
element is off by δg ≈ k·u·S (k: the partial sums combined, a few per rank).  AdamW
(Loshchilov & Hutter 2017, arXiv 1711.05101) moves θ by η·m̂/(√v̂ + ε), whose slope
in g is at most η/(√v̂ + ε): where |g| ≫ ε the step hardly feels the rounding (at
step 1 it is η·g/|g| = ±η), but where the terms cancel to |g| ≲ ε (1e-8) the slope
reaches η/ε — the m/√v amplification, up to 1e8:

    δθ ≲ η·k·u·S/ε   per step.

The serial run moves a parameter by about η per step, so against the *distance
trained* D = max|θ_ser − θ_0| ≈ η·t the gap is ≲ k·u·S/(ε·t): about 1.2e-8 at worst
for these models (S ≤ max|g| ≈ 0.14 at init, k ≈ 8, t = 1), in practice
~1e-11 (the elements that cancel have S ~ 1e-3) and falling as 1/t while the
distance grows.  It does not grow with the model's size.  Hence two relative gaps:

    param gap = max|θ_par − θ_ser| / max|θ_ser − θ_0|
    loss gap  = max_t |ℓ_par,t − ℓ_ser,t| / max_t |ℓ_ser,t|

(without θ_0 the param gap is taken against max|θ_ser|: a looser yardstick).  The
loss is a sum of positive terms, rounded at ~u relative: its gap stays ~1e-16.

**Growth with steps.**  Training carries a difference forward, and in the noisy
regime of these tiny models it *amplifies* it.  Measured with an in-process
emulation of DDP (tests/mpi/parity_growth.py: the same steps, the gradient summed
over 2 or 3 row slices) on the sweep's models: the param gap stays at 1e-13 to
2e-11 for the first 10 steps at lr 3e-3 to 3e-2 (4e-10 at lr 0.1; loss gaps
≤ 5e-15, ≤ 8e-13 at lr 0.1), then on some seeds grows ×3-5 per step — d_model 64,
4 layers, seed 1, lr 1e-2: 2e-12 at step 10, 1e-9 at 20, 1e-2 at 30 — and after
100 steps at lr 1e-2 half of 18 runs differ by 1e-2 to O(1).  There rounding
decides the trajectory (Lyapunov growth), and no tolerance tells a bug from it.

**A bug's difference.**  A missing 1/N, a skipped bucket, a one-step-stale shard or
a dropped gradient changes g by O(|g|), not O(u·|g|): AdamW then steps in another
direction and the param gap is O(1), and the loss of step 1 moves by O(η·|g|).
Measured (tests/mpi/parity_sweep.py, 18 broken runs of DDP, ZeRO 0-3 and the
parameter server on 2-4 ranks): param gaps 1.0 to 2.0, loss gaps 3.9e-4 (one
bucket skipped) to 0.65 — the smallest gap that catches any of them, also in the
early losses the horizon rule reads, is :data:`BUG_FLOOR` = 3.9e-4.

**The rule.**  Correct runs' ceiling :data:`CORRECT_CEILING` = 2e-11 (measured,
first 10 steps; the sweep's 58 correct runs reach 7.9e-12), bugs' floor 3.9e-4: the
threshold is their geometric middle, √(2e-11 · 3.9e-4) ≈ 9e-8, rounded to
:data:`TOLERANCE` = 1e-7 — about 4000× from each side, and above the worst-case
bound 1.2e-8 of the formula.

1. both gaps ≤ TOLERANCE: **equal**;
2. else, if the run is longer than :data:`HORIZON_STEPS` (10) and the losses of its
   first 10 steps still agree within TOLERANCE: **not comparable** — the training
   amplified rounding past the tolerance; rerun with fewer steps to compare (a
   bug already shows in the early losses, and stays "different");
3. else **different**.

**FP8** (``--precision fp8``, :mod:`minipar.nn.fp8`).  Every rank quantizes the same
tiles and blocks as the serial run (cut in the global tensor's coordinates; a tile or
block that ranks share has its amax all-reduced), but the FP32 sums around the GEMMs —
attention, the promoted chunks, the gradient all-reduce — run in another order
(u = 2^-24), and a value that lands that close to an E4M3 rounding boundary rounds the
other way: a step of 2^-4 of itself, which the next GEMMs and AdamW's m/√v carry.
Measured (``minipar run S -n 2|4 --precision fp8 --fp8-block 6|128``, the test models,
lr 1e-2; dp, zero 1/3, tp, sp, async tp, pp, cp ring/Ulysses, ep, hybrid): after 4
steps param gaps 0 to 3.4e-3 of the distance trained and loss gaps <= 1.6e-7, except
context parallelism with 4 heads and tiles of 4-6 (its attention adds in another order
inside the forward: the flips start in step 1): 0.036-0.051, loss gaps <= 2e-5; after
5 steps <= 0.081 (loss <= 7.8e-5); after 10 steps 0.027-0.22 (loss up to 1.2e-3, as
large as a bug's) — the float32 policy's own gaps stay ~1e-4 there: the flips, not
the sums, make FP8's gap.  So an FP8 run has its own horizon and tolerance:
:data:`FP8_HORIZON_STEPS` = 5; both gaps <= :data:`FP8_TOLERANCE` = 0.2 (about
√(0.081 · 1.0), a bug's param gap 1.0 to 2.0 above: the broken runs' O(1) change of a
gradient turns AdamW's step in FP8 as in float64) is equal; a longer run whose first 5
losses agree within :data:`FP8_EARLY_LOSS_TOLERANCE` = 2e-4 (the correct runs'
7.8e-5 below, the bugs' 3.9e-4 above) is not comparable; anything else is different.
Per-tensor scaling (``--fp8-scaling tensor``): dp, ZeRO, tp, sp, cp and hybrid with one
pass over the batch (pp 1, one micro-batch) all-reduce every GEMM input's amax over the
ranks holding its parts — the batch's rows and tokens (:func:`minipar.parallel.common.fp8_rows`),
a weight's slices and the channels they cut (:class:`minipar.nn.fp8.Split`) — and are held
to the same rule; under micro-batches (pp), experts or ``--tp-overlap`` each micro-batch
or chunk has its own amax, so the run is not comparable (``minipar.run.summary``).
The margin is thinnest there: over seeds 0-5 (4 steps, the test models) per-tensor context
parallelism reached param gaps of 0.12-0.20 (cp 2 ring 0.19 on seed 4, hybrid dp 2 × cp 2
0.20 on seed 1, cp 4 Ulysses 0.17 on seed 0) while its first step's gap stays ~1e-4 — one
flipped E4M3 rounding of a whole-tensor scale, not a missing reduction (dp, tp and sp share
0.019 on seed 2) — so :data:`FP8_CORRECT_CEILING` is the block recipe's measured ceiling,
and a correct per-tensor CP run can fall just either side of :data:`FP8_TOLERANCE`.

Runs that cannot be equal at all — asynchronous updates with staleness > 0,
16-bit or float32 arithmetic (u = 2^-24 or coarser: the rounding gap reaches a
bug's) — get :func:`not_comparable`; :func:`compare` itself answers so for
parameters narrower than float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipar.backend import to_host

#: the largest gap of a correct run in its first HORIZON_STEPS steps (measured, lr <= 3e-2)
CORRECT_CEILING = 2e-11
#: the smallest gap that catches a deliberately broken run (measured: a skipped bucket)
BUG_FLOOR = 3.9e-4
#: the verdict's threshold for both gaps: the geometric middle of ceiling and floor, rounded
TOLERANCE = 1e-7
#: FP8 runs (measured, see the docstring): the largest param gap of a correct run within
#: the FP8 horizon, the threshold of both gaps, the horizon, the early losses' threshold
FP8_CORRECT_CEILING = 0.081
FP8_TOLERANCE = 0.2
FP8_HORIZON_STEPS = 5
FP8_EARLY_LOSS_TOLERANCE = 2e-4
#: steps within which a correct run's gaps stay at CORRECT_CEILING (measured)
HORIZON_STEPS = 10

#: element-wise bounds for ``numpy.testing.assert_allclose`` in the strategies' own tests,
#: which train the default-size model <= 4 steps (|Δθ| <= 1e-13 there); larger models
#: and longer runs exceed them by rounding alone — judge those with :func:`compare`
PARITY_RTOL = 1e-12
PARITY_ATOL = 1e-13

EQUAL, DIFFERENT, NOT_COMPARABLE = "equal", "different", "not comparable"


@dataclass(frozen=True)
class Verdict:
    """The verdict of one run against the serial run (see the module docstring)."""

    status: str  # "equal" | "different" | "not comparable"
    reason: str  # why (for "not comparable": the reason shown to the user)
    max_param_diff: float  # max |θ_par − θ_ser| (nan if not measured)
    max_loss_diff: float  # max over steps of |ℓ_par − ℓ_ser| (nan if not measured)
    tolerance: float  # the threshold both gaps were held to (relative; nan if not held)
    param_gap: float = math.nan  # max_param_diff / distance trained (or / max|θ_ser|)
    loss_gap: float = math.nan  # max_loss_diff / max_t |ℓ_ser,t|
    yardstick: str = "distance trained"  # what param_gap is relative to
    against: str = "the serial run"  # the reference (ZeRO++: the serial ZeRO++ arithmetic)

    @property
    def ok(self) -> bool:
        """False only for "different" (``minipar run`` exits 1 then)."""
        return self.status != DIFFERENT

    def line(self) -> str:
        """The one verdict line ``minipar run`` prints."""
        head = "final parameters: "
        if self.status == NOT_COMPARABLE:
            diff = self.max_param_diff
            measured = f" (max |diff| {_g(diff)})" if not math.isnan(diff) else ""
            return f"{head}not comparable: {self.reason}{measured}"
        word = "equal to" if self.status == EQUAL else "DIFFERENT from"
        worse = (f"; losses {_g(self.loss_gap)} of the loss"
                 if self.loss_gap > self.tolerance else "")
        if self.tolerance == 0.0:  # a reference that repeats the run's arithmetic
            return (f"{head}{word} {self.against}, bit for bit (max |diff| "
                    f"{_g(self.max_param_diff)}, losses {_g(self.max_loss_diff)})")
        return (f"{head}{word} the serial run (max |diff| {_g(self.max_param_diff)}, "
                f"{_g(self.param_gap)} of the {self.yardstick}{worse}; "
                f"tolerance {_g(self.tolerance)})")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly (nan as None), plus ``ok`` and the ``line``."""
        return {"status": self.status, "reason": self.reason, "ok": self.ok,
                "max_param_diff": _num(self.max_param_diff),
                "max_loss_diff": _num(self.max_loss_diff),
                "param_gap": _num(self.param_gap), "loss_gap": _num(self.loss_gap),
                "tolerance": _num(self.tolerance), "yardstick": self.yardstick,
                "against": self.against, "line": self.line()}


def compare(losses: Any, serial_losses: Any, params: Any, serial_params: Any,
            initial_params: Any = None, fp8: bool = False) -> Verdict:
    """The verdict of a run's per-step ``losses`` and final flat ``params`` against the
    serial run's; ``initial_params`` is θ_0 (flat), the start of the distance trained
    (``None``: measure against max|θ_ser| instead).  Arrays of any float dtype,
    compared in float64; float32 or 16-bit parameters give "not comparable" — except
    for ``fp8`` runs (FP32 parameters), held to :data:`FP8_TOLERANCE` within
    :data:`FP8_HORIZON_STEPS` (see the module docstring)."""
    tolerance = FP8_TOLERANCE if fp8 else TOLERANCE
    h, early_tolerance = ((FP8_HORIZON_STEPS, FP8_EARLY_LOSS_TOLERANCE) if fp8
                          else (HORIZON_STEPS, TOLERANCE))
    loss, ser_loss = _flat(losses, "losses"), _flat(serial_losses, "serial losses")
    p, ser_p = _flat(params, "params"), _flat(serial_params, "serial params")
    if loss.size != ser_loss.size:
        raise ValueError(f"{loss.size} losses against {ser_loss.size} serial losses: "
                         "compare runs of the same number of steps")
    if p.size != ser_p.size:
        raise ValueError(f"{p.size} parameters against {ser_p.size} in the serial run: "
                         "not the same model")
    low = [np.dtype(a.dtype).name for a in (to_host(params), to_host(serial_params))
           if a.dtype.itemsize < 8]
    if low and not fp8:
        return not_comparable(f"{low[0]} parameters: their rounding (u = 2^-24 or coarser) is "
                              "as large as a bug's difference; parity is defined for float64",
                              losses, serial_losses, params, serial_params)
    if not (np.isfinite(ser_loss).all() and np.isfinite(ser_p).all()):
        return not_comparable("the serial run itself diverged (a loss or parameter is not "
                              "finite): lower the learning rate", losses, serial_losses,
                              params, serial_params)
    dp, dl = _max_abs(p - ser_p), _max_abs(loss - ser_loss)
    if initial_params is None:
        scale, yardstick = _max_abs(ser_p), "parameters' size"
    else:
        theta0 = _flat(initial_params, "initial params")
        if theta0.size != p.size:
            raise ValueError(f"{theta0.size} initial parameters against {p.size}: "
                             "not the same model")
        scale, yardstick = _max_abs(ser_p - theta0), "distance trained"
    param_gap, loss_gap = _ratio(dp, scale), _ratio(dl, _max_abs(ser_loss))
    args = {"max_param_diff": dp, "max_loss_diff": dl, "tolerance": tolerance,
            "param_gap": param_gap, "loss_gap": loss_gap, "yardstick": yardstick}
    if param_gap <= tolerance and loss_gap <= tolerance:
        return Verdict(EQUAL, f"param gap {_g(param_gap)} and loss gap {_g(loss_gap)} "
                              f"<= tolerance {_g(tolerance)}", **args)
    early = _ratio(_max_abs(loss[:h] - ser_loss[:h]), _max_abs(ser_loss))
    finite = math.isfinite(param_gap) and math.isfinite(loss_gap)  # nan/inf: a broken run
    if loss.size > h and finite and early <= early_tolerance:
        return Verdict(NOT_COMPARABLE,
                       f"after {loss.size} steps the training amplified rounding past the "
                       f"tolerance (the first {h} steps' losses agree within {_g(early)} of "
                       f"the loss); rerun with --steps {h} or fewer to compare", **args)
    return Verdict(DIFFERENT, f"param gap {_g(param_gap)} or loss gap {_g(loss_gap)} "
                              f"> tolerance {_g(tolerance)}", **args)


def bitwise(losses: Any, ref_losses: Any, params: Any, ref_params: Any, against: str) -> Verdict:
    """The verdict of a run against a reference that repeats its arithmetic exactly
    (``against`` names it: ZeRO++'s quantized sums, :mod:`minipar.parallel.zero.oracle`):
    "equal" only when every loss and parameter has the same bits, tolerance 0."""
    loss, ref_loss = _flat(losses, "losses"), _flat(ref_losses, "reference losses")
    p, ref_p = _flat(params, "params"), _flat(ref_params, "reference params")
    if (loss.size, p.size) != (ref_loss.size, ref_p.size):
        raise ValueError(f"{loss.size} losses and {p.size} parameters against "
                         f"{ref_loss.size} and {ref_p.size}: not the same run")
    same = bool(np.array_equal(loss, ref_loss) and np.array_equal(p, ref_p))
    return Verdict(EQUAL if same else DIFFERENT,
                   f"{'the same' if same else 'not the same'} bits as {against}",
                   _max_abs(p - ref_p), _max_abs(loss - ref_loss), 0.0, against=against)


def not_comparable(reason: str, losses: Any = None, serial_losses: Any = None,
                   params: Any = None, serial_params: Any = None) -> Verdict:
    """A run that cannot equal the serial one (async staleness > 0, 16-bit, ...):
    "not comparable: <reason>", ``ok`` True; the diffs are reported when given."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("not_comparable needs a reason to show the user, got "
                         f"{reason!r}")
    dl = dp = math.nan
    if losses is not None and serial_losses is not None:
        a, b = _flat(losses, "losses"), _flat(serial_losses, "serial losses")
        if a.size == b.size:
            dl = _max_abs(a - b)
    if params is not None and serial_params is not None:
        a, b = _flat(params, "params"), _flat(serial_params, "serial params")
        if a.size == b.size:
            dp = _max_abs(a - b)
    return Verdict(NOT_COMPARABLE, reason.strip(), dp, dl, math.nan)


# -- helpers -----------------------------------------------------------------
def _flat(x: Any, what: str) -> np.ndarray:
    """x as a flat float64 host array (bfloat16, an ml_dtypes type, converts too; a device
    array is copied to the host: a verdict is read by people)."""
    a = to_host(x)
    try:
        return a.astype(np.float64).ravel()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be numbers, got dtype {a.dtype}") from e


def _max_abs(a: np.ndarray) -> float:
    """max |a| (0.0 when empty; nan when any element is not finite)."""
    if a.size == 0:
        return 0.0
    return float(np.abs(a).max()) if np.isfinite(a).all() else math.nan


def _ratio(diff: float, scale: float) -> float:
    """diff / scale, with 0/0 = 0 and x/0 = inf (a run that should not have moved did)."""
    if math.isnan(diff) or math.isnan(scale):
        return math.nan
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def _num(x: float) -> float | None:
    """x for JSON: None when not finite (not measured, or a run that should not have moved)."""
    return float(x) if math.isfinite(x) else None


def _g(x: float) -> str:
    """Two significant digits, exponent unpadded: 1.3e-13, 4e-12, 0.07."""
    return "nan" if math.isnan(x) else f"{x:.2g}".replace("e-0", "e-").replace("e+0", "e+")
