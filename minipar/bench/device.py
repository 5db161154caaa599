"""``minipar bench device``: the CuPy backend on a real GPU, against NumPy.

EN GPU check · RU проверка на GPU · ZH GPU 检查

Three measurements, each with ``MINIPAR_BACKEND=numpy`` and ``=cupy`` in
processes of their own (the backend is chosen when minipar is imported):

1. **serial parity**: the serial GPT (``minipar train``'s default model, float64)
   trained ``--steps`` steps; losses and final parameters compared;
2. **2-rank parity**: ``minipar run dp -n 2`` (float64) under each backend through
   minipar's launcher, losses and final parameters compared, and each run's own
   verdict against its serial oracle;
3. **step time**: one training step (forward, backward, AdamW) of a 4-layer GPT in
   float32 at d_model ``--sizes``, wall-clock, the median of ``--repeat`` after two
   warm-up steps; the device is synchronised (``cupy.cuda.Device().synchronize()``)
   before each clock is read, or the GPU's queued work would not be counted.
   NumPy uses every core (its BLAS threads), not one as the other benchmarks do.

Parity in float64: cuBLAS and NumPy's BLAS add in different orders, so "equal"
means within 1e-12 relative (:func:`compare`: the largest difference over the
largest magnitude); "bit for bit" when nothing differs at all.

Without a GPU (CuPy missing, or no device) it prints one line saying so and
exits 0: nothing in CI depends on a GPU.  Exit status 1 when a part fails or a
parity is "different".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from minipar.bench import emit
from minipar.cli.options import ArgumentParser, add_json_options, integer, one_line, seconds

PROG = "minipar bench device"
BACKENDS = ("numpy", "cupy")
#: float64 parity across backends: the largest |difference| over the largest |value|
RTOL = 1e-12
#: the serial model (``minipar train``'s defaults) and the step-time model
SERIAL = {"vocab": 10, "seq": 16, "d_model": 64, "layers": 2, "heads": 4, "batch": 32}
TIMED = {"vocab": 1024, "seq": 128, "layers": 4, "heads": 8, "batch": 8}
INSTALL = "pip install 'minipar[gpu-cuda12]' (or 'minipar[gpu-cuda13]')"


# ------------------------------------------------------------------ is there a GPU
def gpu() -> tuple[dict[str, Any] | None, str]:
    """``(info, "")`` when CuPy imports and sees a GPU, else ``(None, why not)``."""
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError:
        return None, f"CuPy is not installed: {INSTALL}"
    except Exception as e:  # a broken CUDA install raises other errors on import
        return None, f"CuPy does not import: {one_line(str(e))}"
    try:
        rt = cupy.cuda.runtime
        n = rt.getDeviceCount()
        if n == 0:
            return None, "CuPy sees no CUDA GPU"
        name = rt.getDeviceProperties(0)["name"]
        return {"count": n, "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory": int(rt.getDeviceProperties(0)["totalGlobalMem"]),
                "cupy": cupy.__version__, "runtime": rt.runtimeGetVersion()}, ""
    except Exception as e:  # no driver, no device visible
        return None, f"CuPy sees no usable CUDA GPU: {one_line(str(e))}"


# ------------------------------------------------------------------ the comparison
def compare(a: dict[str, Any], b: dict[str, Any], rtol: float = RTOL) -> dict[str, Any]:
    """Compare two runs' ``losses`` and ``params`` (lists or arrays, on the host).

    Returns ``{"status": "equal" | "different", "bitwise", "max_loss_diff",
    "max_param_diff", "rel_loss", "rel_param", "line"}``: equal when both relative
    gaps (max |a - b| / max |b|) are within ``rtol`` and every value is finite."""
    import numpy as np

    out: dict[str, Any] = {}
    ok, bitwise, why = True, True, ""
    for key, short in (("losses", "loss"), ("params", "param")):
        x, y = np.asarray(a[key], np.float64), np.asarray(b[key], np.float64)
        if x.shape != y.shape:
            return {"status": "different", "bitwise": False,
                    "line": f"different: {key} of shapes {x.shape} and {y.shape}"}
        diff = float(np.max(np.abs(x - y))) if x.size else 0.0
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        rel = diff / scale if scale else (0.0 if diff == 0 else float("inf"))
        finite = bool(np.isfinite(x).all() and np.isfinite(y).all())
        out[f"max_{short}_diff"], out[f"rel_{short}"] = diff, rel
        bitwise = bitwise and finite and diff == 0
        if not finite:
            ok, why = False, why or f"{key} not finite"
        elif not rel <= rtol:
            ok, why = False, why or f"{key} {rel:.1e} relative > {rtol:g}"
    gaps = (f"losses max |d| {out['max_loss_diff']:.1e}, params max |d| "
            f"{out['max_param_diff']:.1e} = {out['rel_param']:.1e} relative")
    if bitwise:
        line = "equal, bit for bit"
    elif ok:
        line = f"equal within {rtol:g} relative ({gaps})"
    else:
        line = f"different: {why} ({gaps})"
    return {"status": "equal" if ok else "different", "bitwise": bitwise, "line": line, **out}


# ------------------------------------------------------------------ in the measuring processes
def serial_run(steps: int) -> dict[str, Any]:
    """This process's backend: the serial GPT trained ``steps`` steps in float64."""
    from minipar import backend
    from minipar.nn import GPT, GPTConfig
    from minipar.train import gpt_task, train

    s = SERIAL
    model = GPT(GPTConfig(vocab_size=s["vocab"], block_size=s["seq"], n_layer=s["layers"],
                          n_head=s["heads"], d_model=s["d_model"], dtype="float64"))
    run = train(model, gpt_task(s["vocab"], s["seq"], s["batch"]), steps, "float64")
    return {"backend": backend.name, "losses": [float(v) for v in run["losses"]],
            "params": backend.to_host(run["states"].params).tolist()}


