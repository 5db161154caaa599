"""``minipar bench offload``: what offloading moves, where it lies, and what it costs — 卸载.

EN offloading benchmark · RU замер выгрузки · ZH 卸载基准测试

Two halves of ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840) and
ZeRO-Infinity's disk tier (Rajbhandari et al. 2021, arXiv 2104.07857), each
against the same work kept on the device, in one run:

* **activations** (:class:`minipar.parallel.offload.activations.Offload`): one forward +
  backward of a GPT, plain, with ``saved`` offloaded to host, to disk, and
  checkpointed (remat) with the checkpoints on disk.  Columns: where the
  activations lie after forward (the ledger's ``device`` / ``host`` /
  ``disk`` columns, :func:`minipar.memory.bytes_by_place`), tracemalloc's
  bytes held after forward, and the median step time as a ratio to plain;
* **optimizer states** (:class:`minipar.parallel.offload.optimizer.OptimizerOffload`):
  a mixed-precision Adam step of the whole model, states on the device, on
  host, on disk: bytes off the device, tracemalloc's bytes held by the
  states, step time.

On a machine without a GPU, device and host are the same RAM (the host
column is accounting, and host offload costs one memory copy each way);
disk is real: its bytes leave tracemalloc.  CPU time, one BLAS thread, in a
subprocess (as ``minipar bench remat``); never asserted in tests.
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
from minipar.bench.remat import THREAD_VARS, Sink, setup
from minipar.cli.options import ArgumentParser, add_json_options, integer

PROG = "minipar bench offload"


def _median_wall(fn: Any, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def activations(layers: int = 8, repeat: int = 5, folder: str | None = None,
                **size: Any) -> list[dict[str, Any]]:
    """One row per arrangement: plain, host, disk, remat + disk."""
    from minipar.memory import measure
    from minipar.nn import executor
    from minipar.parallel.offload.activations import Offload
    from minipar.parallel.offload.measure import MeteredStore, kept_by_place
    from minipar.parallel.remat import Checkpointing

    units, p, x, y = setup(layers, **size)
    kinds = {"plain": lambda: Sink(p),
             "offload host": lambda: Offload(Sink(p), MeteredStore("host")),
             "offload disk": lambda: Offload(Sink(p), MeteredStore("disk", folder)),
             "remat + disk": lambda: Offload(Checkpointing(Sink(p), units),
                                             MeteredStore("disk", folder))}
    executor.loss_and_grads(units, Sink(p), x, y)  # first-use caches
    rows = []
    for name, make in kinds.items():
        h = make()
        with measure() as fwd:
            logits, kept = executor.forward(units, h, x)
        where = kept_by_place(kept)
        del logits, kept
        h = make()
        executor.loss_and_grads(units, h, x, y)
        store = h.store if isinstance(h, Offload) else None
        moved = store.moved if store else {"to_host": 0, "to_disk": 0}
        wall = _median_wall(lambda m=make: executor.loss_and_grads(units, m(), x, y), repeat)
        rows.append({"what": name, **where, "traced_after_forward": fwd.current_bytes,
                     "bytes_out": moved["to_host"] + moved["to_disk"],
                     "move_s": sum(store.seconds.values()) if store else 0.0, "step_s": wall})
    for r in rows:
        r["time_ratio"] = r["step_s"] / rows[0]["step_s"]
    return rows


def optimizer_states(layers: int = 8, repeat: int = 5, folder: str | None = None,
                     **size: Any) -> list[dict[str, Any]]:
    """One row per place of the optimizer states: device, host, disk (mixed precision)."""
    import numpy as np

    from minipar.memory import measure
    from minipar.parallel.offload.measure import MeteredOptimizerOffload
    from minipar.precision import ModelStates

    _, p, _, _ = setup(layers, **size)
    init = {k: v.astype(np.float64) for k, v in p.items()}
    g = np.random.default_rng(1).standard_normal(sum(v.size for v in p.values()))
    rows = []
    for where in ("device", "host", "disk"):
        with measure() as built:
            st = ModelStates("mixed", init, "adamw")
            off = None if where == "device" else MeteredOptimizerOffload(
                st, where, folder if where == "disk" else None)
        st.grads[...] = g
        stepper = st if off is None else off
        wall = _median_wall(stepper.step, repeat)
        rows.append({"what": f"optimizer states on {where}",
                     "offloaded": 0 if off is None else off.offloaded_bytes,
                     "traced_states": built.current_bytes, "step_s": wall})
        if off is not None:
            off.close()
    for r in rows:
        r["time_ratio"] = r["step_s"] / rows[0]["step_s"]
    return rows


def table(acts: list[dict[str, Any]], opts: list[dict[str, Any]]) -> str:
    mb = 1e6
    head = (f"{'activations':<14} {'device':>9} {'host':>9} {'disk':>9} {'traced':>9} "
            f"{'moved out':>10} {'step ms':>8} {'ratio':>6}")
    lines = [head, "-" * len(head)]
    for r in acts:
        lines.append(f"{r['what']:<14} {r['device'] / mb:7.2f}MB {r['host'] / mb:7.2f}MB "
                     f"{r['disk'] / mb:7.2f}MB {r['traced_after_forward'] / mb:7.2f}MB "
                     f"{r['bytes_out'] / mb:8.2f}MB {r['step_s'] * 1e3:8.2f} "
                     f"{r['time_ratio']:5.2f}x")
    head = f"{'optimizer':<26} {'off device':>10} {'traced':>9} {'step ms':>8} {'ratio':>6}"
    lines += ["", head, "-" * len(head)]
    for r in opts:
        lines.append(f"{r['what']:<26} {r['offloaded'] / mb:8.2f}MB "
                     f"{r['traced_states'] / mb:7.2f}MB {r['step_s'] * 1e3:8.2f} "
                     f"{r['time_ratio']:5.2f}x")
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=integer(1, 256), default=8,
                   help="transformer blocks (default %(default)s)")
    p.add_argument("--repeat", type=integer(1), default=5,
                   help="timed steps, the median is shown (default %(default)s)")
    p.add_argument("--offload-dir", default=None, metavar="DIR",
                   help="folder for the disk files (default: the system's temporary folder)")
    add_json_options(p, "the rows")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.offload_dir is not None:
        from minipar.parallel.offload.wrap import check_target

        try:
            check_target("disk", a.offload_dir)
        except ValueError as e:
            p.error(f"--offload-dir: {e}")
    if a.inner:
        print(json.dumps([activations(a.layers, a.repeat, a.offload_dir),
                          optimizer_states(a.layers, a.repeat, a.offload_dir)]))
        return 0
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    proc = subprocess.run([sys.executable, "-m", "minipar.bench.offload", "--inner", *argv],
                          env=env, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    acts, opts = json.loads(proc.stdout.strip().splitlines()[-1])
    text = (f"offloading, GPT with {a.layers} blocks, one thread; activations: where they lie "
          f"after forward (ledger), tracemalloc held after forward, median wall time of "
          f"{a.repeat} steps as a ratio to plain; optimizer: mixed-precision AdamW step "
          f"(without a GPU, device and host are the same RAM)\n" + table(acts, opts))
    return emit(PROG, a, {"activations": acts, "optimizer": opts}, text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
