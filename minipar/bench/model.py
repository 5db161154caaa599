"""Model benchmark — замер скорости модели — 模型基准测试: ``minipar bench model``.

GPT forward+backward time, NumPy vs PyTorch eager, one thread.

The serial model must be fast enough that every parallel demo runs in
seconds, so it is measured against the reference implementation of the
field.  Both run the same GPT (same weights, float32, one BLAS thread:
the measurement runs in a subprocess started with ``OMP_NUM_THREADS=1``
and friends, and PyTorch gets ``torch.set_num_threads(1)``).  PyTorch's
attention is ``F.scaled_dot_product_attention(is_causal=True)`` as in
nanoGPT.  One row per size; ``ratio`` = NumPy time / PyTorch time (1.0:
as fast as PyTorch eager), and the two losses are compared as a check that
the models agree.  Times are medians of ``--repeat`` runs, NumPy and
PyTorch alternating, after two warm-up rounds, in CPU seconds of the measuring process (``time.process_time``): on a
shared machine wall time also counts the time other processes hold the
core, CPU time does not.
PyTorch is optional: without it only the NumPy column is filled.  A progress
bar on stderr counts the sizes (:mod:`minipar.progress`).
"""

from __future__ import annotations

import argparse
import functools
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


def _median_times(fns: list[Any], repeat: int, warmup: int = 2) -> list[float]:
    """The median CPU time of each of ``fns``, run alternately (``fns[0]``, ``fns[1]``, …,
    ``repeat`` rounds) after ``warmup`` alternating rounds: a drift of the machine (another
    process, the clock) then hits every column alike, and the process's first steps
    (its heap growing to the step's peak, first-touch page faults) are not counted."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.process_time()
            fn()
            ts.append(time.process_time() - t0)
    return [statistics.median(ts) for ts in times]


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


def _import_torch() -> Any:
    """PyTorch set to one thread, or None when it is not installed."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


def measure(names: list[str], repeat: int, use_torch: bool = True,
            progress: str | None = None, dtype: str = "float32") -> list[dict[str, Any]]:
    """Measure in this process (call it with one BLAS thread): one dict per size."""
    import numpy as np

    from minipar.nn import GPT, GPTConfig

    torch = _import_torch() if use_torch else None
    rows = []
    for name in names:
        d, n_layer, n_head, t, b, v = SIZES[name]
        model = GPT(GPTConfig(vocab_size=v, block_size=t, n_layer=n_layer, n_head=n_head,
                              d_model=d, dtype=dtype))
        params = model.init(0)
        r = np.random.default_rng(0)
        x, y = r.integers(0, v, (b, t)), r.integers(0, v, (b, t))
        row: dict[str, Any] = {"size": name, "d_model": d, "n_layer": n_layer, "seq": t,
                               "batch": b, "params": model.n_params(),
                               "numpy_s": None, "torch_s": None, "ratio": None,
                               "loss_diff": None}
        fns = [lambda m=model, p=params, x=x, y=y: m.loss_and_grads(p, x, y)]
        if torch is not None:
            step, loss_fn = _torch_step(torch, params, x, y, n_layer, n_head)
            fns.append(step)
        times = _median_times(fns, repeat)
        row["numpy_s"] = times[0]
        if torch is not None:
            row["torch_s"] = times[1]
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


# ------------------------------------------------------------------ --profile
#: the operation kinds of the profile, in the order of the table; each minipar function
#: below is charged its *self* time (its callees' time goes to their own kinds)
KINDS = ("matmuls (QKV, out, MLP, lm_head)", "attention core (batched matmuls, softmax)",
         "heads split/merge, concat (copies)", "layer norm", "GELU", "embedding",
         "loss (softmax cross-entropy)", "bias/residual adds, bias grads, glue",
         "executor: hooks, bookkeeping", "other (autograd engine, Python)")

#: minipar function -> kind, by module (functions are imported by name into other modules,
#: so each module's reference is wrapped)
_MINIPAR_KINDS = {
    "linear_forward": 0, "linear_backward": 0, "matmul": 0,
    "attention_core_forward": 1, "attention_core_backward": 1, "causal_mask": 1,
    "attention_forward": 2, "attention_backward": 2, "split_heads": 2, "merge_heads": 2,
    "layernorm_forward": 3, "layernorm_backward": 3,
    "gelu_forward": 4, "gelu_backward": 4,
    "embedding_forward": 5, "embedding_backward": 5, "embed_forward": 5, "embed_backward": 5,
    "cross_entropy_forward": 6, "cross_entropy_backward": 6,
    "bias_forward": 7, "bias_backward": 7,
    "block_forward": 7, "block_backward": 7, "mlp_forward": 7, "mlp_backward": 7,
    "head_forward": 7, "head_backward": 7, "serial_steps": 7, "sub": 7, "_ffn_backward": 7,
    "forward": 8, "backward": 8, "loss_and_grads": 8,
}
_MINIPAR_MODULES = ("minipar.nn.dtypes", "minipar.nn.layers", "minipar.nn.attention",
                    "minipar.nn.mlp", "minipar.nn.gpt", "minipar.nn.loss",
                    "minipar.nn.executor")

