"""Model benchmark — замер скорости модели — 模型基准测试: ``minipar bench model``.

GPT forward+backward time, NumPy vs PyTorch eager, one thread.

The serial model must be fast enough that every parallel demo runs in
seconds, so it is measured against the reference implementation of the
field.  Both run the same GPT (same weights, float32, one BLAS thread:
the measurement runs in a subprocess started with ``OMP_NUM_THREADS=1``
and friends, and PyTorch gets ``torch.set_num_threads(1)``).  PyTorch's
attention is ``F.scaled_dot_product_attention(is_causal=True)`` as in
nanoGPT.  One row per size; ``ratio`` = NumPy time / PyTorch time (target
≤ 1.5 at d_model ≥ 256), and the two losses are compared as a check that
the models agree.  Times are medians of ``--repeat`` runs after a warm-up,
in CPU seconds of the measuring process (``time.process_time``): on a
shared machine wall time also counts the time other processes hold the
core, CPU time does not.
PyTorch is optional: without it only the NumPy column is filled.  A progress
bar on stderr counts the sizes (:mod:`minipar.progress`).
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
from minipar.cli.options import ArgumentParser, add_json_options, integer
from minipar.progress import tick

#: name -> (d_model, n_layer, n_head, seq_len, batch, vocab)
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "tiny": (32, 1, 2, 16, 2, 64),
    "small": (128, 2, 4, 64, 8, 512),
    "medium": (256, 4, 8, 128, 8, 1024),
    "large": (512, 4, 8, 128, 8, 1024),
}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def _median_time(fn: Any, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def torch_gpt_loss(torch: Any, tp: dict[str, Any], x_tok: Any, y_tok: Any, n_layer: int,
                   n_head: int) -> Any:
    """The mean cross-entropy of :class:`minipar.nn.GPT`, written with PyTorch ops.

    ``tp``: the GPT's parameters as torch tensors under minipar's names
    (``GPT.param_shapes()``); ``x_tok``, ``y_tok``: (B, T) long tensors.  The
    same GPT as ``minipar.nn.gpt`` (pre-LayerNorm blocks, fused q, k, v,
    tanh GELU, an untied ``lm_head``), attention by
    ``F.scaled_dot_product_attention(is_causal=True)`` as in nanoGPT; also the
    PyTorch side of ``minipar bench train``."""
    f = torch.nn.functional
    b, t = x_tok.shape
    d = tp["tok_emb"].shape[1]
    x = tp["tok_emb"][x_tok] + tp["pos_emb"][:t]
    for i in range(n_layer):
        p = {k[len(f"blocks.{i}."):]: v for k, v in tp.items() if k.startswith(f"blocks.{i}.")}
        h = f.layer_norm(x, (d,), p["ln1.gamma"], p["ln1.beta"], 1e-5)
        q, k, v = (h @ p["attn.w_qkv"] + p["attn.b_qkv"]).split(d, dim=-1)
        q, k, v = (a.view(b, t, n_head, d // n_head).transpose(1, 2) for a in (q, k, v))
        o = f.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + o.transpose(1, 2).reshape(b, t, d) @ p["attn.w_out"] + p["attn.b_out"]
        h = f.layer_norm(x, (d,), p["ln2.gamma"], p["ln2.beta"], 1e-5)
        h = f.gelu(h @ p["mlp.w_in"] + p["mlp.b_in"], approximate="tanh")
        x = x + h @ p["mlp.w_out"] + p["mlp.b_out"]
    x = f.layer_norm(x, (d,), tp["ln_f.gamma"], tp["ln_f.beta"], 1e-5)
    logits = x @ tp["lm_head"]
    return f.cross_entropy(logits.view(-1, logits.shape[-1]), y_tok.view(-1))


def _torch_step(torch: Any, params: dict[str, Any], tokens: Any, targets: Any, n_layer: int,
                n_head: int) -> tuple[Any, Any]:
    """:func:`torch_gpt_loss` on fixed weights and one batch: returns (step fn, loss fn)."""
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    x_tok, y_tok = torch.tensor(tokens), torch.tensor(targets)

    def loss() -> Any:
        return torch_gpt_loss(torch, tp, x_tok, y_tok, n_layer, n_head)

    def step() -> None:
        for v in tp.values():
            v.grad = None
        loss().backward()

    return step, loss


def measure(names: list[str], repeat: int, use_torch: bool = True,
            progress: str | None = None) -> list[dict[str, Any]]:
    """Measure in this process (call it with one BLAS thread): one dict per size."""
    import numpy as np

    from minipar.nn import GPT, GPTConfig

    torch = None
    if use_torch:
        try:
            import torch  # type: ignore[import-not-found, no-redef]

            torch.set_num_threads(1)
        except ImportError:
            torch = None
    rows = []
    for name in names:
        d, n_layer, n_head, t, b, v = SIZES[name]
        model = GPT(GPTConfig(vocab_size=v, block_size=t, n_layer=n_layer, n_head=n_head,
                              d_model=d, dtype="float32"))
        params = model.init(0)
        r = np.random.default_rng(0)
        x, y = r.integers(0, v, (b, t)), r.integers(0, v, (b, t))
        row: dict[str, Any] = {"size": name, "d_model": d, "n_layer": n_layer, "seq": t,
                               "batch": b, "params": model.n_params(),
                               "numpy_s": _median_time(
                                   lambda m=model, p=params, x=x, y=y: m.loss_and_grads(p, x, y),
                                   repeat),
                               "torch_s": None, "ratio": None, "loss_diff": None}
        if torch is not None:
            step, loss_fn = _torch_step(torch, params, x, y, n_layer, n_head)
            row["torch_s"] = _median_time(step, repeat)
            row["ratio"] = row["numpy_s"] / row["torch_s"]
            row["loss_diff"] = abs(float(loss_fn().detach()) - model.loss(params, x, y))
        rows.append(row)
        tick(progress)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a plain-text table (milliseconds)."""
    head = f"{'size':<7} {'d_model':>7} {'layers':>6} {'B x T':>8} {'params':>10} " \
           f"{'numpy ms':>9} {'torch ms':>9} {'ratio':>6} {'|dloss|':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        torch_ms = f"{1e3 * r['torch_s']:9.2f}" if r["torch_s"] is not None else f"{'-':>9}"
        ratio = f"{r['ratio']:6.2f}" if r["ratio"] is not None else f"{'-':>6}"
        diff = f"{r['loss_diff']:8.1e}" if r["loss_diff"] is not None else f"{'-':>8}"
        lines.append(f"{r['size']:<7} {r['d_model']:>7} {r['n_layer']:>6} "
                     f"{str(r['batch']) + 'x' + str(r['seq']):>8} {r['params']:>10} "
                     f"{1e3 * r['numpy_s']:9.2f} {torch_ms} {ratio} {diff}")
    if all(r["torch_s"] is None for r in rows):
        lines.append("(PyTorch not installed or --no-torch: NumPy column only)")
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="minipar bench model", description=__doc__.split("\n\n")[0])
    sizes = ", ".join(f"{k} (d_model {v[0]}, {v[1]} layers)" for k, v in SIZES.items())
    p.add_argument("--sizes", nargs="+", default=["small", "medium", "large"], choices=list(SIZES),
                   help=f"GPT sizes to time, from {sizes} (default small medium large)")
    p.add_argument("--repeat", type=integer(1), default=5,
                   help="timed runs per size, the median is shown (default %(default)s)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    add_json_options(p, "the rows")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--progress", help=argparse.SUPPRESS)  # the inner process's progress file
    return p


def main(argv: list[str]) -> int:
    from minipar.progress import watched

    p = _parser()
    a = p.parse_args(argv)
    if a.inner:  # the measuring subprocess: print rows as JSON
        print(json.dumps(measure(a.sizes, a.repeat, not a.no_torch, a.progress)))
        return 0
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    cmd = [sys.executable, "-m", "minipar.bench.model", "--inner", "--repeat", str(a.repeat),
           "--sizes", *a.sizes] + (["--no-torch"] if a.no_torch else [])
    with watched(len(a.sizes), "size") as progress:
        proc = subprocess.run(cmd + ["--progress", progress], env=env, capture_output=True,
                              text=True, timeout=1800, check=False)
    if proc.returncode:  # a crash while measuring, not bad input: show all of it
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    text = ("GPT forward+backward, float32, one thread, CPU time (median of "
            f"{a.repeat}; ratio = numpy / torch)\n" + table(rows))
    return emit("minipar bench model", a, rows, text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
