"""What the ``minipar`` command offers: its verbs, benchmarks and strategies, as data.

EN command registry · RU реестр команд · ZH 命令注册表

One table per kind of thing, read by the command line (:mod:`minipar.cli`,
:mod:`minipar.bench`, :mod:`minipar.run`) and by code that only needs to know
what exists (the glossary's link checker, the overview notebook), so that
nothing outside the command line imports a command-line module.  Importing
this module imports nothing else.

To add a verb, a benchmark or a strategy: add one row here.
"""

from __future__ import annotations

#: verb -> (module exposing ``main(argv)``, one-line help shown by ``minipar --help``)
VERBS: dict[str, tuple[str, str]] = {
    "demo": ("minipar.cli.demo", "a short multi-rank demo: ring all-reduce on N ranks, measured"),
    "bench": ("minipar.bench", "benchmarks: collectives, wait, model, ..."),
    "exercise": ("minipar.exercises.cli",
                 "mpirun exercises: list | start NAME | hint NAME | check NAME FILE"),
    "glossary": ("minipar.cli.glossary", "trilingual glossary lookup (EN / RU / ZH)"),
    "train": ("minipar.cli.train", "train the serial model (GPT or MLP) on a synthetic task"),
    "run": ("minipar.run", "train in parallel (dp ps zero tp sp cp pp ep hybrid), compare with serial"),
    "plan": ("minipar.cli.plan", "the papers' formulas: memory and bytes per rank at any scale"),
    "bubble": ("minipar.cli.bubble",
               "the pipeline bubble: schedule chart, fraction vs formula (theory or a run)"),
    "sample": ("minipar.cli.sample", "continue a prompt with a model trained on text (a checkpoint)"),
    "checkpoint": ("minipar.cli.checkpoint",
                   "a saved checkpoint: info DIR | export DIR OUT.safetensors"),
    "notebooks": ("minipar.cli.notebooks",
                  "every notebook executed, written as HTML pages with an index: --html DIR"),
    "doctor": ("minipar.cli.doctor",
               "this machine: Python, NumPy, MPI, backend, GPU, CUDA-aware MPI; what to fix"),
}

#: benchmark -> (module exposing ``main(argv)``, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "collectives": ("minipar.bench.collectives", "from-scratch collectives vs MPI's own (nccl-tests table)"),
    "wait": ("minipar.bench.wait", "CPU stolen by waiting ranks: MPI's blocking wait vs minipar's polling"),
    "model": ("minipar.bench.model", "GPT forward+backward time, NumPy vs PyTorch eager"),
    "train": ("minipar.bench.train",
              "training tokens/s and losses: minipar vs PyTorch, same weights, batches, AdamW"),
    "dp": ("minipar.bench.dp", "samples/s: serial vs data parallel on N ranks"),
    "zero": ("minipar.bench.zero", "ZeRO stages 0-3 step time vs DDP on N ranks, bytes per step"),
    "glossary": ("minipar.bench.glossary", "glossary lookup latency and process start time"),
    "plan": ("minipar.bench.plan", "minipar plan --layout --json: process time per layout"),
    "tp": ("minipar.bench.tp", "one block forward+backward: serial vs tensor-parallel on 2 ranks"),
    "cp": ("minipar.bench.cp",
           "context parallelism: ring, all-gather, Ulysses, USP; step time, bytes, memory"),
    "ep": ("minipar.bench.ep", "MoE step time: 1 rank vs expert parallel, vs dense; drops vs capacity"),
    "pp": ("minipar.bench.pp", "pipeline (2 stages, m = 8) vs serial throughput; the bubble measured"),
    "remat": ("minipar.bench.remat",
              "activation checkpointing: peak activation memory vs layers, and the extra compute"),
    "offload": ("minipar.bench.offload",
                "offloading activations and optimizer states to host / disk: bytes and time cost"),
    "precision": ("minipar.bench.precision",
                  "float32, bf16, fp8 per tensor / per tile, ZeRO-3 vs ZeRO++: validation "
                  "loss, bytes per step, quantization error with outliers"),
    "device": ("minipar.bench.device",
               "the CuPy backend on a GPU vs NumPy: serial and 2-rank parity, step time"),
    "all": ("minipar.bench.all", "every speed ratio at small sizes (model, dp, collectives), ~1 min"),
}

#: ``minipar run`` strategy -> (its module in :mod:`minipar.run`: options, checks and
#: measurements; the technique itself is in :mod:`minipar.parallel`), one-line help)
STRATEGIES: dict[str, tuple[str, str]] = {
    "dp": ("minipar.run.dp", "data parallelism: ring all-reduce of gradient buckets"),
    "ps": ("minipar.run.ps", "parameter server: workers push grads, pull params"),
    "zero": ("minipar.run.zero", "ZeRO stages 0-3: sharded optimizer states, grads, params"),
    "pp": ("minipar.run.pp", "pipeline parallelism: GPipe, 1F1B, interleaved; the bubble measured"),
    "cp": ("minipar.run.cp", "context parallelism: DeepSpeed-Ulysses or ring attention"),
    "tp": ("minipar.run.tp", "tensor parallelism (Megatron): columns and rows, on a dp x tp grid"),
    "sp": ("minipar.run.sp", "sequence parallelism (Korthikanti et al.): TP with LayerNorms split"),
    "ep": ("minipar.run.ep", "expert parallelism: experts over ranks, tokens by all-to-all"),
    "hybrid": ("minipar.run.hybrid", "3D/4D parallelism on one grid: dp x pp x cp x tp (x ep)"),
}

#: ``minipar run`` strategies that are planned, not built yet (the open issues build them):
#: asked for, they get a sentence saying so instead of argparse's "invalid choice"
PLANNED_STRATEGIES: dict[str, str] = {}
