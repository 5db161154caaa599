"""``minipar bench plan``: how long ``minipar plan --layout ... --json`` takes, cold and warm.

Evaluating one layout should read as instant: the whole process under a second (start,
imports, the estimate, the JSON).  Timed here on layouts of the size people ask about,
never asserted in tests (this machine is shared and noisy): the whole process per
layout (cold), and :func:`minipar.plan.step_time.estimate` alone in one process (warm).

    minipar bench plan [--runs 10] [--json] [--json-out FILE]
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time

from minipar.bench import emit
from minipar.cli.options import ArgumentParser, add_json_options, integer

#: argv of ``minipar plan``: the issue's GPT-3 175B run, PTD-P's 1T, ZeRO-3, Llama 3 at 128K
CASES = [
    "--model gpt3-175b --cluster dgx-a100 --gpus 1536 --global-batch 1536 "
    "--layout dp=16,tp=8,pp=12,vp=2,mb=1,zero=1,remat=selective,sp=on",
    "--model ptdp-1t --cluster dgx-a100 --gpus 3072 --global-batch 3072 "
    "--layout tp=8,pp=64,mb=1,remat=full,sp=off,overlap=off",
    "--model gpt3-175b --cluster dgx-a100 --gpus 384 --global-batch 1536 "
    "--layout zero=3,mb=4,remat=full",
    "--model llama3-405b --cluster h200 --gpus 2304 --global-batch 16 --seq 131072 "
    "--layout tp=8,pp=9,cp=16,mb=1,zero=2,flash=on,remat=full,cpkind=allgather"]


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="minipar bench plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=integer(1), default=10, help="runs per layout (default 10)")
    add_json_options(p, "the times")
    args = p.parse_args(argv)
    from minipar.cli.plan import main as plan_main

    data: dict[str, dict[str, object]] = {}
    lines = []
    for case in CASES:
        cmd = [sys.executable, "-m", "minipar.cli", "plan", *case.split(), "--json"]
        cold = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, timeout=60, check=True)
            cold.append(time.perf_counter() - t0)
        with open(os.devnull, "w") as sink:  # the same call in this process: estimate + JSON
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(sink):
                for _ in range(args.runs):
                    plan_main([*case.split(), "--json"])
            warm = (time.perf_counter() - t0) / args.runs
        data[case] = {"process_s": cold, "in_process_s": warm}
        lines.append(f"minipar plan {case.split()[1]} ... --layout {case.split()[-1]} --json\n"
                     f"  process median {statistics.median(cold):.3f} s, max {max(cold):.3f} s; "
                     f"in one process {warm * 1e3:.1f} ms")
    every = [x for d in data.values() for x in d["process_s"]]  # type: ignore[attr-defined]
    lines.append(f"every case, whole process: median {statistics.median(every):.3f} s, max "
                 f"{max(every):.3f} s (under 1 s reads as instant)")
    return emit("minipar bench plan", args, data, "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
