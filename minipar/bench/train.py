"""Training benchmark — замер обучения — 训练基准测试: ``minipar bench train``.

minipar and PyTorch train the same GPT on the same text: tokens/s side by side.

``minipar bench model`` times one forward+backward; this benchmark times what a
user runs, training, at nanoGPT's small CPU settings (``train_shakespeare_char``
on a laptop: 4 layers, 4 heads, width 128, context 64, batch 12), in float32
on one thread, on the text shipped in the package (bytes, vocabulary 256).

The comparison is of code, not of recipes, so everything but the code is the
same on both sides:

* **the same initial weights**: ``RunSpec.initial_params()`` (float64,
  ``minipar.nn.GPT.init``) rounded to float32, on both sides;
* **the same batches**: ``RunSpec.batch_at(step)`` for training and
  ``RunSpec.eval_batch_at(k)`` (the held-out 10% of the text) for validation;
* **the same model**: :func:`minipar.bench.model.torch_gpt_loss` is minipar's
  GPT written with PyTorch ops (``F.scaled_dot_product_attention`` as in nanoGPT);
* **the same optimizer**: AdamW (Loshchilov & Hutter 2017, arXiv 1711.05101)
  with nanoGPT's ``train_shakespeare_char`` values (lr 1e-3, betas (0.9, 0.99),
  eps 1e-8, weight decay 0.1) at a constant learning rate and without gradient
  clipping (minipar has none), and weight decay on every parameter (minipar has
  no mask).  ``minipar.optim.AdamW`` and ``torch.optim.AdamW`` do the same
  update in exact arithmetic: θ ← θ(1 − ηλ) (decoupled), m ← β₁m + (1 − β₁)g,
  v ← β₂v + (1 − β₂)g², θ ← θ − η/(1 − β₁ᵗ) · m / (√(v/(1 − β₂ᵗ)) + ε).  They round
  differently: PyTorch updates m with ``lerp`` (m + (1 − β₁)(g − m)) and
  divides √v by √(1 − β₂ᵗ) instead of taking √ of v/(1 − β₂ᵗ);
* **the same loop**: both sides are stepped by :func:`minipar.parallel.loop.train`
  (the loop of ``minipar train``), which times only the steps (forward, backward,
  optimizer), not the batches or the validation.

So the losses agree step by step *to rounding grown over the run*, and how much
rounding grows is measured, not assumed.  Training amplifies a difference in the
weights: the per-step relative difference of the losses of two float32 runs that
start one rounding apart grows from ~1e-7 to ~1e-3 in 50 steps of these settings
(and from ~1e-16 to ~1e-12 in float64: the same factor, ~10⁴), by how much
depending on the batches, hence on the embedded text, which changes with every
commit (:mod:`minipar.data.corpus`: the package's own docstrings).  So:

* ``--precision float64`` (both sides in float64) is the exact comparison: the
  losses must agree to :data:`AGREEMENT_RTOL` ``["float64"]`` (1e-8, rounding
  amplified 10⁸-fold) at every step of the whole run; an arithmetic difference
  between the two updates shows here;
* at float32 (the default, the speed comparison) the report says through which
  step the losses agree to 1e-4 and where they part, beside the *rounding band*:
  minipar against itself with every initial weight moved by one unit in the last
  place (:func:`rounding_band`).  Parting inside the band (at most
  :data:`BAND_FACTOR` times it) is float32 rounding grown by training, printed as
  such; beyond it the losses DIFFER.

(Found in issue 35: at one commit the float32 check printed "losses DIFFER", 9.5e-4
over 50 steps, where an earlier commit measured 7.4e-7; neither minipar's AdamW,
its fused form being bit for bit :meth:`minipar.optim.AdamW.step_unfused`, nor any
other arithmetic had changed: the corpus had, and minipar against itself one
rounding apart parted by 1.1e-3 on the same batches; float64 agreed to 3.6e-13.)

Speed is tokens per CPU second of the measuring process (``time.process_time``,
as ``minipar bench model``: on a shared machine wall time also counts the time
other processes hold the core), wall-clock tokens/s beside it, both over the
steps after the first (the warm-up).  Each side runs in its own subprocess with one
BLAS thread (``OMP_NUM_THREADS=1`` and friends; PyTorch also gets
``torch.set_num_threads(1)``), one after the other.  PyTorch is optional:
without it minipar trains alone and a line says PyTorch was skipped.  A progress
bar on stderr counts the steps (:mod:`minipar.progress`).

    minipar bench train                  # 50 steps, validation every 10
    minipar bench train --precision float64   # the exact comparison: agree to 1e-8
    minipar bench train --steps 200 --json-out train.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from minipar import checks
from minipar.bench import emit
from minipar.bench.model import THREAD_VARS, torch_gpt_loss
from minipar.cli.options import ArgumentParser, add_json_options, integer, number
from minipar.parallel import loop, strategies
from minipar.parallel.common import EMBEDDED, RunSpec
from minipar.parallel.engine import Batch, StepResult
from minipar.progress import tick

#: nanoGPT's small CPU model (its README, ``train_shakespeare_char`` on a laptop)
NANOGPT_CPU = {"layers": 4, "heads": 4, "d_model": 128, "seq": 64, "batch": 12}
#: ``train_shakespeare_char``'s AdamW, at a constant learning rate
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.99), 1e-8, 0.1
#: the two sides give the same losses to this relative difference, per precision: float64
#: at every step of the run; float32 through the step where the trajectories part
AGREEMENT_RTOL = {"float32": 1e-4, "float64": 1e-8}
#: float32 parting within this factor of the rounding band is rounding grown by training
BAND_FACTOR = 10.0
PRECISIONS = tuple(AGREEMENT_RTOL)
SIDES = ("minipar", "pytorch")


class TorchGPT:
    """The PyTorch side: :func:`~minipar.bench.model.torch_gpt_loss` on tensors (the spec's
    precision, float32 or float64) of
    the spec's initial weights, ``torch.optim.AdamW`` with the spec's lr, betas, eps and
    weight decay.  It has the two methods of an engine (:class:`minipar.parallel.engine.Engine`)
    that the training loop calls, ``step`` and ``evaluate``, so the same loop drives it."""

    def __init__(self, torch: Any, spec: RunSpec) -> None:
        self.torch, self.spec = torch, spec
        dtype = np.dtype(spec.precision)  # float32 or float64, as minipar's side
        self.params = {k: torch.tensor(v.astype(dtype), requires_grad=True)
                       for k, v in spec.initial_params().items()}
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=spec.lr,
                                           betas=spec.betas, eps=spec.eps,
                                           weight_decay=spec.weight_decay)

    def _loss(self, batch: Batch) -> Any:
        x, y = (self.torch.from_numpy(np.asarray(a, dtype=np.int64))
                for a in (batch.tokens, batch.targets))
        return torch_gpt_loss(self.torch, self.params, x, y, self.spec.layers, self.spec.heads)

    def step(self, batch: Batch) -> StepResult:
        """One AdamW step on ``batch``; the loss before the update (as minipar's engines)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(batch)
        loss.backward()
        self.optimizer.step()
        return StepResult(float(loss.detach()))

    def evaluate(self, batch: Batch) -> float:
        """The loss on ``batch``, forward only."""
        with self.torch.no_grad():
            return float(self._loss(batch))


class StepTimer:
    """An engine whose steps are timed, each in CPU seconds of this process (``cpu``) and
    in wall seconds (``wall``), and counted on a progress file (:func:`minipar.progress.tick`)."""

    def __init__(self, engine: Any, progress: str | None = None) -> None:
        self.engine, self.progress = engine, progress
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def step(self, batch: Batch) -> StepResult:
        c0, w0 = time.process_time(), time.perf_counter()
        result = self.engine.step(batch)
        self.cpu.append(time.process_time() - c0)
        self.wall.append(time.perf_counter() - w0)
        tick(self.progress)
        return result

    def evaluate(self, batch: Batch) -> float:
        return self.engine.evaluate(batch)

    def tokens_per_second(self, tokens_per_step: int, clock: str = "cpu") -> float:
        """Tokens per second of ``clock`` (``"cpu"`` or ``"wall"``) over the steps after
        the first (the warm-up: first allocations, PyTorch's lazy initialisation), or over
        the one step of a one-step run."""
        times = self.cpu if clock == "cpu" else self.wall
        timed = times[1:] or times
        return tokens_per_step * len(timed) / sum(timed) if sum(timed) > 0 else 0.0


def spec_of(layers: int, heads: int, d_model: int, seq: int, batch: int, steps: int,
            lr: float = LR, weight_decay: float = WEIGHT_DECAY,
            precision: str = "float32") -> RunSpec:
    """The run both sides train: the embedded text, float32 (or float64), nanoGPT's AdamW."""
    return RunSpec(text=EMBEDDED, vocab=256, seq=seq, d_model=d_model, layers=layers,
                   heads=heads, batch=batch, steps=steps,
                   precision=checks.one_of("--precision", precision, PRECISIONS), lr=lr,
                   betas=BETAS, eps=EPS, weight_decay=weight_decay)


def rounding_band(spec: RunSpec) -> list[float]:
    """minipar's training losses of ``spec`` with every initial weight moved up by one
    unit in the last place of the precision (``numpy.nextafter``): the run one rounding
    away.  Its per-step difference from the unmoved run is what rounding alone, grown
    by training, makes of the losses (the band the PyTorch side is judged against)."""
    engine = strategies.build("serial", spec)
    params = engine.states.params
    params[...] = np.nextafter(params, np.inf)
    return loop.train(engine, spec.batch_at, spec.steps).losses


def measure(spec: RunSpec, side: str, eval_every: int, eval_batches: int,
            progress: str | None = None, band: bool = False) -> dict[str, Any]:
    """Train ``side`` (``"minipar"``: the serial engine; ``"pytorch"``: :class:`TorchGPT`)
    for ``spec.steps`` steps in this process (call it with one BLAS thread).

    Returns ``{"side", "losses": [per step], "validation": [[step, loss], ...],
    "tokens", "cpu_seconds" and "seconds" (wall) of all the steps, "tokens_per_s" (per
    CPU second) and "wall_tokens_per_s" after the first step (:class:`StepTimer`)}``;
    with ``band`` (minipar's side) also ``"band"``: the training losses of
    :func:`rounding_band`, trained after the timed run."""
    if checks.one_of("side", side, SIDES) == "pytorch":
        import torch  # type: ignore[import-not-found]

        torch.set_num_threads(1)
        engine: Any = TorchGPT(torch, spec)
    else:
        engine = strategies.build("serial", spec)
    timer = StepTimer(engine, progress)
    h = loop.train(timer, spec.batch_at, spec.steps, eval_source=spec.eval_batch_at,
                   eval_every=eval_every, eval_batches=eval_batches)
    per_step = spec.batch * spec.seq
    extra = {"band": rounding_band(spec)} if band and side == "minipar" else {}
    return {"side": side, **extra, "losses": h.losses,
            "validation": sorted(h.validation.items()),
            "tokens": h.tokens, "cpu_seconds": sum(timer.cpu), "seconds": sum(timer.wall),
            "tokens_per_s": timer.tokens_per_second(per_step, "cpu"),
            "wall_tokens_per_s": timer.tokens_per_second(per_step, "wall")}


def max_relative_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    """max |a − b| / |b| over the training losses of every step and the validation losses
    of two :func:`measure` results of the same run (``b`` the reference)."""
    ours = list(a["losses"]) + [v for _, v in a["validation"]]
    ref = list(b["losses"]) + [v for _, v in b["validation"]]
    if len(ours) != len(ref):
        raise ValueError(f"the runs differ in length: {len(ours)} vs {len(ref)} losses")
    return max((abs(x - y) / abs(y) if y else abs(x - y)) for x, y in zip(ours, ref))


def torch_skipped(no_torch: bool) -> str | None:
    """Why the PyTorch side is not run (``--no-torch``, or not installed); None: run it."""
    if no_torch:
        return "PyTorch: skipped (--no-torch): minipar only"
    if importlib.util.find_spec("torch") is None:
        return "PyTorch: not installed, skipped: minipar only (pip install torch to compare)"
    return None


def relative_differences(a: list[float], b: list[float]) -> list[float]:
    """|a − b| / |b| step by step (``b`` the reference)."""
    return [abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(a, b)]


def agreement(rows: list[dict[str, Any]], precision: str) -> dict[str, Any]:
    """What the two sides' losses say (``rows``: minipar's, then PyTorch's :func:`measure`).

    ``max_relative_difference`` over the run (training and validation), ``agree_through``:
    the last step through which every training loss agrees to :data:`AGREEMENT_RTOL`
    (the whole run: ``steps``), ``parts_at``: the first step beyond it (None), and where
    minipar's row has a ``"band"``, ``band``: the largest per-step difference of the
    rounding band (:func:`rounding_band`) over the run.  ``verdict``: ``"agree"`` (within
    the tolerance at every step); at float32 ``"rounding"`` (the trajectories part, but
    by at most :data:`BAND_FACTOR` times the band: rounding grown by training);
    else ``"DIFFER"``."""
    ours, ref = rows
    rtol = AGREEMENT_RTOL[precision]
    per_step = relative_differences(ours["losses"], ref["losses"])
    parted = [i for i, d in enumerate(per_step) if d > rtol]
    out: dict[str, Any] = {"rtol": rtol, "max_relative_difference":
                           max_relative_difference(ours, ref), "per_step": per_step,
                           "agree_through": parted[0] if parted else len(per_step),
                           "parts_at": parted[0] + 1 if parted else None}
    if "band" in ours:
        out["band"] = max(relative_differences(ours["band"], ours["losses"]), default=0.0)
    if out["max_relative_difference"] <= rtol:
        out["verdict"] = "agree"
    elif precision == "float32" and out["max_relative_difference"] <= BAND_FACTOR * out.get(
            "band", 0.0):
        out["verdict"] = "rounding"
    else:
        out["verdict"] = "DIFFER"
    return out


def agreement_line(a: dict[str, Any], precision: str, steps: int) -> str:
    """One line under the table: agree, part (and why), or differ."""
    diff = f"max relative difference over the run {a['max_relative_difference']:.1e}"
    if a["verdict"] == "agree":
        return f"losses agree: {diff} (<= {a['rtol']:g} expected, {precision}, every step)"
    band = (f"; minipar against itself one rounding apart (every initial weight moved by "
            f"one ulp): {a['band']:.1e}" if "band" in a else "")
    where = (f"agree to {a['rtol']:g} through step {a['agree_through']}, part from step "
             f"{a['parts_at']}" if a["parts_at"] else f"every step agrees to {a['rtol']:g}, "
             "validation does not")
    if a["verdict"] == "rounding":
        return (f"losses {where} ({diff}{band}): float32 rounding grown by training, within "
                f"{BAND_FACTOR:g}x the band; --precision float64 for the exact comparison")
    return f"losses DIFFER: {where} ({diff}{band}; {precision}, {steps} steps)"


def report(spec: RunSpec, rows: list[dict[str, Any]], skipped: str | None) -> str:
    """The table: one row per side, then the ratio and the agreement (or the skip line)."""
    text = spec.text_data()
    model = (f"GPT {spec.layers} layers x {spec.heads} heads, d_model {spec.d_model}, context "
             f"{spec.seq}, batch {spec.batch}, {spec.precision}, one thread; {text.name} "
             f"({text.data.size:,} bytes)")
    run = (f"AdamW lr {spec.lr:g}, betas {spec.betas}, weight decay {spec.weight_decay:g}, "
           f"constant, no clipping; {spec.steps} steps from the same weights on the same "
           "batches; tokens/s after the first step")
    lines = [model, run]
    last = rows[0]["validation"][-1][0] if rows[0]["validation"] else None
    head = (f"{'side':<8} {'tok/s (CPU)':>12} {'tok/s (wall)':>13} {'last loss':>10} "
            f"{'validation' + (f' @{last}' if last else ''):>16}")
    lines += [head, "-" * len(head)]
    for r in rows:
        val = f"{r['validation'][-1][1]:16.4f}" if r["validation"] else f"{'-':>16}"
        lines.append(f"{r['side']:<8} {r['tokens_per_s']:12,.0f} {r['wall_tokens_per_s']:13,.0f} "
                     f"{r['losses'][-1]:10.4f} {val}")
    if skipped:
        lines.append(skipped)
    else:
        ratio = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
        lines.append(f"speed minipar / pytorch: {ratio:.2f}x (tokens per CPU second)")
        lines.append(agreement_line(agreement(rows, spec.precision), spec.precision,
                                    spec.steps))
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="minipar bench train", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=integer(1), default=50,
                   help="training steps on each side (default %(default)s)")
    p.add_argument("--eval-every", type=integer(1), default=10,
                   help="validation every K steps, at most --steps (default %(default)s)")
    p.add_argument("--eval-batches", type=integer(1), default=4,
                   help="held-out batches averaged per validation (default %(default)s)")
    sizes = {"layers": "transformer blocks", "heads": "attention heads, dividing --d-model",
             "d_model": "model width", "seq": "context length in bytes",
             "batch": "sequences per step"}
    for name, value in NANOGPT_CPU.items():
        p.add_argument("--" + name.replace("_", "-"), type=integer(1), default=value,
                       help=f"{sizes[name]} (default %(default)s: nanoGPT's CPU setting)")
    p.add_argument("--lr", type=number(greater_than=0), default=LR,
                   help="AdamW learning rate, constant (default %(default)s)")
    p.add_argument("--weight-decay", type=number(minimum=0), default=WEIGHT_DECAY,
                   help="AdamW decoupled weight decay (default %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default="float32",
                   help="both sides' dtype (default %(default)s: the speed comparison; "
                        "float64: the exact comparison, losses agree to 1e-8 every step)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    add_json_options(p, "both sides' losses and speeds")
    p.add_argument("--inner", choices=SIDES, help=argparse.SUPPRESS)  # the measuring process
    p.add_argument("--progress", help=argparse.SUPPRESS)  # the inner process's progress file
    p.add_argument("--band", action="store_true", help=argparse.SUPPRESS)  # rounding_band too
    return p


def _spec(p: ArgumentParser, a: argparse.Namespace) -> RunSpec:
    if a.eval_every > a.steps:
        p.error(f"--eval-every must be at most --steps ({a.steps}), got {a.eval_every}: "
                "no validation would run")
    try:
        return spec_of(a.layers, a.heads, a.d_model, a.seq, a.batch, a.steps, a.lr,
                       a.weight_decay, a.precision)
    except ValueError as e:  # a head count that does not divide d_model, a context too long
        p.error(str(e))


def main(argv: list[str]) -> int:
    from minipar.progress import watched

    p = _parser()
    a = p.parse_args(argv)
    spec = _spec(p, a)
    if a.inner:  # the measuring subprocess: print the result as JSON
        print(json.dumps(measure(spec, a.inner, a.eval_every, a.eval_batches, a.progress,
                                 band=a.band)))
        return 0
    skipped = torch_skipped(a.no_torch)
    sides = SIDES[:1] if skipped else SIDES
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    cmd = [sys.executable, "-m", "minipar.bench.train", "--steps", str(a.steps),
           "--eval-every", str(a.eval_every), "--eval-batches", str(a.eval_batches),
           *(x for name in NANOGPT_CPU for x in ("--" + name.replace("_", "-"),
                                                 str(getattr(a, name)))),
           "--lr", repr(a.lr), "--weight-decay", repr(a.weight_decay),
           "--precision", a.precision,
           *(["--band"] if not skipped and a.precision == "float32" else [])]
    rows = []
    with watched(a.steps * len(sides), "step") as progress:  # (the band run is not counted)
        for side in sides:
            proc = subprocess.run(cmd + ["--inner", side, "--progress", progress], env=env,
                                  capture_output=True, text=True, timeout=3600, check=False)
            if proc.returncode:  # a crash while measuring, not bad input: show all of it
                print(proc.stderr, file=sys.stderr)
                return proc.returncode
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"spec": spec.as_dict(), "sides": rows, "skipped": skipped}
    if not skipped:
        out["ratio"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
        out["max_relative_difference"] = max_relative_difference(rows[0], rows[1])
        out["agreement"] = agreement(rows, spec.precision)
    return emit("minipar bench train", a, out, report(spec, rows, skipped))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
