"""``minipar bench remat``: activation memory against compute, measured — рематериализация — 重计算.

EN activation checkpointing benchmark · RU замер рематериализации · ZH 激活重计算基准

Chen, Xu, Zhang & Guestrin 2016, "Training Deep Nets with Sublinear Memory
Cost", arXiv 1604.06174: checkpointing every k = ⌈√n⌉ of n units holds
⌈n/k⌉ checkpoints + one segment, about 2√n units of activations instead of
n, for one extra forward.  For n = 4 … 32 transformer blocks this measures,
for one forward + backward of a GPT, side by side:

* ``peak_plain`` / ``peak_remat`` — tracemalloc's peak (bytes above the
  parameters), with the gradients dropped as they come (as an optimizer or a
  DDP bucket would take them), so the peak is the activations' — O(n)
  against O(√n);
* ``held_plain`` / ``held_remat`` — the activation bytes the hooks hold at
  most, by the ledger (:class:`~minipar.parallel.offload.measure.ActivationLedger`'s
  ``bytes_peak`` around the :class:`~minipar.parallel.remat.Checkpointing`; plainly,
  every unit's ``saved``);
* ``time_ratio`` — median CPU time of a remat step over a plain one (target:
  one extra forward, ≤ 1.45×; forward ≈ ⅓ of a step, so ≈ 1.33×), and
  ``forwards`` — unit forwards run, n + recomputed
  (:func:`minipar.plan.checkpointing.recompute_forward_layers`).

Measured in a subprocess with one BLAS thread (CPU time, as ``minipar bench
model``); times are ratios within one run, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from minipar.bench import emit
from minipar.cli.options import ArgumentParser, add_json_options, integer
from minipar.nn.executor import Hooks

PROG = "minipar bench remat"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
DEFAULT_LAYERS = (4, 8, 16, 32)
#: the GPT's other sizes: d_model, heads, seq, batch, vocab
DEFAULT_SIZE = {"d_model": 64, "heads": 4, "seq": 64, "batch": 8, "vocab": 64}


class Sink(Hooks):
    """Serial hooks that drop each unit's gradients as they come (what an optimizer
    or a DDP bucket does with them), so a step's memory peak is its activations'."""

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        self.seen = getattr(self, "seen", 0) + len(grads)


def setup(n_layer: int, d_model: int = 64, heads: int = 4, seq: int = 64, batch: int = 8,
          vocab: int = 64, dtype: str = "float32") -> tuple[Any, dict, Any, Any]:
    """(units, params, tokens, targets) of a GPT with ``n_layer`` blocks."""
    import numpy as np

    from minipar.nn import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=vocab, block_size=seq, n_layer=n_layer, n_head=heads,
                          d_model=d_model, dtype=dtype))
    p = model.init(0)
    r = np.random.default_rng(0)
    x = r.integers(0, vocab, (batch, seq))
    return model.units(), p, x, np.roll(x, -1, axis=1)


def step(units: Any, hooks: Any, x: Any, y: Any) -> float:
    from minipar.nn import executor

    return executor.loss_and_grads(units, hooks, x, y)


def _median_cpu(fn: Any, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def measure(layers: list[int], repeat: int = 5, every: int | None = None,
            **size: Any) -> list[dict[str, Any]]:
    """One row per n (blocks): memory peaks, ledger bytes, CPU-time ratio, forwards run."""
    from minipar.memory import measure as traced
    from minipar.memory import nbytes
    from minipar.nn import executor
    from minipar.parallel.offload.measure import ActivationLedger
    from minipar.parallel.remat import Checkpointing, default_every
    from minipar.plan.checkpointing import recompute_forward_layers

    size = {**DEFAULT_SIZE, **size}
    rows = []
    for n_layer in layers:
        units, p, x, y = setup(n_layer, **size)
        n = len(units)
        k = default_every(n) if every is None else every
        step(units, Sink(p), x, y)  # first-use caches (causal mask) outside the regions
        with traced() as plain:
            step(units, Sink(p), x, y)
        ck = ActivationLedger(Checkpointing(Sink(p), units, every=k))
        with traced() as remat:
            step(units, ck, x, y)
        held_plain = nbytes(executor.forward(units, Hooks(p), x)[1])
        t_plain = _median_cpu(lambda u=units, p=p, x=x, y=y: step(u, Sink(p), x, y), repeat)
        t_remat = _median_cpu(lambda u=units, p=p, x=x, y=y, k=k: step(
            u, Checkpointing(Sink(p), u, every=k), x, y), repeat)
        rows.append({"layers": n_layer, "units": n, "every": k,
                     "peak_plain": plain.peak_bytes, "peak_remat": remat.peak_bytes,
                     "held_plain": held_plain, "held_remat": ck.bytes_peak,
                     "forwards": n + recompute_forward_layers(n, k),
                     "plain_s": t_plain, "remat_s": t_remat, "time_ratio": t_remat / t_plain})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The curve and the time ratio side by side (MB = 10^6 bytes)."""
    head = (f"{'layers':>6} {'k':>3} {'peak plain':>11} {'peak remat':>11} {'mem ratio':>9} "
            f"{'held plain':>11} {'held remat':>11} {'fwd/units':>9} {'time ratio':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['layers']:>6} {r['every']:>3} {r['peak_plain'] / 1e6:9.2f}MB "
                     f"{r['peak_remat'] / 1e6:9.2f}MB {r['peak_plain'] / r['peak_remat']:8.2f}x "
                     f"{r['held_plain'] / 1e6:9.2f}MB {r['held_remat'] / 1e6:9.2f}MB "
                     f"{r['forwards']:>4}/{r['units']:<4} {r['time_ratio']:9.2f}x")
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", nargs="+", type=integer(1, 256), default=list(DEFAULT_LAYERS),
                   help="numbers of transformer blocks (default 4 8 16 32)")
    p.add_argument("--every", type=integer(1), default=None,
                   help="units per checkpointed segment (default ceil(sqrt(units)))")
    p.add_argument("--repeat", type=integer(1), default=5,
                   help="timed steps per size, the median is shown (default %(default)s)")
    p.add_argument("--d-model", type=integer(1), default=DEFAULT_SIZE["d_model"],
                   help=f"model width (default {DEFAULT_SIZE['d_model']})")
    p.add_argument("--seq", type=integer(1), default=DEFAULT_SIZE["seq"],
                   help=f"sequence length (default {DEFAULT_SIZE['seq']})")
    p.add_argument("--batch", type=integer(1), default=DEFAULT_SIZE["batch"],
                   help=f"batch (default {DEFAULT_SIZE['batch']})")
    add_json_options(p, "the rows")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    size = dict(DEFAULT_SIZE)
    a = p.parse_args(argv)
    if a.every is not None and a.every > min(a.layers) + 2:
        p.error(f"--every {a.every} exceeds the {min(a.layers) + 2} units of the smallest "
                f"model (--layers {min(a.layers)} + embedding + head)")
    size.update(d_model=a.d_model, seq=a.seq, batch=a.batch)
    if a.d_model % size["heads"]:
        p.error(f"--d-model {a.d_model} must be a multiple of {size['heads']} (the heads)")
    if a.inner:  # the measuring subprocess: print rows as JSON
        print(json.dumps(measure(a.layers, a.repeat, a.every, **size)))
        return 0
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    proc = subprocess.run([sys.executable, "-m", "minipar.bench.remat", "--inner", *argv],
                          env=env, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode:  # a crash while measuring, not bad input: show all of it
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    text = (f"activation checkpointing, GPT d_model {a.d_model}, batch {a.batch} x seq {a.seq}, "
          f"float32, one thread; peak = tracemalloc over one forward+backward (gradients "
          f"dropped), held = activations on the ledger, time = median CPU time of "
          f"{a.repeat} steps, remat / plain (ideal 4/3 = "
          f"1.33x: one extra forward, a forward being 1/3 of a step; Chen et al. 2016 measured "
          f"+30% on a 1,000-layer ResNet)\n" + table(rows))
    return emit(PROG, a, rows, text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