def step_times(sizes: list[int], repeat: int, warmup: int = 2) -> list[dict[str, Any]]:
    """This process's backend: seconds of one float32 training step per d_model."""
    import numpy as np

    from minipar import backend
    from minipar.backend import to_device
    from minipar.nn import GPT, GPTConfig
    from minipar.parallel.engine import Batch, SerialEngine

    t = TIMED
    rows = []
    for d in sizes:
        model = GPT(GPTConfig(vocab_size=t["vocab"], block_size=t["seq"], n_layer=t["layers"],
                              n_head=t["heads"], d_model=d, dtype="float32"))
        engine = SerialEngine(model, "float32")
        r = np.random.default_rng(0)
        x, y = (to_device(r.integers(0, t["vocab"], (t["batch"], t["seq"]))) for _ in range(2))
        times = []
        for i in range(warmup + repeat):
            backend.synchronize()
            t0 = time.perf_counter()
            engine.step(Batch(i, x, y))
            backend.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        rows.append({"d_model": d, "params": model.n_params(), "seconds": statistics.median(times)})
    return rows


def _dp_worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side of the 2-rank run: ``minipar run``'s own worker; on rank 0 the losses,
    the final parameters on the host and the run's verdict against its serial oracle."""
    from minipar import backend
    from minipar.parallel.common import RunSpec
    from minipar.run.options import parse, strategy_module
    from minipar.run.summary import build
    from minipar.run.worker import run_engine

    options = parse(o["argv"])
    spec = RunSpec.from_options(options)
    m = run_engine(options, spec, strategy_module(options["strategy"]))
    if m is None:
        return None
    out = {"backend": backend.name, "losses": [float(v) for v in m["losses"]],
           "params": backend.to_host(m["params"]).tolist()}
    try:
        out["verdict"] = build(options, spec, dict(m))["verdict"]["line"]
    except Exception as e:  # the comparison with the oracle is extra: report, go on
        out["verdict"] = f"not built: {type(e).__name__}: {one_line(str(e))}"
    return out


# ------------------------------------------------------------------ the launching process
def _env(backend: str) -> dict[str, str]:
    """This environment with ``MINIPAR_BACKEND`` set and this minipar importable."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "MINIPAR_BACKEND": backend, "PYTHONPATH": path}


def inner(backend: str, what: str, args: list[str], timeout: float) -> Any:
    """Run ``python -m minipar.bench.device --inner WHAT ARGS`` under ``backend``; its JSON.
    RuntimeError with the process's last error line if it fails."""
    cmd = [sys.executable, "-m", "minipar.bench.device", "--inner", what, *args]
    try:
        proc = subprocess.run(cmd, env=_env(backend), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} under {backend} ran past --timeout {timeout:g} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"{what} under {backend} exited {proc.returncode}: "
                           f"{err[-1] if err else 'no output'}")
    return json.loads(lines[-1])


def dp_run(backend: str, steps: int, timeout: float) -> dict[str, Any]:
    """``minipar run dp -n 2 --steps STEPS`` (float64) under ``backend``, through the launcher."""
    from minipar import launch

    argv = ["dp", "-n", "2", "--steps", str(steps)]
    try:
        row, _ = launch.run_json(2, "minipar.bench.device", {"argv": argv}, check=True,
                                 timeout=timeout, env={"MINIPAR_BACKEND": backend})
    except launch.LaunchError as e:
        raise RuntimeError(f"dp under {backend}: {one_line(str(e))}") from None
    return row


def _part(fn: Any) -> dict[str, Any]:
    """Run one part; a failure becomes ``{"error": one line}``."""
    try:
        return fn()
    except Exception as e:  # one part failing must not hide the others
        return {"error": one_line(str(e)) or type(e).__name__}


def run_parity(runs: dict[str, Any]) -> dict[str, Any]:
    """CuPy's run against NumPy's: the comparison, or the error of the run that failed."""
    return {**compare(runs["cupy"], runs["numpy"]),
            "losses": {b: runs[b]["losses"] for b in BACKENDS},
            **({"verdicts": {b: runs[b]["verdict"] for b in BACKENDS}}
               if "verdict" in runs["numpy"] else {})}


