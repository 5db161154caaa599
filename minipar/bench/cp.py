"""``minipar bench cp``: ring attention, all-gather, Ulysses and USP side by side.

EN context parallelism compared · RU сравнение видов контекстного параллелизма ·
ZH 上下文并行各方式对比

One launch of cp ranks (default 4, one BLAS thread each) trains the same GPT (default
2 blocks, d_model 64, 8 heads, ``--kv-heads``) with every kind of context parallelism,
at each of three (or more) growing sequence lengths ``--seqs``:

* ``ring`` — ring attention, zigzag (Liu et al. 2023; Brandon et al. 2023);
* ``allgather`` — Llama 3's all-gather of K and V, zigzag (arXiv 2407.21783, §3.3.2);
* ``ulysses`` — DeepSpeed-Ulysses (Jacobs et al. 2023), when the heads divide by cp;
* ``usp`` — Ulysses over ``--ulysses`` ranks × ring over cp/U groups (Fang & Zhao 2024).

For each (kind, s): the median step time (forward, backward, the gradient all-reduce and
the AdamW step; the slowest rank's wall clock) over ``--steps`` after a warm-up, the bytes
rank 0 sent per step counted by the traced communicator next to the exact formula
(:func:`minipar.parallel.context_parallel.measure.step_bytes_formula`), and the attention
activation bytes per layer on rank 0 (the ledger of what the core saved) next to
:func:`~minipar.parallel.context_parallel.measure.attention_activation_formula`.  Timings
on a shared machine are noisy: compare kinds within one run; bytes and memory are exact.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from minipar.cli.options import ArgumentParser, integer, seconds

PROG = "minipar bench cp"
KINDS = ("ring", "allgather", "ulysses", "usp")


def _kinds(o: dict[str, Any]) -> list[str]:
    """The kinds this size can run: Ulysses needs the heads divisible by cp, USP cp > U."""
    n, h = o["ranks"], o["heads"]
    return [k for k in KINDS if (k != "ulysses" or h % n == 0)
            and (k != "usp" or (n > o["ulysses"] and n % o["ulysses"] == 0))]


def _worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: every kind at every sequence length; rank 0 returns the rows."""
    import numpy as np

    from minipar.bench.dp import measure_step_time
    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid
    from minipar.nn.dtypes import compute_dtype
    from minipar.parallel.common import RunSpec
    from minipar.parallel.context_parallel.engine import ContextParallel
    from minipar.parallel.context_parallel.measure import (
        attention_activation_formula,
        measured_attention_activation,
        step_bytes_formula,
    )

    comm = TracedComm()
    n = comm.size
    grid = Grid(comm, cp=n)
    rows = []
    for s in o["seqs"]:
        spec = RunSpec(vocab=16, seq=s, d_model=o["d_model"], layers=o["layers"],
                       heads=o["heads"], kv_heads=o["kv_heads"], batch=o["batch"],
                       precision=o["precision"], steps=o["steps"])
        for kind in _kinds(o):
            cp = ContextParallel(grid, spec, kind, kind != "ulysses",
                                 o["ulysses"] if kind == "usp" else None)
            batch = spec.batch_at(0)
            cp.step(batch)  # warm-up
            comm.stats.reset()
            dt = measure_step_time(lambda _: cp.step(batch), o["steps"], comm, warmup=0)
            sent = comm.stats.bytes_sent() / o["steps"]
            exact = sum(step_bytes_formula(cp).values())
            _, kept = cp.forward(cp.states.param_views(), batch.tokens)
            act = measured_attention_activation(kept)[0]
            del kept
            i = np.dtype(cp.cfg.dtype).itemsize
            f = attention_activation_formula(
                kind, spec.batch, s, spec.d_model, spec.heads, n, i,
                compute_dtype(cp.cfg.dtype).itemsize, cp.cfg.n_kv_head,
                o["ulysses"] if kind == "usp" else 1)
            serial = attention_activation_formula("serial", spec.batch, s, spec.d_model,
                                                  spec.heads, 1, i, None, cp.cfg.n_kv_head)
            rows.append({"kind": kind, "seq": s, "step_s": dt, "bytes_per_step": sent,
                         "bytes_formula": exact, "activation_per_layer": act,
                         "activation_formula": f, "serial_activation": serial})
            cp.close()
    grid.free()
    return {"cp": n, "rows": rows} if comm.rank == 0 else None


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("-n", "--ranks", type=integer(2), default=4,
                   help="ranks = the context-parallel size cp (default %(default)s)")
    p.add_argument("--seqs", type=integer(2), nargs="+", default=[128, 256, 512],
                   help="sequence lengths, growing (default 128 256 512)")
    p.add_argument("--d-model", type=integer(1), default=64, help="width (default %(default)s)")
    p.add_argument("--heads", type=integer(1), default=8, help="heads (default %(default)s)")
    p.add_argument("--kv-heads", type=integer(0), default=0,
                   help="key/value heads (default 0: as many as --heads)")
    p.add_argument("--layers", type=integer(1), default=2, help="blocks (default %(default)s)")
    p.add_argument("--batch", type=integer(1), default=2, help="rows (default %(default)s)")
    p.add_argument("--ulysses", type=integer(1), default=2,
                   help="USP's Ulysses ranks per group (default %(default)s)")
    p.add_argument("--steps", type=integer(1), default=3,
                   help="timed steps after one warm-up (default %(default)s)")
    p.add_argument("--precision", choices=["float32", "float64"], default="float32",
                   help="dtype (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--timeout", type=seconds, default=600.0,
                   help="seconds before every rank is killed (default %(default)s)")
    p.add_argument("--debug", action="store_true", help="on failure, show every rank's output")
    return p


