"""``minipar bench WHAT``: benchmarks, measured side by side in one run.

Speed and memory targets live here, never as timed assertions in tests: the
machine is shared and noisy, so a benchmark reports *ratios* of things
measured in the same run (our ring vs MPI's Allreduce, our model vs PyTorch).
Each benchmark is a module with ``main(argv) -> int``.
"""

from __future__ import annotations

import importlib
import sys

#: name -> (module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "collectives": ("minipar.bench.collectives", "from-scratch collectives vs MPI's own (nccl-tests table)"),
    "wait": ("minipar.bench.wait", "CPU stolen by waiting ranks: MPI's blocking wait vs minipar's polling"),
    "model": ("minipar.bench.model", "GPT forward+backward time, NumPy vs PyTorch eager"),
    "dp": ("minipar.bench.dp", "samples/s: serial vs data parallel on N ranks"),
    "zero": ("minipar.bench.zero", "ZeRO stages 0-3 step time vs DDP on N ranks, bytes per step"),
    "glossary": ("minipar.bench.glossary", "glossary lookup latency and process start time"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, BENCHES))
        print("usage: minipar bench WHAT [options]\n\nbenchmarks:")
        for name, (_, help_) in BENCHES.items():
            print(f"  {name:<{width}}  {help_}")
        return 0 if argv else 2
    name = argv[0]
    if name not in BENCHES:
        print(f"minipar bench: unknown benchmark {name!r}; one of {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHES[name][0]).main(argv[1:]) or 0)