def measure(a: argparse.Namespace, info: dict[str, Any],
            under: dict[str, str] | None = None) -> dict[str, Any]:
    """Every part; each a dict, ``{"error": ...}`` when it failed.  ``under``: the
    ``MINIPAR_BACKEND`` each column runs with (default: its name; a test runs both
    columns on NumPy)."""
    env = under or {b: b for b in BACKENDS}
    res: dict[str, Any] = {"gpu": info, "steps": a.steps}
    res["serial"] = _part(lambda: run_parity(
        {b: inner(env[b], "serial", ["--steps", str(a.steps)], a.timeout) for b in BACKENDS}))
    res["dp"] = _part(lambda: run_parity(
        {b: dp_run(env[b], a.steps, a.timeout) for b in BACKENDS}))

    def timing() -> dict[str, Any]:
        args = ["--sizes", *map(str, a.sizes), "--repeat", str(a.repeat)]
        cols = {b: inner(env[b], "time", args, a.timeout) for b in BACKENDS}
        rows = [{"d_model": n["d_model"], "params": n["params"], "numpy_s": n["seconds"],
                 "cupy_s": c["seconds"], "speedup": n["seconds"] / c["seconds"]}
                for n, c in zip(cols["numpy"], cols["cupy"])]
        return {"rows": rows}

    res["timing"] = _part(timing)
    return res


def format_text(res: dict[str, Any], a: argparse.Namespace) -> str:
    g = res["gpu"]
    lines = [f"{PROG}: {g['name']} ({g['count']} GPU{'s' * (g['count'] != 1)}, "
             f"{g['memory'] / 2**30:.1f} GiB), CuPy {g['cupy']}, CUDA runtime "
             f"{g['runtime'] // 1000}.{g['runtime'] % 1000 // 10}"]
    s = SERIAL
    for key, what in (("serial", f"serial GPT (d_model {s['d_model']}, {s['layers']} layers, "
                                 f"float64, {a.steps} steps)"),
                      ("dp", f"dp on 2 ranks (float64, {a.steps} steps)")):
        r = res[key]
        lines.append(f"{what}, cupy vs numpy: "
                     + (f"failed: {r['error']}" if "error" in r else r["line"]))
        for b, v in r.get("verdicts", {}).items():
            lines.append(f"  {b}: dp vs its serial run: {v}")
    t = res["timing"]
    head = (f"training step, GPT {TIMED['layers']} layers, T {TIMED['seq']}, B {TIMED['batch']}, "
            f"V {TIMED['vocab']}, float32; wall ms, median of {a.repeat} "
            f"(NumPy on {os.cpu_count()} cores)")
    if "error" in t:
        return "\n".join(lines + [f"{head}: failed: {t['error']}"])
    lines += [head, f"{'d_model':>7} {'params':>11} {'numpy ms':>9} {'cupy ms':>8} "
                    f"{'numpy/cupy':>10}"]
    lines += [f"{r['d_model']:>7} {r['params']:>11,} {1e3 * r['numpy_s']:>9.2f} "
              f"{1e3 * r['cupy_s']:>8.2f} {r['speedup']:>9.1f}x" for r in t["rows"]]
    return "\n".join(lines)


def failed(res: dict[str, Any]) -> bool:
    """A part failed, or a parity is not "equal"."""
    return any("error" in res[k] for k in ("serial", "dp", "timing")) or any(
        res[k].get("status") == "different" for k in ("serial", "dp"))


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0].replace("``", ""))
    p.add_argument("--steps", type=integer(1), default=3,
                   help="training steps of the parity runs (default %(default)s)")
    p.add_argument("--sizes", type=integer(8), nargs="+", default=[128, 256, 512, 1024],
                   help="d_model of the timed GPTs, multiples of 8 (default 128 256 512 1024)")
    p.add_argument("--repeat", type=integer(1), default=5,
                   help="timed steps per size, the median shown (default %(default)s)")
    p.add_argument("--timeout", type=seconds, default=300.0,
                   help="seconds each process may run (default %(default)s)")
    add_json_options(p, "the results")
    p.add_argument("--inner", choices=("serial", "time"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if any(d % TIMED["heads"] for d in a.sizes):
        p.error(f"--sizes must be multiples of {TIMED['heads']} (the heads), got {a.sizes}")
    if a.inner == "serial":  # a measuring process: one JSON line
        print(json.dumps(serial_run(a.steps)))
        return 0
    if a.inner == "time":
        print(json.dumps(step_times(a.sizes, a.repeat)))
        return 0
    info, why = gpu()
    if info is None:
        line = f"{PROG}: no GPU here: {why}; nothing measured"
        print(json.dumps({"gpu": None, "reason": why}) if a.json else line)
        return 0
    res = measure(a, info)
    status = emit(PROG, a, res, format_text(res, a))
    return 1 if failed(res) else status


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(_dp_worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
