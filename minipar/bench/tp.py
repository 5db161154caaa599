"""``minipar bench tp``: one transformer block, serial against tensor-parallel on t ranks.

EN tensor-parallel speed-up · RU ускорение тензорного параллелизма · ZH 张量并行加速比

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053) splits every block's matmuls t ways
and pays 4 all-reduces of b·s·h elements per block (2 forward, 2 backward).  One launch
of t ranks (default 2, one BLAS thread each: the launcher sets ``OMP_NUM_THREADS=1`` and
friends) times the forward+backward of one block (default d_model 1024, 16 heads,
4 x 256 = 1024 tokens, float32):

* serial: rank 0 runs the whole block (:class:`minipar.nn.gpt.BlockUnit`) while the
  others wait;
* tensor-parallel: every rank runs its slice
  (:class:`~minipar.parallel.tensor_parallel.model.TPBlockUnit`).

The two alternate ``--steps`` times after a warm-up (drift on a shared machine hits both
alike); each figure is the median of the slowest rank's wall-clock seconds, and

    speed-up = t_serial / t_TP        (ideal t; target >= 1.6 on 2 ranks)

Bytes each rank sent in the block's f and g are counted in the same run next to
:func:`minipar.plan.tensor.tp_bytes_per_rank_per_layer` (ring: 4 x 2(t-1)/t x b·s·h x bytes).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from minipar.cli.options import ArgumentParser, integer, seconds

PROG = "minipar bench tp"


def _worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: time the serial block on rank 0 and the TP block on all; rank 0 reports."""
    import numpy as np

    from minipar.bench.dp import measure_step_time
    from minipar.comm import TracedComm
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.gpt import BlockUnit
    from minipar.parallel.tensor_parallel.model import TPBlockUnit
    from minipar.parallel.tensor_parallel.shards import shard_params

    comm = TracedComm()
    t, r = comm.size, comm.rank
    cfg = GPTConfig(vocab_size=t, block_size=o["seq"], n_layer=1, n_head=o["heads"],
                    d_model=o["d_model"], dtype=o["precision"])
    full = GPT(cfg).init(0)
    serial, tp = BlockUnit(cfg, 0), TPBlockUnit(cfg, comm, 0)
    p_ser = serial.params(full) if r == 0 else None
    p_tp = tp.params(shard_params(full, cfg, t, r))
    del full
    rng = np.random.default_rng(1)
    x = rng.standard_normal((o["batch"], o["seq"], o["d_model"])).astype(cfg.dtype)
    dy = rng.standard_normal(x.shape).astype(cfg.dtype)

    def run_serial(_: int) -> None:
        if r == 0:
            _, s = serial.forward(p_ser, x)
            serial.backward(p_ser, s, dy)

    def run_tp(_: int) -> None:
        _, s = tp.forward(p_tp, x)
        tp.backward(p_tp, s, dy)

    times: dict[str, list[float]] = {"serial": [], "tp": []}
    for k in range(o["steps"] + 1):  # round 0 warms up
        for name, fn in (("serial", run_serial), ("tp", run_tp)):
            comm.stats.reset()
            dt = measure_step_time(fn, 1, comm, warmup=0)
            if k:
                times[name].append(dt)
    sent = comm.stats.bytes_sent("tp_f") + comm.stats.bytes_sent("tp_g")  # the last TP round
    everyone = comm.comm.gather(sent, root=0)
    if r:
        return None
    from statistics import median

    from minipar.plan.tensor import tp_bytes_per_rank_per_layer

    ts, tt = median(times["serial"]), median(times["tp"])
    e = np.dtype(cfg.dtype).itemsize
    return {"t": t, "d_model": o["d_model"], "heads": o["heads"], "batch": o["batch"],
            "seq": o["seq"], "precision": o["precision"], "serial_s": ts, "tp_s": tt,
            "speedup": ts / tt, "round_speedups": [a / b for a, b in zip(times["serial"],
                                                                         times["tp"])],
            "bytes_per_block_per_rank": everyone,
            "bytes_formula": tp_bytes_per_rank_per_layer(o["batch"], o["seq"], o["d_model"], t, e)}


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("-n", "--ranks", type=integer(2), default=2,
                   help="ranks = tensor-parallel size t (default %(default)s)")
    p.add_argument("--d-model", type=integer(1), default=1024, help="width h (default %(default)s)")
    p.add_argument("--heads", type=integer(1), default=16, help="heads (default %(default)s)")
    p.add_argument("--seq", type=integer(1), default=256, help="sequence s (default %(default)s)")
    p.add_argument("--batch", type=integer(1), default=4,
                   help="rows b; b·s tokens per batch (default %(default)s)")
    p.add_argument("--steps", type=integer(1), default=3,
                   help="timed rounds after one warm-up (default %(default)s)")
    p.add_argument("--precision", choices=["float32", "float64"], default="float32",
                   help="block dtype (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--timeout", type=seconds, default=600.0,
                   help="seconds before every rank is killed (default %(default)s)")
    p.add_argument("--debug", action="store_true", help="on failure, show every rank's output")
    return p


def check(o: dict[str, Any]) -> None:
    """The block must slice ``-n`` ways (one line naming the option, before MPI)."""
    t, d, h = o["ranks"], o["d_model"], o["heads"]
    if d % h:
        raise ValueError(f"--heads {h} does not divide --d-model {d}")
    if h % t or (4 * d) % t:
        raise ValueError(f"--heads {h} and the MLP width 4 x --d-model = {4 * d} must be "
                         f"divisible by -n {t} (the tensor-parallel size)")


def main(argv: list[str]) -> int:
    from minipar import launch

    p = _parser()
    a = p.parse_args(argv)
    try:
        check(vars(a))
    except ValueError as e:
        p.error(str(e))
    try:
        row, _ = launch.run_json(a.ranks, "minipar.bench.tp", vars(a), timeout=a.timeout,
                                 check=True)
    except launch.LaunchError as e:  # any failure of the launch
        return launch.report(PROG, e, a.debug)
    if a.json:
        print(json.dumps(row, indent=2))
        return 0
    print(f"one block, d_model {a.d_model}, {a.heads} heads, b {a.batch} x s {a.seq} = "
          f"{a.batch * a.seq} tokens, {a.precision}, one BLAS thread per rank")
    print(f"{'':>16} {'s fwd+bwd':>10}")
    print(f"{'serial':>16} {row['serial_s']:>10.4f}")
    print(f"{'TP, t = ' + str(a.ranks):>16} {row['tp_s']:>10.4f}")
    print(f"speed-up {row['speedup']:.2f}x (median of {a.steps}; ideal {a.ranks}x on {a.ranks} "
          f"ranks); per round: {', '.join(f'{x:.2f}' for x in row['round_speedups'])}")
    print("bytes per block per rank (f and g, counted): "
          + ", ".join(f"{b:,}" for b in row["bytes_per_block_per_rank"])
          + f"; formula 4 x 2(t-1)/t x b·s·h x bytes = {row['bytes_formula']:,.0f}")
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(_worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
