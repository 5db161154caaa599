"""B and W (Qi et al. 2023, arXiv 2401.10241): every unit's backward split in two.

Serial computation reproduced: each unit's ``backward`` (itself checked against
finite differences in tests/test_nn_gpt.py), bit for bit in float64, as its B
(``backward_input``: dx and what W needs) followed by its W (``backward_weight``:
the parameter gradients) — for the GPT's embedding, dense and MoE blocks and head,
and the MLP classifier's layers; the executor's B and W walks give the model's
``loss_and_grads``; B really defers the weight-gradient products (they are not
computed until W) and keeps only the linears' inputs and output gradients.
(The tensor-, context- and expert-parallel units: tests/mpi/zb_check.py.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from minipar.nn import GPT, MLP, GPTConfig, Hooks, MLPConfig, executor, weight_grad
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward

TINY = {"vocab_size": 9, "block_size": 6, "n_layer": 3, "n_head": 2, "d_model": 8}
CONFIGS = {"dense": GPTConfig(**TINY),
           "moe": GPTConfig(**TINY, n_experts=4, top_k=2, capacity_factor=1.0, moe_every=2)}


def setup(kind: str) -> tuple[Any, dict, Any, Any]:
    r = np.random.default_rng(0)
    if kind == "mlp":
        model: Any = MLP(MLPConfig(sizes=(3, 7, 5, 4)))
        x, y = r.standard_normal((9, 3)), r.integers(0, 4, 9)
    else:
        model = GPT(CONFIGS[kind])
        x = r.integers(0, 9, (3, 6))
        y = np.roll(x, -1, axis=1)
    p = {k: v + 0.1 * r.standard_normal(v.shape) for k, v in model.init(1).items()}
    return model, p, x, y


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", ["dense", "moe", "mlp"])
def test_each_unit_b_then_w_is_its_backward_to_the_bit(kind: str) -> None:
    model, p, x, y = setup(kind)
    units = model.units()
    out, kept = executor.forward(units, Hooks(p), x)
    if kind == "mlp":
        dy = np.random.default_rng(1).standard_normal(out.shape)
    else:
        dy = cross_entropy_backward(cross_entropy_forward(out, y)[1], 0.7)
    for u, saved in reversed(list(zip(units, kept))):
        q = u.params(p)
        dx, grads = u.backward(q, saved, dy, 0.7)
        bx, pending = u.backward_input(q, saved, dy, 0.7)
        gw = u.backward_weight(pending)
        assert _same(dx, bx), u.name
        assert list(gw) == list(grads), u.name
        assert all(_same(gw[k], grads[k]) for k in grads), u.name
        dy = dx if dx is not None else dy


@pytest.mark.parametrize("kind", ["dense", "moe", "mlp"])
def test_the_executors_b_and_w_walks_are_loss_and_grads(kind: str) -> None:
    """forward, loss, B over every unit, then W (W later, in any order of units): the
    model's own gradients, to the bit."""
    model, p, x, y = setup(kind)
    _, want = model.loss_and_grads(p, x, y, loss_scale=0.5)
    hooks = Hooks(p)
    logits, kept = executor.forward(model.units(), hooks, x)
    dl = cross_entropy_backward(cross_entropy_forward(logits, y)[1], 0.5)
    _, pending = executor.backward_input(model.units(), hooks, kept, dl, 0.5)
    assert kept == [] and not hooks.grads  # B gave no gradient yet
    executor.backward_weight(model.units(), hooks, pending)
    assert all(_same(hooks.grads[k], want[k]) for k in want)


def test_b_defers_the_weight_products_and_keeps_only_their_operands() -> None:
    """A dense block's B: the biases' and LayerNorms' gradients made, the four weight
    matrices' deferred; what W keeps is the four linears' inputs and output gradients."""
    model, p, x, _ = setup("dense")
    units = model.units()
    _, kept = executor.forward(units, Hooks(p), x)
    blk = units[1]
    b, t = x.shape
    d, f = CONFIGS["dense"].d_model, CONFIGS["dense"].d_ff
    dy = np.ones((b, t, d))
    _, pending = blk.backward_input(blk.params(p), kept[1], dy)
    deferred = sorted(k for k, v in pending.items() if isinstance(v, weight_grad.Deferred))
    assert deferred == ["attn.w_out", "attn.w_qkv", "mlp.w_in", "mlp.w_out"]
    # inputs (b,t,d) x3 + (b,t,f); output gradients (b,t,3d) + (b,t,d) x2 + (b,t,f)
    want = 8 * b * t * (d + d + d + f + 3 * d + d + d + f)
    assert weight_grad.kept_bytes(pending) == want
    emb = units[0]  # token ids in: its B does nothing, its W everything
    dx, pe = emb.backward_input(emb.params(p), kept[0], dy)
    assert dx is None and isinstance(pe, weight_grad.Deferred)
    assert not weight_grad.deferring()


def test_deferred_sums_keep_their_order() -> None:
    a, b = (np.random.default_rng(i).standard_normal(5) for i in (1, 2))
    with weight_grad.deferred():
        da = weight_grad.weight_grad(np.copy, a)
        s = da + weight_grad.weight_grad(np.copy, b)
    assert isinstance(s, weight_grad.Deferred) and _same(s.value(), a + b)
    assert weight_grad.weight_grad(np.copy, a) is not None  # outside B: computed now
