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
  (:class:`~minipar.parallel.tensor_parallel.model.TPBlockUnit`), blocking and
  overlapped (``--tp-overlap``'s layers,
  :func:`~minipar.parallel.tensor_parallel.engine.overlap_layers`), and with ``--sp``
  the same with sequence parallelism.  For each, the share of its communication
  hidden behind computation (``hidden_fraction``, recorded by
  :class:`~minipar.parallel.tensor_parallel.measure.CommClock`) and
  the peak bytes of one more step under tracemalloc.

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
from minipar.parallel.tensor_parallel.measure import CommClock

__all__ = ["CommClock", "main"]

PROG = "minipar bench tp"


def _worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: time the serial block on rank 0 and the TP blocks (blocking and
    overlapped, and with ``sp`` TP+SP's) on all; rank 0 reports."""
    import time

    import numpy as np

    from minipar.bench.dp import measure_step_time
    from minipar.comm import TracedComm
    from minipar.memory import measure
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.gpt import BlockUnit
    from minipar.overlap import total
    from minipar.parallel.tensor_parallel.engine import overlap_layers
    from minipar.parallel.tensor_parallel.model import TPBlockUnit
    from minipar.parallel.tensor_parallel.shards import shard_params, split_sequence

    comm = TracedComm()
    clock = CommClock(comm)
    t, r = comm.size, comm.rank
    cfg = GPTConfig(vocab_size=t, block_size=o["seq"], n_layer=1, n_head=o["heads"],
                    d_model=o["d_model"], dtype=o["precision"])
    full = GPT(cfg).init(0)
    serial = BlockUnit(cfg, 0)
    p_ser = serial.params(full) if r == 0 else None
    rng = np.random.default_rng(1)
    x = rng.standard_normal((o["batch"], o["seq"], o["d_model"])).astype(cfg.dtype)
    dy = rng.standard_normal(x.shape).astype(cfg.dtype)
    blocks = {}  # name -> (unit, its params, its input, its output gradient)
    for sp in ((False, True) if o.get("sp") else (False,)):
        for overlapped in (False, True):
            unit = TPBlockUnit(cfg, comm, 0, sequence_parallel=sp)
            if overlapped:
                overlap_layers([unit])
            xs, dys = (split_sequence(x, t, r), split_sequence(dy, t, r)) if sp else (x, dy)
            name = ("TP+SP" if sp else "TP") + (" overlap" if overlapped else "")
            blocks[name] = (unit, unit.params(shard_params(full, cfg, t, r)), xs, dys)
    del full

    def run_serial(_: int) -> None:
        if r == 0:
            _, s = serial.forward(p_ser, x)
            serial.backward(p_ser, s, dy)

    def runner(name: str) -> Any:
        unit, p, xs, dys = blocks[name]

        def run(_: int) -> None:
            _, s = unit.forward(p, xs)
            unit.backward(p, s, dys)
        return run

    runs = {"serial": run_serial, **{name: runner(name) for name in blocks}}
    times: dict[str, list[float]] = {k: [] for k in runs}
    hidden: dict[str, list[float]] = {k: [] for k in blocks}
    in_msgs: dict[str, list[float]] = {k: [] for k in blocks}  # seconds in messages, a step
    sent: dict[str, int] = {}
    for k in range(o["steps"] + 1):  # round 0 warms up
        for name, fn in runs.items():
            comm.stats.reset()
            t0 = time.perf_counter()
            dt = measure_step_time(fn, 1, comm, warmup=0)
            t1 = time.perf_counter()
            h = clock.hidden(t0, t1) if name in blocks else None
            if k:
                times[name].append(dt)
                if h is not None:
                    hidden[name].append(h)
                    in_msgs[name].append(total(c[1:] for c in clock.timeline(t0, t1)["comm"]))
            sent[name] = sum(comm.stats.bytes_sent(op) for op in ("tp_f", "tp_g", "sp_f", "sp_g"))
    peaks = {}
    for name, fn in runs.items():  # one more step each, untimed, under tracemalloc
        with measure() as region:
            fn(0)
        peaks[name] = region.peak_bytes
    from statistics import median

    shares = {k: median(v) if v else None for k, v in hidden.items()}
    secs = {k: median(v) if v else None for k, v in in_msgs.items()}
    everyone = comm.comm.gather((sent, shares, peaks, secs), root=0)
    if r:
        return None
    from minipar.plan.tensor import tp_bytes_per_rank_per_layer

    med = {k: median(v) for k, v in times.items()}
    e = np.dtype(cfg.dtype).itemsize
    rows = {}
    for name in blocks:
        fr = [ev[1][name] for ev in everyone if ev[1][name] is not None]
        cs = [ev[3][name] for ev in everyone if ev[3][name] is not None]
        rows[name] = {"seconds": med[name], "speedup": med["serial"] / med[name],
                      "hidden_fraction": sum(fr) / len(fr) if fr else None,
                      "comm_seconds": sum(cs) / len(cs) if cs else None,
                      "bytes_per_rank": [ev[0][name] for ev in everyone],
                      "peak_bytes_per_rank": [ev[2][name] for ev in everyone]}
    plan_here(rows)
    return {"t": t, "d_model": o["d_model"], "heads": o["heads"], "batch": o["batch"],
            "seq": o["seq"], "precision": o["precision"], "serial_s": med["serial"],
            "serial_peak_bytes": everyone[0][2]["serial"], "tp_s": med["TP"],
            "speedup": med["serial"] / med["TP"],
            "round_speedups": [a / b for a, b in zip(times["serial"], times["TP"])],
            "bytes_per_block_per_rank": rows["TP"]["bytes_per_rank"], "blocks": rows,
            "bytes_formula": tp_bytes_per_rank_per_layer(o["batch"], o["seq"], o["d_model"], t, e)}


def plan_here(rows: dict[str, Any]) -> None:
    """The planner's "minipar on this machine" term (:mod:`minipar.plan.here`): each
    overlapped row gets ``plan_seconds``, its blocking row's step minus the recorded hidden
    share (``tp``, ``tp_sp``) of the seconds the blocking row spent in its messages."""
    from minipar.plan.here import overlapped_step

    for name, kind in (("TP", "tp"), ("TP+SP", "tp_sp")):
        block, over = rows.get(name), rows.get(name + " overlap")
        if block and over and block["comm_seconds"] is not None:
            over["plan_seconds"] = overlapped_step(
                block["seconds"], min(block["comm_seconds"], block["seconds"]), kind)


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
    p.add_argument("--sp", action="store_true",
                   help="also the block with sequence parallelism, blocking and overlapped")
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
    print(f"{'':>16} {'s fwd+bwd':>10} {'speed-up':>9} {'hidden':>7} {'peak B (rank 0)':>16} "
          f"{'plan s':>8}")
    print(f"{'serial':>16} {row['serial_s']:>10.4f} {'':>9} {'':>7} "
          f"{row['serial_peak_bytes']:>16,}")
    for name, b in row["blocks"].items():
        h, plan = b["hidden_fraction"], b.get("plan_seconds")
        print(f"{name + ', t = ' + str(a.ranks):>16} {b['seconds']:>10.4f} "
              f"{b['speedup']:>8.2f}x {'-' if h is None else f'{h:.0%}':>7} "
              f"{b['peak_bytes_per_rank'][0]:>16,} {'-' if plan is None else f'{plan:.4f}':>8}")
    print("hidden: the share of the messages' time the rank spent computing (the step minus "
          "its waits; minipar.overlap.hidden_fraction), mean of the ranks; overlap: "
          "--tp-overlap's layers, the same bytes: "
          + ", ".join(f"{n} {b['bytes_per_rank'][0]:,}" for n, b in row["blocks"].items()))
    from minipar.plan.here import HERE_OVERLAP

    print("plan s: the planner's minipar-on-this-machine term (minipar.plan.here): the "
          "blocking row's step minus the recorded hidden share (TP "
          f"{HERE_OVERLAP['tp']:.0%}, TP+SP {HERE_OVERLAP['tp_sp']:.0%}) of its seconds in "
          "messages ("
          + ", ".join(f"{n} {b['comm_seconds']:.4f} s" for n, b in row["blocks"].items()
                      if "overlap" not in n and b["comm_seconds"] is not None)
          + "); beside the measured s fwd+bwd")
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
