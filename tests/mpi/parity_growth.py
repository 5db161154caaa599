"""How a correct run's rounding gap grows with steps: the numbers in parity.py's docstring.

One process, no MPI (so it can run long): the serial step, and the step DDP on N
ranks computes — the same model and optimizer, but the gradient summed over the
N row slices of the global batch, each weighted b_r/B (what
:mod:`minipar.parallel.data_parallel.ddp` all-reduces), i.e. the same numbers added
in another order.  Prints, per model, seed and learning rate, the param gap
``max|θ_a − θ_b| / max|θ_a − θ_0|`` and the loss gap after selected steps, and
the first step at which each exceeds 1e-10.

    python tests/mpi/parity_growth.py [steps=40] [ranks=3]   # about a minute
"""

from __future__ import annotations

import sys

import numpy as np

from minipar.parallel.common import RunSpec, loss_weight
from minipar.precision import ModelStates

SIZES = {
    "default": RunSpec(),
    "issue": RunSpec(d_model=40, layers=3, heads=4, vocab=29, seq=10, batch=14),
    "d64x4": RunSpec(d_model=64, layers=4, heads=4, vocab=32, seq=12, batch=16),
}


def gaps(spec: RunSpec, ranks: int) -> list[tuple[float, float]]:
    """(param gap, loss gap) after each of ``spec.steps`` steps: serial vs sliced sum."""
    model = spec.model()
    a, b = (ModelStates(spec.precision, spec.initial_params(), spec.optimizer, **spec.opt_kwargs())
            for _ in range(2))
    theta0 = a.params.copy()
    va, vb = a.param_views(), b.param_views()
    out = []
    for s in range(spec.steps):
        la, ga = model.loss_and_grads(va, *spec.global_batch(s))
        a.set_grads(ga)
        a.step()
        lb, total = 0.0, np.zeros_like(b.grads)
        for r in range(ranks):
            w = loss_weight(spec.batch, r, ranks)
            loss, g = model.loss_and_grads(vb, *spec.local_batch(s, r, ranks), loss_scale=w)
            lb += w * loss
            total += b.layout.flatten(g)
        b.grads[...] = total
        b.step()
        moved = np.abs(a.params - theta0).max()
        out.append((float(np.abs(a.params - b.params).max() / moved), abs(la - lb) / abs(la)))
    return out


def main(steps: int = 40, ranks: int = 3) -> None:
    show = [t for t in (1, 3, 10, 20, 30, 50, 100) if t <= steps]
    print(f"{ranks} slices; param gap / loss gap after steps {show}; first step > 1e-10")
    for lr in (3e-3, 1e-2, 3e-2, 1e-1):
        for name, base in SIZES.items():
            for seed in (0, 1, 2):
                g = gaps(base.with_(seed=seed, lr=lr, steps=steps), ranks)
                first = [next((t + 1 for t, x in enumerate(g) if x[k] > 1e-10), None)
                         for k in (0, 1)]
                cells = " ".join(f"{g[t - 1][0]:.0e}/{g[t - 1][1]:.0e}" for t in show)
                print(f"lr {lr:<6g} {name:8} seed {seed}: {cells}   first {first}", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
