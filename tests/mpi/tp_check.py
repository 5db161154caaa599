"""All checks of tensor (and sequence) parallelism for one world size, in one launch.

Run by tests/test_tensor_parallel.py as ``launch.run(N, this file)``; rank 0 prints
``TP-SUMMARY N=<N> checks=<k> failures=<f>`` and the first failures (exit 1 if any).

1. layers against the serial ones (float64, tight): ColumnParallelLinear (gather_output
   on/off, SP), RowParallelLinear (input_is_parallel on/off, SP), VocabParallelEmbedding,
   the vocab-parallel cross-entropy (loss and gradient; no rank holds the full logits);
2. the GPT: logits, loss, every gradient against GPT.loss_and_grads — TP at t = N
   (heads 3 when N = 3), TP+SP, a MoE GPT under TP;
3. counted: a block makes exactly 2 all-reduces forward and 2 backward, each rank sends
   the ring figure on b·s·h elements; SP's pairs send the same bytes;
4. training: several AdamW steps, the shared verdict against the serial run — TP, TP+SP,
   TP x DP on a 2 x 2 grid (N = 4), MoE under TP;
5. bad input: heads / d_ff / vocab not divisible by t, SP's sequence not divisible: a
   one-line ValueError on every rank, before any message.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar.collectives.cost import allreduce_bytes_sent
from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.data import synthetic
from minipar.nn import GPT, GPTConfig
from minipar.nn.layers import embedding_forward, linear_backward, linear_forward
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.optim import FlatParams
from minipar.parallel import loop
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.parity import compare
from minipar.parallel.tensor_parallel.engine import TensorParallel, TensorParallelGPT
from minipar.parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy_backward,
    vocab_parallel_cross_entropy_forward,
)
from minipar.parallel.tensor_parallel.overlap import (
    AsyncColumnParallelLinear,
    AsyncRowParallelLinear,
)
from minipar.parallel.tensor_parallel.measure import (
    BLOCK_OPS,
    block_bytes_formula,
    bytes_by_op,
    tp_axis_bytes_formula,
)
from minipar.parallel.tensor_parallel.shards import (
    gather_params,
    split_columns,
    split_rows,
    split_sequence,
)

comm = TracedComm(MPI.COMM_WORLD)
N, R = comm.size, comm.rank
c = Checks("TP")


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def gather_last(x: np.ndarray) -> np.ndarray:
    return np.concatenate(comm.comm.allgather(x), axis=-1)


# -- 1. layers --------------------------------------------------------------------------
B_, S_, D, F = 2, 2 * N, 6, 4 * N
x, w, b = rand((B_, S_, D), 1), rand((D, F), 2), rand((F,), 3)
y_ser, s_ser = linear_forward(x, w)
y_ser = y_ser + b
dy = rand((B_, S_, F), 4)
dx_ser, dw_ser = linear_backward(w, s_ser, dy)
p_col = {"w": split_columns(w, N, R), "b": split_columns(b, N, R)}
for gather in (False, True):
    col = ColumnParallelLinear(comm, gather_output=gather)
    y, s = col.forward(p_col, x)
    c.close(y if gather else gather_last(y), y_ser, f"column y gather={gather}", rtol=1e-12)
    dx, g = col.backward(p_col, s, dy if gather else split_columns(dy, N, R))
    c.close(dx, dx_ser, f"column dx gather={gather}", rtol=1e-12)
    c.close(g["w"], split_columns(dw_ser, N, R), "column dw", rtol=1e-12)
    c.close(g["b"], split_columns(dy.sum(axis=(0, 1)), N, R), "column db", rtol=1e-12)
col = ColumnParallelLinear(comm, sequence_parallel=True)
y, s = col.forward(p_col, split_sequence(x, N, R))
c.close(gather_last(y), y_ser, "column SP y", rtol=1e-12)
dx, g = col.backward(p_col, s, split_columns(dy, N, R))
c.close(dx, split_sequence(dx_ser, N, R), "column SP dx", rtol=1e-12)
c.close(g["w"], split_columns(dw_ser, N, R), "column SP dw", rtol=1e-12)

w2, b2 = rand((F, D), 5), rand((D,), 6)
h = rand((B_, S_, F), 7)
y2_ser, s2 = linear_forward(h, w2)
y2_ser = y2_ser + b2
dy2 = rand((B_, S_, D), 8)
dh_ser, dw2_ser = linear_backward(w2, s2, dy2)
p_row = {"w": split_rows(w2, N, R), "b": b2}
for parallel_in in (True, False):
    row = RowParallelLinear(comm, input_is_parallel=parallel_in)
    y, s = row.forward(p_row, split_columns(h, N, R) if parallel_in else h)
    c.close(y, y2_ser, f"row y input_is_parallel={parallel_in}", rtol=1e-12)
    dh, g = row.backward(p_row, s, dy2)
    c.close(dh, split_columns(dh_ser, N, R) if parallel_in else dh_ser, "row dx", rtol=1e-12)
    c.close(g["w"], split_rows(dw2_ser, N, R), "row dw", rtol=1e-12)
    c.close(g["b"], dy2.sum(axis=(0, 1)), "row db (bias once)", rtol=1e-12)
row = RowParallelLinear(comm, sequence_parallel=True)
y, s = row.forward(p_row, split_columns(h, N, R))
c.close(y, split_sequence(y2_ser, N, R), "row SP y", rtol=1e-12)
# the overlapped forms (--tp-overlap): the same results, the same bytes under the same names
for sp in (False, True):
    comm.stats.reset()
    col, row = (ColumnParallelLinear(comm, sequence_parallel=sp),
                RowParallelLinear(comm, sequence_parallel=sp))
    blocking = []
    for overlapped in (False, True):
        if overlapped:
            col.__class__, row.__class__ = AsyncColumnParallelLinear, AsyncRowParallelLinear
        sent0 = comm.stats.bytes_sent()
        y, s = col.forward(p_col, split_sequence(x, N, R) if sp else x)
        dx, g = col.backward(p_col, s, split_columns(dy, N, R))
        y2, _ = row.forward(p_row, split_columns(h, N, R))
        out = (y, dx, g["w"], y2, comm.stats.bytes_sent() - sent0)
        if not overlapped:
            blocking = out
            continue
        for k, what in enumerate(("y", "dx", "dw", "row y")):
            c.close(out[k], blocking[k], f"overlapped SP={sp} {what}", rtol=1e-12)
        c.check(out[4] == blocking[4], f"overlapped SP={sp}: sent {out[4]} bytes, "
                f"blocking {blocking[4]}")

V = 4 * N
table = rand((V, D), 9)
ids = np.random.default_rng(10).integers(0, V, (B_, S_))
emb = VocabParallelEmbedding(comm, V)
e, s = emb.forward({"table": split_rows(table, N, R)}, ids)
c.close(e, embedding_forward(table, ids)[0], "vocab-parallel embedding", rtol=1e-12)
de = rand((B_, S_, D), 11)
dtab = np.zeros_like(table)
np.add.at(dtab, ids.reshape(-1), de.reshape(-1, D))
c.close(emb.backward({"table": split_rows(table, N, R)}, s, de)[1]["table"],
        split_rows(dtab, N, R), "vocab-parallel embedding dtable", rtol=1e-12)

logits, targets = rand((B_, S_, V), 12) * 3, np.random.default_rng(13).integers(0, V, (B_, S_))
loss_ser, s_ce = cross_entropy_forward(logits, targets)
loss, s_vp = vocab_parallel_cross_entropy_forward(comm, split_columns(logits, N, R), targets)
c.close(loss, loss_ser, "vocab-parallel cross-entropy", tol=1e-13, rtol=1e-13)
c.close(vocab_parallel_cross_entropy_backward(s_vp, 0.5),
        split_columns(cross_entropy_backward(s_ce, 0.5), N, R), "vocab-parallel CE grad",
        rtol=1e-12)

# -- 2 and 3. the GPT, counted ------------------------------------------------------------
H = 3 if N == 3 else 4
L, BATCH, SEQ = 2, 3, 4 * N


def gpt_parity(cfg: GPTConfig, sp: bool, what: str) -> None:
    full = GPT(cfg).init(1)
    tok, tgt = synthetic.modular_sum(3, 0, BATCH, SEQ, cfg.vocab_size)
    loss_ser, g_ser = GPT(cfg).loss_and_grads(full, tok, tgt)
    logits_ser, _ = GPT(cfg).forward(full, tok)
    tp = TensorParallelGPT(cfg, comm, sp)
    shard = tp.shard(full)
    c.close(gather_last(tp.forward(shard, tok)), logits_ser, f"{what}: logits", rtol=1e-12)
    comm.stats.reset()
    loss, g = tp.loss_and_grads(shard, tok, tgt)
    c.close(loss, loss_ser, f"{what}: loss", tol=1e-13, rtol=1e-13)
    g_full = gather_params(comm, g, cfg)
    for k in g_ser:
        c.close(g_full[k], g_ser[k], f"{what}: grad {k}", rtol=1e-12)
    ops, S = comm.stats.ops, BATCH * SEQ * cfg.d_model
    ring = allreduce_bytes_sent(S, 8, N, R, "ring")
    if not sp and not cfg.n_experts:
        for op in ("tp_f", "tp_g"):
            c.check(ops[op].calls == 2 * L,
                    f"{what}: {op} ran {ops[op].calls} times, not 2 per block")
            c.check(ops[op].bytes_sent == 2 * L * ring, f"{what}: {op} sent {ops[op].bytes_sent} "
                    f"bytes, ring formula {2 * L * ring}")
    if sp:
        for op in ("sp_f", "sp_g"):  # all-gather forward + reduce-scatter backward, and back
            c.check(ops[op].calls == 4 * L, f"{what}: {op} ran {ops[op].calls} times")
        c.check(ops["sp_f"].bytes_sent + ops["sp_g"].bytes_sent == 4 * L * ring,
                f"{what}: SP's pairs sent {ops['sp_f'].bytes_sent + ops['sp_g'].bytes_sent}, "
                f"TP's ring figure is {4 * L * ring}")


dense = GPTConfig(vocab_size=4 * N, block_size=SEQ, n_layer=L, n_head=H, d_model=2 * H * N)
gpt_parity(dense, False, f"TP t={N}")
# forward alone: the 2 g's per block; backward alone: the 2 f's
tp_model = TensorParallelGPT(dense, comm)
shard = tp_model.shard(GPT(dense).init(0))
tok, tgt = synthetic.modular_sum(0, 0, BATCH, SEQ, dense.vocab_size)
comm.stats.reset()
tp_model.forward(shard, tok)
c.check(comm.stats.ops["tp_g"].calls == 2 * L and comm.stats.ops["tp_f"].calls == 0,
        "forward: 2 g all-reduces per block, no f")
if N in (2, 4):
    gpt_parity(dense, True, f"TP+SP t={N}")
moe = GPTConfig(vocab_size=4 * N, block_size=SEQ, n_layer=L, n_head=H, d_model=2 * H * N,
                n_experts=4, top_k=2, moe_every=2)
gpt_parity(moe, False, f"MoE under TP t={N}")
# grouped-query attention: K/t key/value heads per rank (t | K), or each replicated (K < t)
for kv in sorted({1, N} - {H}):
    if H % kv == 0 and (kv % N == 0 or N % kv == 0):
        gpt_parity(GPTConfig(**{**dense.__dict__, "n_kv_head": kv}), False,
                   f"GQA K={kv} under TP t={N}")

# -- 4. training: the shared verdict ----------------------------------------------------------
SPEC = RunSpec(vocab=4 * N, seq=2 * N, d_model=2 * H * N, layers=2, heads=H, batch=4, steps=4)


def train(spec: RunSpec, dp: int, sp: bool, what: str, overlap: bool = False) -> None:
    comm.stats.reset()
    grid = Grid(comm, dp=dp, tp=N // dp)
    run = TensorParallel(grid, spec, sp, overlap=overlap)
    losses = loop.train(run, spec.batch_at, spec.steps).losses
    tp_sent = grid.bytes_by_axis()["tp"]  # the training's, before full_params' all-gather
    by_op = bytes_by_op(grid.world.stats, run.steps_done)
    full = run.full_params()
    flat = FlatParams.like(full).flatten(full)
    ser = serial_reference(spec, dp)
    init = spec.initial_params()
    v = compare(losses, ser["losses"], flat, ser["params"], FlatParams.like(init).flatten(init))
    c.check(v.status == "equal", f"{what}: {v.line()}")
    blocks = sum(by_op.get(op, 0) for op in BLOCK_OPS)
    sizes = (run.cfg, run.rows(), spec.seq, run.tp.size, run.tp.rank, run.states.params.itemsize)
    exact = block_bytes_formula(*sizes)
    c.check(blocks == exact, f"{what}: blocks' f and g sent {blocks} bytes "
            f"per step, exact formula {exact}")
    if not sp and N // dp > 1:  # the whole tp axis: blocks, embedding, head, the loss
        tp_axis = tp_sent / run.steps_done
        exact = tp_axis_bytes_formula(*sizes)
        c.check(tp_axis == exact, f"{what}: tp axis sent {tp_axis} bytes "
                f"per step, exact formula {exact}")
    grid.free()


train(SPEC, 1, False, f"train TP t={N}")
if N in (2, 4):
    train(SPEC, 1, True, f"train TP+SP t={N}")
if N == 4:
    train(SPEC, 2, False, "train TP 2 x DP 2")
train(SPEC.with_(experts=4, top_k=2), 1, False, f"train MoE under TP t={N}")
# --tp-overlap: f's backward all-reduce behind dW, SP's all-gather and reduce-scatter
# decomposed into the GEMMs: the same verdict and the same bytes as the blocking form
train(SPEC, 1, False, f"train TP t={N} overlapped", overlap=True)
if N in (2, 4):
    train(SPEC, 1, True, f"train TP+SP t={N} overlapped", overlap=True)
if N == 4:
    train(SPEC, 2, True, "train TP+SP 2 x DP 2 overlapped", overlap=True)
train(SPEC.with_(kv_heads=1), 1, False, f"train multi-query (K=1) under TP t={N}")

# -- 5. bad input ----------------------------------------------------------------------------
if N > 1:
    BAD = [("heads", GPTConfig(vocab_size=4 * N, n_head=N + 1, d_model=2 * (N + 1) * N), False, 8),
           ("d_ff", GPTConfig(vocab_size=4 * N, n_head=N, d_model=2 * N, d_ff=4 * N + 1), False, 8),
           ("vocab", GPTConfig(vocab_size=4 * N + 1, n_head=N, d_model=2 * N), False, 8),
           ("sequence", GPTConfig(vocab_size=4 * N, n_head=N, d_model=2 * N), True, 2 * N + 1)]
    for what, cfg, sp, seq in BAD:
        comm.stats.reset()
        try:
            m = TensorParallelGPT(cfg, comm, sp)
            tok = np.zeros((1, seq), np.int64)
            m.loss_and_grads(m.shard(GPT(cfg).init(0)), tok, tok)
            c.check(False, f"bad {what} accepted")
        except ValueError as e:
            c.check(comm.stats.bytes_sent() == 0, f"bad {what}: messages before the error")
            c.check(len(str(e).splitlines()) == 1 and what in str(e), f"bad {what}: {e}")

c.summary()
