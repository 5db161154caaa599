"""``minipar bench all``: every speed ratio of the project, at small sizes, in one run.

EN benchmark suite · RU все замеры скорости · ZH 全部基准

A regression guard that is not a timed test: it runs the benchmarks that
compare minipar with a reference measured in the same run, at sizes small
enough for the whole suite to take about a minute, and reports each
*ratio* beside its *ideal*:

==================  ===========================================  =====================
benchmark           ratio                                        ideal
==================  ===========================================  =====================
model               NumPy step time / PyTorch eager's (1 thread) 1.0 (as fast)
dp                  serial step time / data-parallel step time   N (ranks)
dp (ceiling)        serial / N independent processes on B/N rows N (ranks)
collectives         busbw / MPI's busbw, same size (ring, auto)  1.0 (as fast as MPI)
collectives         8-byte all-reduce time / MPI's (auto)        1.0
==================  ===========================================  =====================

``--json`` prints the result as JSON, ``--json-out FILE`` writes it
(:func:`minipar.cli.options.add_json_options`): ``{"date", "machine", "cores",
"load_average": [before, after], "seconds", "ratios": [{"bench", "name",
"ratio", "ideal", "lower_is_better"}]}``.  docs/PERFORMANCE.md keeps the
table of one such run with the project's goals; the tests check only that
this runs and that the file has this format, never a speed (a shared
machine's timings say nothing about the code).  The full-size runs are the
benchmarks themselves (``minipar bench model``, ``dp``, ``collectives``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import sys
import time
from typing import Any

from minipar.bench import emit
from minipar.cli.options import ArgumentParser, add_json_options

PROG = "minipar bench all"

#: what each benchmark is run with (small sizes: about a minute in all)
MODEL_ARGS = ["--sizes", "small", "medium", "--repeat", "3"]
DP_ARGS = ["-n", "2", "--d-model", "128", "--layers", "2", "--seq", "64", "--batch", "16",
           "--steps", "3", "--rounds", "3"]
COLLECTIVE_SIZES = (8, 64 << 10, 1 << 20)
COLLECTIVES_ARGS = ["-n", "2", "--collectives", "allreduce", "--algorithms", "ring", "auto",
                    "--iters", "10", "--sizes", *map(str, COLLECTIVE_SIZES)]


def _json_of(main: Any, argv: list[str], what: str) -> Any:
    """Run a benchmark's ``main(argv + ["--json"])`` here, its stdout parsed as JSON."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([*argv, "--json"])
    if rc:
        raise RuntimeError(f"minipar bench {what} {' '.join(argv)} failed (exit {rc})")
    return json.loads(out.getvalue())


#: what is said when the model's ratio cannot be measured
NO_TORCH = ("PyTorch is not installed, so the model's ratio (NumPy / PyTorch eager) is left "
            "out; `pip install torch` brings it (the CPU wheel is enough: pip install torch "
            "--index-url https://download.pytorch.org/whl/cpu)")


def ratio(bench: str, name: str, value: float, ideal: float, lower_is_better: bool) -> dict:
    """One row of the result."""
    return {"bench": bench, "name": name, "ratio": float(value), "ideal": float(ideal),
            "lower_is_better": lower_is_better}


def run_all(skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the benchmarks (those not in ``skip``) and collect every ratio."""
    from minipar.bench import collectives, dp, model

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    if "model" not in skip:
        for r in _json_of(model.main, MODEL_ARGS, "model"):
            if r["ratio"] is not None:
                rows.append(ratio("model", f"GPT step, d_model {r['d_model']}, numpy / torch",
                                  r["ratio"], 1.0, True))
    if "dp" not in skip:
        r = _json_of(dp.main, DP_ARGS, "dp")
        rows.append(ratio("dp", f"speed-up on {r['ranks']} ranks (d_model 128)", r["speedup"],
                          r["ranks"], False))
        rows.append(ratio("dp", f"ceiling on {r['ranks']} ranks: serial / independent "
                          "(d_model 128)", r["ceiling"], r["ranks"], False))
    if "collectives" not in skip:
        got = _json_of(collectives.main, COLLECTIVES_ARGS, "collectives")
        for r in got:
            if r["algorithm"] != "mpi":
                rows.append(ratio("collectives",
                                  f"all-reduce {r['algorithm']} busbw / MPI's, "
                                  f"{collectives.human_size(r['size'])}, {r['ranks']} ranks",
                                  r["x_mpi"], 1.0, False))
        s = collectives.auto_summary(got)
        if s:
            rows.append(ratio("collectives", f"all-reduce auto time / MPI's at "
                              f"{s['latency_size']} B (latency)", s["latency_ratio"], 1.0, True))
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.node() or 'host'} ({platform.machine()}, "
                       f"{platform.processor() or platform.system()})",
            "cores": os.cpu_count(), "load_average": [load0, os.getloadavg()[0]],
            "seconds": time.perf_counter() - t0, "ratios": rows}


def check_result(data: Any) -> None:
    """ValueError unless ``data`` has the format :func:`run_all` writes."""
    keys = {"date", "machine", "cores", "load_average", "seconds", "ratios"}
    if not isinstance(data, dict) or set(data) != keys:
        raise ValueError(f"expected an object with keys {sorted(keys)}")
    for r in data["ratios"]:
        if set(r) != {"bench", "name", "ratio", "ideal", "lower_is_better"}:
            raise ValueError(f"bad ratio row {r}")
        ok = (isinstance(r["ratio"], float) and isinstance(r["ideal"], float)
              and isinstance(r["lower_is_better"], bool))
        if not ok:
            raise ValueError(f"bad types in {r}")


def table(data: dict[str, Any]) -> str:
    """The ratios as text: one line each, the ratio beside its ideal."""
    head = f"{'bench':<12} {'what':<58} {'ratio':>6} {'ideal':>6}"
    title = (f"{PROG}: {data['date']}, {data['machine']}, {data['cores']} cores, load average "
             f"{data['load_average'][0]:.2f} before, {data['load_average'][1]:.2f} after, "
             f"{data['seconds']:.0f} s")
    lines = [title, head, "-" * len(head)]
    for r in data["ratios"]:
        lines.append(f"{r['bench']:<12} {r['name']:<58} {r['ratio']:6.2f} {r['ideal']:6.1f}")
    lines.append("(model and latency: lower is faster, 1.0 = as fast as the reference; dp and "
                 "busbw: higher is faster)")
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--skip", nargs="+", choices=("model", "dp", "collectives"), default=[],
                   help="benchmarks to leave out (default: none, all three run)")
    add_json_options(p, "the ratios")
    return p


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    try:
        data = run_all(tuple(a.skip))
    except RuntimeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    if "model" not in a.skip and not any(r["bench"] == "model" for r in data["ratios"]):
        print(f"{PROG}: {NO_TORCH}", file=sys.stderr)  # stderr: --json's stdout stays JSON
    return emit(PROG, a, data, table(data))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