#: PyTorch operator (``torch.profiler`` self CPU time) -> kind; the rest is "other"
_TORCH_KINDS = {
    "aten::mm": 0, "aten::bmm": 0, "aten::addmm": 0,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 1,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 1,
    "aten::copy_": 2, "aten::clone": 2, "aten::cat": 2, "aten::empty_like": 2,
    "aten::native_layer_norm": 3, "aten::native_layer_norm_backward": 3,
    "aten::gelu": 4, "aten::gelu_backward": 4,
    "aten::index": 5, "aten::index_put_": 5, "aten::_index_put_impl_": 5,
    "aten::embedding_dense_backward": 5, "aten::new_zeros": 5, "aten::zero_": 5,
    "aten::_log_softmax": 6, "aten::_log_softmax_backward_data": 6,
    "aten::nll_loss_forward": 6, "aten::nll_loss_backward": 6,
    "aten::add": 7, "aten::add_": 7, "aten::sum": 7,
}


class _SelfTimer:
    """Wraps functions so that each call's self time (its own time minus that of the
    wrapped functions it calls) is added to its kind: a stack of open calls."""

    def __init__(self) -> None:
        self.total = [0.0] * len(KINDS)
        self._stack: list[list[float]] = []  # [kind, t_start, time of wrapped callees]

    def wrap(self, fn: Any, kind: int) -> Any:
        stack, total, now = self._stack, self.total, time.perf_counter

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [kind, now(), 0.0]
            stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                stack.pop()
                spent = now() - frame[1]
                total[kind] += spent - frame[2]
                if stack:
                    stack[-1][2] += spent

        return timed


def _profile_minipar(model: Any, params: Any, x: Any, y: Any, repeat: int) -> list[float]:
    """Seconds per step of each kind for ``model.loss_and_grads`` (mean of ``repeat``)."""
    import importlib

    timer = _SelfTimer()
    saved = []
    for mod_name in _MINIPAR_MODULES:
        mod = importlib.import_module(mod_name)
        for fn_name, kind in _MINIPAR_KINDS.items():
            fn = getattr(mod, fn_name, None)
            if callable(fn) and getattr(fn, "__module__", "").startswith("minipar.nn"):
                saved.append((mod, fn_name, fn))
                setattr(mod, fn_name, timer.wrap(fn, kind))
    try:
        model.loss_and_grads(params, x, y)  # warm-up
        timer.total[:] = [0.0] * len(KINDS)
        t0 = time.perf_counter()
        for _ in range(repeat):
            model.loss_and_grads(params, x, y)
        wall = time.perf_counter() - t0
    finally:
        for mod, fn_name, fn in saved:
            setattr(mod, fn_name, fn)
    out = [t / repeat for t in timer.total]
    out[-1] = max(0.0, wall / repeat - sum(out))
    return out


def _profile_torch(torch: Any, step: Any, repeat: int) -> list[float]:
    """Seconds per step of each kind for the PyTorch step, from ``torch.profiler``'s self
    CPU time per operator; "other" is the rest of the step's wall time (autograd engine,
    views, Python)."""
    step()  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(repeat):
            step()
        wall = time.perf_counter() - t0
    out = [0.0] * len(KINDS)
    for ev in prof.key_averages():
        kind = _TORCH_KINDS.get(ev.key)
        if kind is not None:
            out[kind] += ev.self_cpu_time_total * 1e-6 / repeat
    out[-1] = max(0.0, wall / repeat - sum(out))
    return out


