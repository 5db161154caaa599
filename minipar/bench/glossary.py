"""``minipar bench glossary``: lookup latency (warm) and ``minipar glossary`` start-up time (cold).

What reads as instant: a warm lookup under 50 ms, and the whole process
``minipar glossary X`` under 0.3 s cold, which requires the glossary verb not
to import NumPy or mpi4py (the bench checks that too) and to import its
matching libraries only where a query needs them: ``snowballstemmer`` for a
Russian word the cache has not seen, ``rapidfuzz`` for typos, ``jieba`` for
a Chinese query no name matches as written (each cold case below names the
libraries it loaded).  Measured, never asserted in tests: this machine is
shared and noisy.

    minipar bench glossary [--repeat 20] [--runs 10]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from minipar import glossary as g
from minipar.cli.options import ArgumentParser, integer

#: exact, spelling variants, Russian inflections, spun Chinese, typos, slang and family words,
#: misses (a nonsense word; 天气预报 "weather forecast", Chinese with no term in it), a long query
QUERIES = [
    "all-reduce", "All Reduce", "ZeRO-3", "DP", "1F1B", "Ring-AllReduce", "micro-batches",
    "параллелизма данных", "контрольных точек активации", "тензорного параллелизма",
    "张量切分体例", "夹杂专家模子", "办事器", "流水线并行",
    "all-reduse", "pipline paralelism", "megatorn-lm", "параллелизм даных",
    "чекпоинтинг активаций", "шардирование", "sharding", "梯度累积", "流水线并行气泡", "ZeRO++",
    "xyzzyq", "天气预报", "how does ZeRO stage 3 shard the parameters across data-parallel ranks?",
    # as articles write them: reordered Russian, Chinese by its words, colloquial, near-collisions
    "градиентного накопления", "шардинг оптимизатора", "全部减少", "重新计算激活", "环全归约",
    "top-2 gating", "zero bubble", "3D printing",
]
HEAVY = ("numpy", "mpi4py", "matplotlib")
LIBRARIES = ("snowballstemmer", "rapidfuzz", "jieba")


def _stats(ms: list[float]) -> str:
    qs = sorted(ms)
    p95 = qs[min(len(qs) - 1, int(0.95 * len(qs)))]
    return f"median {statistics.median(ms):7.3f}  p95 {p95:7.3f}  max {max(ms):7.3f}"


def warm_lookups(repeat: int) -> dict[str, list[float]]:
    """Milliseconds per lookup for each query, after one warm-up call (data loaded, index built)."""
    g.lookup("warm-up")
    out: dict[str, list[float]] = {}
    for q in QUERIES:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            g.lookup(q)
            times.append((time.perf_counter() - t0) * 1e3)
        out[q] = times
    return out


def cold_runs(runs: int, cases: list[tuple[list[str], dict[str, str]]]) -> list[tuple[list[float], str]]:
    """Seconds per whole process ``python -m minipar.cli glossary ARGS`` for each case (round-robin,
    so load from other processes hits every case alike), and which of HEAVY + LIBRARIES each
    loaded (comma-separated)."""
    probe = ("import sys, runpy; sys.argv = ['minipar'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('minipar.cli', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             f"print('HEAVY=' + ','.join(m for m in {HEAVY + LIBRARIES!r} if m in sys.modules),"
             " file=sys.stderr)")
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(runs):
        for i, (args, env) in enumerate(cases):
            cmd = [sys.executable, "-m", "minipar.cli", "glossary", *args]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, timeout=60, check=False,
                                  env={**os.environ, **env})
            if proc.returncode not in (0, 1):  # 1: "no match", an answer too
                raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.decode()[-500:]}")
            times[i].append(time.perf_counter() - t0)
    out = []
    for (args, env), ts in zip(cases, times):
        proc = subprocess.run([sys.executable, "-c", probe, "glossary", *args], capture_output=True,
                              text=True, timeout=60, check=True, env={**os.environ, **env})
        out.append((ts, proc.stderr.strip().rsplit("HEAVY=", 1)[-1]))
    return out


def baseline(runs: int) -> list[float]:
    """Seconds for a bare ``python -c pass``: the floor under any process time."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="minipar bench glossary", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=integer(1), default=20,
                   help="timed lookups per query (default 20)")
    p.add_argument("--runs", type=integer(1), default=10, help="cold process runs (default 10)")
    args = p.parse_args(argv)

    loads = {}
    g.clear_caches()
    g.lookup("all-reduce")  # makes sure the cache file exists (unless MINIPAR_NO_CACHE is set)
    for label, no_cache in (("parse TOML + build index", "1"), ("from the cache", "")):
        os.environ["MINIPAR_NO_CACHE"] = no_cache
        g.clear_caches()
        t0 = time.perf_counter()
        g.lookup("all-reduce")
        loads[label] = (time.perf_counter() - t0) * 1e3
    os.environ.pop("MINIPAR_NO_CACHE")
    print(f"glossary: {len(g.terms())} terms from {g.data_dir()}; load + index + first lookup: "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in loads.items()))

    per_query = warm_lookups(args.repeat)
    every = [t for ts in per_query.values() for t in ts]
    print(f"\nwarm lookup, ms ({len(QUERIES)} queries x {args.repeat}):")
    width = max(len(q[:40]) for q in QUERIES)
    for q, ts in per_query.items():
        print(f"  {q[:40]:<{width}}  {_stats(ts)}")
    print(f"  {'ALL':<{width}}  {_stats(every)}   (under 50 ms reads as instant)")

    seeds = sorted((g.data_dir() / "_seeds").glob("*.txt"))
    for path in seeds:
        text = path.read_text(encoding="utf-8")
        t0 = time.perf_counter()
        found = g.scan(text)
        dt = (time.perf_counter() - t0) * 1e3
        print(f"\nscan {path.name}: {len(text)} chars, {len(found)} mentions of "
              f"{len({m.id for m in found})} terms in {dt:.1f} ms")
    big = (seeds[0].read_text(encoding="utf-8") * 300)[:1_000_000] if seeds else "DP " * 333_334
    t0 = time.perf_counter()
    n = len(g.scan(big))
    print(f"scan 1,000,000 chars: {n} mentions in {time.perf_counter() - t0:.2f} s")

    floor = baseline(args.runs)
    print(f"\ncold process, s ({args.runs} runs each):")
    print(f"  python -c pass                             median {statistics.median(floor):.3f}  "
          f"max {max(floor):.3f}")
    cases: list[tuple[list[str], dict[str, str]]] = [
        (["all-reduce"], {}), (["张量切分体例", "--json"], {}), (["градиентного", "накопления"], {}),
        (["全部减少"], {}), (["xyzzyq"], {}), (["--list"], {}),
        (["all-reduce"], {"MINIPAR_NO_CACHE": "1"})]
    every_cold: list[float] = []
    for (qargs, env), (times, loaded) in zip(cases, cold_runs(args.runs, cases)):
        label = "minipar glossary " + " ".join(qargs) + (" (no cache)" if env else "")
        heavy = ",".join(m for m in loaded.split(",") if m in HEAVY) or "none"
        libs = ",".join(m for m in loaded.split(",") if m in LIBRARIES) or "none"
        if not env:
            every_cold += times
        print(f"  {label:<42} median {statistics.median(times):.3f}  max {max(times):.3f}  "
              f"(NumPy/mpi4py/matplotlib imported: {heavy}; matching libraries: {libs})")
    print(f"  {'every case from the cache':<42} median {statistics.median(every_cold):.3f}  "
          f"max {max(every_cold):.3f}  (under 0.3 s reads as instant)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