def check(o: dict[str, Any]) -> None:
    """Every kind that runs must cut the sequences (one line naming the option, before MPI)."""
    from minipar.parallel.common import RunSpec
    from minipar.parallel.context_parallel.options import check as cp_check

    n = o["ranks"]
    if sorted(o["seqs"]) != o["seqs"] or len(set(o["seqs"])) != len(o["seqs"]):
        raise ValueError(f"--seqs {' '.join(map(str, o['seqs']))} must grow")
    for s in o["seqs"]:
        spec = RunSpec(vocab=16, seq=s, d_model=o["d_model"], layers=o["layers"],
                       heads=o["heads"], kv_heads=o["kv_heads"], batch=o["batch"])
        for kind in _kinds(o):
            cp_check(s, o["heads"], n, kind, kind != "ulysses", 0, spec.kv_heads,
                     o["ulysses"] if kind == "usp" else None)


def main(argv: list[str]) -> int:
    from minipar import launch

    p = _parser()
    a = p.parse_args(argv)
    try:
        check(vars(a))
    except ValueError as e:
        p.error(str(e))
    try:
        out, _ = launch.run_json(a.ranks, "minipar.bench.cp", vars(a), timeout=a.timeout,
                                 check=True)
    except launch.LaunchError as e:
        return launch.report(PROG, e, a.debug)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"cp = {a.ranks} ranks; {a.layers} blocks, d_model {a.d_model}, {a.heads} heads, "
          f"{a.kv_heads or a.heads} key/value heads, batch {a.batch}, {a.precision}; usp: "
          f"{a.ulysses} Ulysses x {a.ranks // a.ulysses} ring; rank 0's figures")
    print(f"{'kind':<10}{'seq':>6}{'step s':>9}{'bytes/step':>13}{'formula':>13}"
          f"{'act/layer B':>13}{'formula':>11}{'serial':>11}")
    for r in out["rows"]:
        print(f"{r['kind']:<10}{r['seq']:>6}{r['step_s']:>9.4f}{r['bytes_per_step']:>13,.0f}"
              f"{r['bytes_formula']:>13,}{r['activation_per_layer']:>13,}"
              f"{r['activation_formula']:>11,}{r['serial_activation']:>11,}")
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(_worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