def profile(names: list[str], repeat: int, use_torch: bool = True,
            dtype: str = "float32") -> list[dict[str, Any]]:
    """Per size, the time per step of each operation kind, minipar's and PyTorch's (one
    thread, measured in this process one after the other): wall seconds under the
    profilers' own overhead (a few µs per call), so the totals sit a little above
    :func:`measure`'s."""
    import numpy as np

    from minipar.nn import GPT, GPTConfig

    torch = _import_torch() if use_torch else None
    out = []
    for name in names:
        d, n_layer, n_head, t, b, v = SIZES[name]
        model = GPT(GPTConfig(vocab_size=v, block_size=t, n_layer=n_layer, n_head=n_head,
                              d_model=d, dtype=dtype))
        params = model.init(0)
        r = np.random.default_rng(0)
        x, y = r.integers(0, v, (b, t)), r.integers(0, v, (b, t))
        ours = _profile_minipar(model, params, x, y, repeat)
        theirs = None
        if torch is not None:
            theirs = _profile_torch(torch, _torch_step(torch, params, x, y, n_layer, n_head)[0],
                                    repeat)
        out.append({"size": name, "d_model": d,
                    "kinds": [{"kind": k, "numpy_s": ours[i],
                               "torch_s": None if theirs is None else theirs[i]}
                              for i, k in enumerate(KINDS)]})
    return out


def profile_table(sizes: list[dict[str, Any]]) -> str:
    """The profile as one plain-text table per size (milliseconds per step)."""
    blocks = []
    for s in sizes:
        head = f"{s['size']} (d_model {s['d_model']})"
        head = f"{head:<44} {'numpy ms':>9} {'torch ms':>9} {'ratio':>6}"
        lines = [head, "-" * len(head)]
        tn = tt = 0.0
        for k in s["kinds"]:
            tn += k["numpy_s"]
            tt += k["torch_s"] or 0.0
            lines.append(_profile_line(k["kind"], k["numpy_s"], k["torch_s"]))
        has_torch = s["kinds"][0]["torch_s"] is not None
        lines.append(_profile_line("total", tn, tt if has_torch else None))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _profile_line(kind: str, n: float, t: float | None) -> str:
    ts = f"{1e3 * t:9.2f}" if t is not None else f"{'-':>9}"
    ratio = f"{n / t:6.2f}" if t else f"{'-':>6}"
    return f"{kind:<44} {1e3 * n:9.2f} {ts} {ratio}"


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="minipar bench model", description=__doc__.split("\n\n")[0])
    sizes = ", ".join(f"{k} (d_model {v[0]}, {v[1]} layers)" for k, v in SIZES.items())
    p.add_argument("--sizes", nargs="+", default=["small", "medium", "large"], choices=list(SIZES),
                   help=f"GPT sizes to time, from {sizes} (default small medium large)")
    p.add_argument("--repeat", type=integer(1), default=5,
                   help="timed runs per size, the median is shown (default %(default)s)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="the model's dtype, the same in PyTorch (default %(default)s)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    p.add_argument("--profile", action="store_true",
                   help="instead of the step times: where the time goes, per operation kind, "
                        "minipar's and the same operations' in PyTorch (torch.profiler)")
    add_json_options(p, "the rows")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--progress", help=argparse.SUPPRESS)  # the inner process's progress file
    return p


def main(argv: list[str]) -> int:
    from minipar.progress import watched

    p = _parser()
    a = p.parse_args(argv)
    if a.inner:  # the measuring subprocess: print rows as JSON
        if a.profile:
            print(json.dumps(profile(a.sizes, a.repeat, not a.no_torch, a.dtype)))
        else:
            print(json.dumps(measure(a.sizes, a.repeat, not a.no_torch, a.progress, a.dtype)))
        return 0
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    cmd = [sys.executable, "-m", "minipar.bench.model", "--inner", "--repeat", str(a.repeat),
           "--sizes", *a.sizes, "--dtype", a.dtype] + (["--no-torch"] if a.no_torch else []) \
        + (["--profile"] if a.profile else [])
    with watched(len(a.sizes), "size") as progress:
        proc = subprocess.run(cmd + ["--progress", progress], env=env, capture_output=True,
                              text=True, timeout=1800, check=False)
    if proc.returncode:  # a crash while measuring, not bad input: show all of it
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    if a.profile:
        text = (f"GPT forward+backward per operation kind, {a.dtype}, one thread, wall ms per step "
                f"(mean of {a.repeat}; self time, each call's callees charged to their own "
                "kind; ratio = numpy / torch, 1.0 = as fast as PyTorch eager)\n"
                + profile_table(rows))
        return emit("minipar bench model --profile", a, rows, text)
    text = (f"GPT forward+backward, {a.dtype}, one thread, CPU time (median of "
            f"{a.repeat}; ratio = numpy / torch)\n" + table(rows))
    return emit("minipar bench model", a, rows, text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
