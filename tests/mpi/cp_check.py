"""All checks of context parallelism for one world size, in one launch.

Run by tests/test_context_parallel.py as ``launch.run(N, this file)``; rank 0
prints ``CP-SUMMARY N=<N> checks=<k> failures=<f>`` and the first failures; the
job exits 1 if any check failed.  For Ulysses, ring attention (contiguous), ring
attention (zigzag) and all-gather (Llama 3, zigzag), with multi-head attention and with
grouped-query attention (fewer key/value heads: only they travel), float64:

1. the attention layer alone (ring / Ulysses forward and backward on random
   q, k, v) against the serial core on the full sequence;
2. the CP GPT: local logits = the serial logits at my positions, loss and every
   gradient = the serial ones (tight assert_allclose); what the units saved
   shares no memory with a parameter (activations only);
3. several AdamW steps: the shared verdict (:func:`minipar.parallel.parity.compare`)
   says "equal";
4. bytes per operation per step, counted = the exact formula; one layer's
   forward = the paper's figure (ring) or 4Nh/P·(P−1)/P (Ulysses);
5. attention activation bytes per layer (ledger) = the formula; Ulysses = the
   serial layer's / P, ring below the serial layer's; tracemalloc's count of
   what one core forward keeps alive (:func:`attention_activation_tracemalloc`):
   at least the ledger, and within 2% of it on a layer whose share is ~0.1-1 MB
   (b 2, s 256, d 64, H 4); at the run's tiny sizes within ``SLACK`` bytes;
6. causal work per rank: zigzag equal on every rank, contiguous (r+1)(s/P)²;
7. bad input: a ValueError on every rank, not one byte sent;
8. the engine's state: whole tensors under the serial names, replica = the cp rank;
   loaded into the serial engine (another layout) it gives the same parameters, to
   the bit, and the same next step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.nn import GPT
from minipar.nn.attention import attention_core_backward, attention_core_forward, merge_heads
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.context_parallel import ulysses
from minipar.parallel.context_parallel.engine import ContextParallel
from minipar.parallel.context_parallel.layout import Sharding
from minipar.parallel.context_parallel.measure import (
    attention_activation_formula,
    attention_activation_tracemalloc,
    measure,
    ring_forward_bytes,
    score_elements,
    serial_attention_activation,
)
from minipar.parallel.context_parallel.ring_attention import (
    ring_attention_backward,
    ring_attention_forward,
)
from minipar.parallel.engine import build as serial_build
from minipar.parallel.parity import compare
from minipar.plan.activations import (
    ring_attention_bytes_per_rank,
    ulysses_alltoall_elements_per_link,
)

comm = TracedComm(MPI.COMM_WORLD)
N, R = comm.size, comm.rank
c = Checks("CP")
grid = Grid(comm, cp=N)  # the engines of 2. and 7.; measure() makes its own


def _arrays(tree: object) -> list[np.ndarray]:
    """Every array in a nested tuple / list / dict (what the units saved)."""
    if isinstance(tree, np.ndarray):
        return [tree]
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(
        tree, (list, tuple)) else []
    return [a for t in items for a in _arrays(t)]


#: (kind, zigzag, key/value heads: 0 = all 4 heads; 1 multi-query, 2 grouped; USP's ulysses)
CONFIGS = [("ulysses", False, 0, 0), ("ring", False, 0, 0), ("ring", True, 0, 0),
           ("allgather", True, 0, 0), ("ring", True, 1, 0), ("ulysses", False, 1, 0),
           ("allgather", True, 2, 0)]
if N >= 2:  # USP: U = 2 Ulysses ranks x R = N/2 ring groups (K = 1: copied to both)
    CONFIGS += [("usp", True, 0, 2)] + ([("usp", True, 1, 2)] if N == 4 else [])
BIG = (2, 256, 64, 4)  # b, s, d, H of the layer whose tracemalloc must be within 2% of the ledger
# tracemalloc also sees the Python objects around the saved arrays (the saved tuple, the
# ndarray headers with their shape and strides, the traced communicator's counters):
# 1.2-2 KB measured at every b, s, d tried, on 1, 2 and 4 ranks; 2% of the run's tiny layer
# is ~100 bytes, so there the bound is absolute
SLACK = 4096
spec = RunSpec(vocab=10, seq=16, d_model=16, layers=2, heads=4, batch=3, steps=4, lr=1e-2)
model = GPT(spec.config())
params = spec.initial_params()
tokens, targets = spec.global_batch(0)
serial_logits, _ = model.forward(params, tokens)
serial_loss, serial_grads = model.loss_and_grads(params, tokens, targets)
serial = serial_reference(spec)
initial = FlatParams.like(params).flatten(params)
serial_act = serial_attention_activation(spec, tokens)

# 1. the attention layer alone, random float64 q, k, v of the full sequence
rng = np.random.default_rng(7)
b, H, s, dh = 2, 4, 16, 3
q, k, v, do = (rng.standard_normal((b, H, s, dh)) for _ in range(4))
o_ref, saved_ref = attention_core_forward(q, k, v)
dq_ref, dk_ref, dv_ref = attention_core_backward(saved_ref, do)
for zz in (False, True):
    lay = Sharding(s, N, zz)
    pos = lay.positions(R)
    o, saved = ring_attention_forward(comm, q[:, :, pos], k[:, :, pos], v[:, :, pos], lay)
    c.close(o, o_ref[:, :, pos], f"ring(zigzag={zz}) output", tol=1e-14, rtol=1e-11)
    grads = ring_attention_backward(comm, saved, do[:, :, pos])
    for name, g, ref in zip("qkv", grads, (dq_ref, dk_ref, dv_ref)):
        c.close(g, ref[:, :, pos], f"ring(zigzag={zz}) d{name}", tol=1e-14, rtol=1e-11)
lo, hi = R * s // N, (R + 1) * s // N
qkv = np.concatenate([merge_heads(a) for a in (q, k, v)], axis=-1)  # (b, s, 3d)
o, saved = ulysses.ulysses_attention_forward(comm, qkv[:, lo:hi], H)
c.close(o, merge_heads(o_ref)[:, lo:hi], "Ulysses output", tol=1e-14, rtol=1e-11)
dqkv = ulysses.ulysses_attention_backward(comm, saved, merge_heads(do)[:, lo:hi])
ref = np.concatenate([merge_heads(a) for a in (dq_ref, dk_ref, dv_ref)], axis=-1)
c.close(dqkv, ref[:, lo:hi], "Ulysses d(qkv)", tol=1e-14, rtol=1e-11)

REFS: dict[int, tuple] = {}


def refs(kv: int) -> tuple:
    """The serial run of the model with ``kv`` key/value heads: logits, loss, grads, the
    training reference, its activations (computed once per kv)."""
    if kv not in REFS:
        sp = spec.with_(kv_heads=kv)
        m, p = GPT(sp.config()), sp.initial_params()
        REFS[kv] = (sp, p, m.forward(p, tokens)[0], *m.loss_and_grads(p, tokens, targets),
                    serial_reference(sp), serial_attention_activation(sp, tokens))
    return REFS[kv]


REFS[0] = (spec, params, serial_logits, serial_loss, serial_grads, serial, serial_act)
for kind, zz, kv, U in CONFIGS:
    name = (f"{kind}{' zigzag' if zz else ''}{f' K={kv}' if kv else ''}"
            f"{f' U={U} R={N // U}' if U else ''}")
    run, params, serial_logits, serial_loss, serial_grads, serial, serial_act = refs(kv)
    initial = FlatParams.like(params).flatten(params)
    K, dkv = kv or run.heads, (kv or run.heads) * run.d_model // run.heads
    # 2. one forward/backward of the CP GPT against the serial GPT
    cp = ContextParallel(grid, run, kind, zz, U or None)
    logits, kept = cp.forward(params, tokens)
    c.close(logits, serial_logits[:, cp.positions], f"{name}: logits at my positions",
            tol=1e-14, rtol=1e-11)
    shared = [n for a in _arrays(kept) for n, w in params.items() if np.shares_memory(a, w)]
    c.check(not shared, f"{name}: saved activations share memory with parameters {shared}")
    del kept
    loss, grads = cp.loss_and_grads(params, tokens, targets)
    c.check(abs(loss - serial_loss) <= 1e-13 * abs(serial_loss),
            f"{name}: loss {loss!r} vs serial {serial_loss!r}")
    for p in params:
        c.close(grads[p], serial_grads[p], f"{name}: grad {p}", rtol=1e-9,
                tol=1e-13 * float(np.abs(serial_grads[p]).max()))
    cp.close()
    # 3.-6. training, counted bytes, activation ledger, work
    m = measure(comm, run, kind, zz, U or None)
    v = compare(m["losses"], serial["losses"], m["params"], serial["params"], initial)
    c.check(v.status == "equal", f"{name}: verdict {v.status}: {v.line}")
    for op, want in m["bytes_by_op_formula"].items():
        c.check(m["bytes_by_op"][op] == want,
                f"{name}: {op} sent {m['bytes_by_op'][op]} per step, formula {want}")
    total = sum(m["bytes_by_op_formula"].values())
    c.check(m["bytes_by_axis"] == ({"cp": total} if total else {}),
            f"{name}: bytes by axis {m['bytes_by_axis']}")
    fwd = m["attention_forward_bytes_per_layer"]
    if kind == "ring":
        want = ring_forward_bytes(spec.batch, s, spec.d_model, N, 8, dkv)
        plan = want if kv else ring_attention_bytes_per_rank(s, spec.batch, spec.d_model, N, 8)
        c.check(fwd == want == plan, f"{name}: one layer forward sent {fwd}, formula {want}")
    elif kind == "usp":  # the group's all-to-alls + the ring's hops on H/U heads
        want = m["attention_bytes_per_layer_formula"]["forward"]
        paper = (ulysses_alltoall_elements_per_link(spec.batch * s // (N // U), spec.d_model, U)
                 * (U - 1) / U + ring_attention_bytes_per_rank(s, spec.batch,
                                                               spec.d_model // U, N // U, 1))
        c.check(fwd == want and (kv or fwd == round(paper * 8)),
                f"{name}: one layer forward sent {fwd}, formula {want}, paper {paper * 8}")
    elif kind == "allgather":  # (P−1)/P of the whole sequence's K and V
        want = (N - 1) * spec.batch * (s // N) * 2 * dkv * 8
        c.check(fwd == want == m["attention_bytes_per_layer_formula"]["forward"],
                f"{name}: one layer forward sent {fwd}, (P−1)·b·(s/P)·2K·d_h·8 = {want}")
    elif not kv:
        per_link = ulysses_alltoall_elements_per_link(spec.batch * s, spec.d_model, N) * 8
        c.check(fwd == round(per_link * (N - 1) / N),
                f"{name}: one layer forward sent {fwd}, "
                f"4Nh/P·(P−1)/P = {per_link * (N - 1) / N}")
    act = m["activation_per_layer"]
    f = attention_activation_formula(kind, spec.batch, s, spec.d_model, spec.heads, N, 8,
                                     n_kv_head=K, ulysses=U or 1)
    c.check(act == [f] * spec.layers, f"{name}: attention activations {act}, formula {f}")
    tm = m["activation_tracemalloc"]
    c.check(tm["ledger"] == tm["formula"] == f and f <= tm["tracemalloc"] <= f + SLACK,
            f"{name}: tracemalloc {tm}, the run's ledger {act}, formula {f}")
    big = attention_activation_tracemalloc(comm, kind, zz, *BIG, n_kv_head=K, ulysses=U or None)
    fb = attention_activation_formula(kind, *BIG, N, 8, n_kv_head=K, ulysses=U or 1)
    c.check(big["ledger"] == fb <= big["tracemalloc"] <= 1.02 * fb,
            f"{name}: tracemalloc {big['tracemalloc']} not within 2% of the ledger "
            f"{big['ledger']} (formula {fb}), b, s, d, H = {BIG}")
    if kind == "ring":  # no s² term: far below what Ulysses keeps for the same layer
        c.check(big["tracemalloc"] * 2 < attention_activation_formula("ulysses", *BIG, N, 8),
                f"{name}: tracemalloc {big['tracemalloc']} keeps an s² term")
    if kind == "ulysses" and K >= N:
        c.check(all(a * N == sa for a, sa in zip(act, serial_act)),
                f"{name}: activations {act} x {N} != serial {serial_act}")
    else:
        c.check(N == 1 or all(a < sa for a, sa in zip(act, serial_act)),
                f"{name}: activations {act} not below the serial {serial_act}")
    work = comm.comm.allgather(m["score_elements"])
    if kind == "usp":  # the ring's zigzag over R groups, H/U heads: equal on every rank
        chunk = s // (2 * (N // U))
        c.check(work == [(2 * (N // U) + 1) * chunk * chunk * spec.heads // U] * N,
                f"{name}: USP work {work}")
    elif kind != "ulysses" and zz:  # ring and all-gather alike: (2P+1)·c² per head
        chunk = s // (2 * N)
        c.check(work == [(2 * N + 1) * chunk * chunk * spec.heads] * N,
                f"{name}: zigzag work {work}")
    elif kind == "ring":
        c.check(work == [(r + 1) * (s // N) ** 2 * spec.heads for r in range(N)],
                f"{name}: contiguous work {work}")
        c.check(score_elements(Sharding(s, N, False), R) * spec.heads == work[R], "score_elements")

# 7. bad input: a ValueError on every rank before any message
before = comm.stats.bytes_sent()
for kind, zz, bad, word in [("ring", True, spec.with_(seq=2 * N + 2), "2·cp"),
                            ("ring", False, spec.with_(seq=N + 1), f"cp = {N}"),
                            ("ulysses", False, spec.with_(heads=N + 1, d_model=16 * (N + 1)),
                             "--heads"),
                            ("ulysses", True, spec, "--no-zigzag")]:
    if N == 1 and word != "--no-zigzag":
        continue
    try:
        ContextParallel(grid, bad, kind, zz)
        c.check(False, f"{kind} zigzag={zz}: no error for seq {bad.seq}, heads {bad.heads}")
    except ValueError as e:
        c.check(word in str(e), f"{kind}: {e}")
for U, rr, word in [(N + 1, 1, "must equal cp"), (8, N // 8 or 1, "--ulysses 8")]:
    try:  # U·R ≠ cp; more Ulysses ranks than the 4 heads
        ContextParallel(grid, spec, "usp", True, U, rr)
        c.check(N == 8 and U == 8, f"usp --ulysses {U} --ring {rr}: no error")
    except ValueError as e:
        c.check(word in str(e) or (U == 8 and N != 8), f"usp: {e}")
c.check(comm.stats.bytes_sent() == before, "bytes were sent before a bad configuration was refused")

# 8. the state: whole tensors, serial names, replica = cp rank; any layout resumes it
spec, model, params = REFS[0][0], GPT(spec.config()), REFS[0][1]
for kind, zz, _, _ in CONFIGS[:4]:
    name = f"{kind}{' zigzag' if zz else ''}"
    cp = ContextParallel(grid, spec, kind, zz)
    cp.step(spec.batch_at(0))
    st = cp.state_dict()
    names = list(model.param_shapes())
    c.check([n for (k, n) in st.arrays if k == "param"] == names, f"{name}: state names")
    cover = {key: sum(int(np.prod([x.stop - x.start for x in pc.global_])) for pc in sh.pieces)
             for key, (sh, _) in st.arrays.items()}  # elements of the global tensor held
    c.check(all(sh.replica == R and a.size == cover[key] == int(np.prod(sh.global_shape))
                and (key[0] != "param" or a.shape == sh.global_shape)
                for key, (sh, a) in st.arrays.items()), f"{name}: not whole tensors of replica {R}")
    c.check(st.scalars["step"] == 1 and st.scalars["optimizer.t"] == 1, f"{name}: {st.scalars}")
    ser = serial_build(spec)
    ser.load_state_dict(st)
    same = all(np.array_equal(a, b) for a, b in zip(ser.full_params().values(),
                                                    cp.full_params().values()))
    c.check(same and list(ser.full_params()) == names, f"{name}: serial engine loaded differs")
    a, b = cp.step(spec.batch_at(1)).loss, ser.step(spec.batch_at(1)).loss
    c.check(abs(a - b) <= 1e-13 * abs(b), f"{name}: next loss {a!r} vs serial loaded {b!r}")
    cp.close()
grid.free()

c.summary()
