"""The MoE block as dispatch → experts → combine equals the one-piece block bit for bit.

The serial block before the split (copied below as the reference) is the oracle:
np.array_equal on the output, the aux loss, dx and every gradient, in float64 and
bfloat16, top-1 and top-2, with dropped tokens and without; then through a whole
MoE GPT.  Each of the three steps is also checked alone by finite differences
(float64, at points away from routing ties), and the example drawn in
``minipar/nn/moe.py`` (E = 4, C = 3, token 5 dropped) is checked as drawn.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import minipar.nn.gpt as gpt_module
from minipar.backend import xp
from minipar.nn import GPT, GPTConfig
from minipar.nn.dtypes import down, up
from minipar.nn.gradcheck import numerical_grad, rel_error
from minipar.nn.mlp import mlp_backward, mlp_forward
from minipar.nn.moe import expert_capacity, expert_params, moe_backward, moe_forward
from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    experts_backward,
    experts_forward,
)

# ---------------------------------------------------------------- the reference
# minipar/nn/moe.py's route / moe_forward / moe_backward as they were before the
# split (commit 843f8b6), copied verbatim: the oracle the split must equal bit for bit.

def ref_route(probs: Any, top_k: int, capacity: int) -> dict[str, Any]:
    n, e = probs.shape
    order = xp.argsort(-probs, axis=1, kind="stable")[:, :top_k]  # ties -> lower index
    chosen = xp.take_along_axis(probs, order, axis=1)
    gates = chosen if top_k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
    flat = order.T.reshape(-1)  # priority: choice rank first, then token position
    onehot = (flat[:, None] == xp.arange(e)[None, :]).astype(xp.int64)
    slot = (xp.cumsum(onehot, axis=0) - 1)[xp.arange(flat.size), flat]
    slot = slot.reshape(top_k, n).T
    return {"expert_index": order, "chosen_probs": chosen, "gates": gates,
            "kept": slot < capacity, "slot": slot}


def ref_moe_forward(p, x, n_experts, top_k=1, capacity_factor=1.25, aux_loss_coef=0.01,
                    n_shared=0, scoring="softmax", groups=(1, 1), seq_aux_loss_coef=0.0):
    assert (n_shared, scoring, tuple(groups), seq_aux_loss_coef) == (0, "softmax", (1, 1), 0.0)
    dt = x.dtype
    b, t, d = x.shape
    h = x.reshape(-1, d)
    n = h.shape[0]
    logits = up(h) @ up(p["router"])  # the router runs in fp32 (or fp64)
    probs = logits - logits.max(axis=1, keepdims=True)
    xp.exp(probs, out=probs)
    probs /= probs.sum(axis=1, keepdims=True)
    cap = expert_capacity(n * top_k, n_experts, capacity_factor)  # k·N assignments
    r = ref_route(probs, top_k, cap)
    y = xp.zeros((n, d), dtype=probs.dtype)
    experts = []
    for e in range(n_experts):  # a loop over experts, never over tokens
        tok, j = xp.nonzero((r["expert_index"] == e) & r["kept"])
        pe = expert_params(p, e)
        ye, se = mlp_forward(pe, h[tok])
        y[tok] += r["gates"][tok, j][:, None] * up(ye)
        experts.append((tok, j, ye, se))
    first = (r["expert_index"][:, 0][:, None] == xp.arange(n_experts)[None, :])
    f = first.astype(probs.dtype).mean(axis=0)  # f_i: a constant (no gradient)
    aux = float(aux_loss_coef * n_experts * (f * probs.mean(axis=0)).sum())
    kept_e = xp.where(r["kept"], r["expert_index"], -1).reshape(-1)
    saved = {
        **r, "x_shape": x.shape, "dtype": dt, "h": h, "probs": probs, "f": f,
        "experts": experts, "capacity": cap, "aux_loss": aux,
        "aux_loss_coef": float(aux_loss_coef), "n_experts": n_experts,
        "routed": first.sum(axis=0),
        "tokens_per_expert": xp.bincount(kept_e[kept_e >= 0], minlength=n_experts),
        "dropped": int((~r["kept"]).sum()),
    }
    return down(y.reshape(b, t, d), dt), saved


def ref_moe_backward(p, saved, dy, daux=1.0):
    s = saved
    n, d = s["h"].shape
    e_count = s["n_experts"]
    dy2 = up(dy).reshape(n, d)
    dh = xp.zeros((n, d), dtype=dy2.dtype)
    dgates = xp.zeros(s["gates"].shape, dtype=dy2.dtype)
    grads: dict[str, Any] = {}
    for e, (tok, j, ye, se) in enumerate(s["experts"]):
        dgates[tok, j] = (dy2[tok] * up(ye)).sum(axis=1)
        dye = s["gates"][tok, j][:, None] * dy2[tok]
        dxe, ge = mlp_backward(expert_params(p, e), se, down(dye, s["dtype"]))
        dh[tok] += up(dxe)
        grads.update({f"experts.{e}.{k}": v for k, v in ge.items()})
    if dgates.shape[1] == 1:
        dchosen = dgates
    else:  # g_j = p_j / S  =>  dp_i = (dg_i − Σ_j dg_j g_j) / S
        ssum = s["chosen_probs"].sum(axis=1, keepdims=True)
        dchosen = (dgates - (dgates * s["gates"]).sum(axis=1, keepdims=True)) / ssum
    probs = s["probs"]
    dprobs = xp.zeros_like(probs)
    xp.put_along_axis(dprobs, s["expert_index"], dchosen, axis=1)
    dprobs += (float(daux) * s["aux_loss_coef"] * e_count / n) * s["f"][None, :]
    dlogits = probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
    h = up(s["h"])
    router = p["router"]
    grads = {"router": down(h.T @ dlogits, router.dtype), **grads}
    dh += dlogits @ up(router).T
    return down(dh.reshape(s["x_shape"]), s["dtype"]), grads


# ------------------------------------------------------------------------ tests
def moe_params(d: int, f: int, e: int, seed: int = 0, router_scale: float = 1.0) -> dict:
    r = np.random.default_rng(seed)
    p = {"router": router_scale * r.standard_normal((d, e))}
    for j in range(e):
        p.update({f"experts.{j}.w_in": r.standard_normal((d, f)),
                  f"experts.{j}.b_in": r.standard_normal(f),
                  f"experts.{j}.w_out": r.standard_normal((f, d)),
                  f"experts.{j}.b_out": r.standard_normal(d)})
    return p


STATS = ("capacity", "routed", "tokens_per_expert", "dropped", "aux_loss", "expert_index", "kept",
         "f", "probs")


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 8.0])  # 8.0: C ≥ N, nothing dropped
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_block_is_bit_identical_to_the_one_piece_block(
    dtype: str, top_k: int, capacity_factor: float, seed: int
) -> None:
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    d, f, e = 16, 24, 5 + seed  # E = 5, 6, 7: some buffers full, some padded
    p = {k: v.astype(dt) for k, v in moe_params(d, f, e, seed, router_scale=1.5).items()}
    r = np.random.default_rng(10 + seed)
    x = r.standard_normal((3, 7, d)).astype(dt)
    dy = r.standard_normal(x.shape).astype(dt)
    y0, s0 = ref_moe_forward(p, x, e, top_k, capacity_factor, aux_loss_coef=0.1)
    y1, s1 = moe_forward(p, x, e, top_k, capacity_factor, aux_loss_coef=0.1)
    assert (s1["dropped"] > 0) == (capacity_factor < 8.0)
    assert y1.dtype == y0.dtype == dt and np.array_equal(y1, y0)
    for k in STATS:
        assert np.array_equal(s1[k], s0[k]), k
    dx0, g0 = ref_moe_backward(p, s0, dy, daux=0.7)
    dx1, g1 = moe_backward(p, s1, dy, daux=0.7)
    assert dx1.dtype == dt and np.array_equal(dx1, dx0)
    assert list(g1) == list(g0) == list(p)
    for k in p:
        assert g1[k].dtype == g0[k].dtype and np.array_equal(g1[k], g0[k]), k


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_gpt_loss_and_gradients_are_bit_identical(
    dtype: str, top_k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, d_model=16, n_experts=4,
                    top_k=top_k, capacity_factor=1.0, dtype=dtype)
    model = GPT(cfg)
    params = {k: v.astype(cfg.dtype) for k, v in model.init(0).items()}
    r = np.random.default_rng(1)
    tokens, targets = r.integers(0, 13, (2, 8)), r.integers(0, 13, (2, 8))
    loss1, g1 = model.loss_and_grads(params, tokens, targets)
    _, cache = model.forward(params, tokens)
    assert sum(s["dropped"] for s in GPT.moe_stats(cache)) > 0
    monkeypatch.setattr(gpt_module, "moe_forward", ref_moe_forward)
    monkeypatch.setattr(gpt_module, "moe_backward", ref_moe_backward)
    loss0, g0 = model.loss_and_grads(params, tokens, targets)
    assert loss1 == loss0
    for k in params:
        assert np.array_equal(g1[k], g0[k]), k


def test_the_drawn_example_e4_c3_drops_token_5() -> None:
    d, e = 3, 4
    first = [0, 2, 0, 1, 0, 0, 3, 2]
    # h = (small features, one-hot of the wanted expert); the router reads the one-hot
    feats = 0.1 * np.random.default_rng(0).standard_normal((8, d))
    h = np.concatenate([feats, np.eye(e)[first]], axis=1)
    router = np.concatenate([np.zeros((d, e)), 10.0 * np.eye(e)])
    buffers, s = dispatch_forward(router, h, e, top_k=1, capacity_factor=1.5)
    assert s["capacity"] == 3 and buffers.shape == (4, 3, d + e)
    np.testing.assert_array_equal(s["expert_index"][:, 0], first)
    np.testing.assert_array_equal(s["kept"][:, 0], [True] * 5 + [False] + [True] * 2)
    assert s["dropped"] == 1 and s["tokens_per_expert"].tolist() == [3, 1, 2, 1]
    rows = {0: [0, 2, 4], 1: [3], 2: [1, 7], 3: [6]}
    for ex, toks in rows.items():
        assert np.array_equal(buffers[ex, :len(toks)], h[toks])
        assert not buffers[ex, len(toks):].any()  # zero rows past the expert's tokens
    p = moe_params(d + e, 5, e, seed=1)
    out, _ = experts_forward(p, buffers, s["tokens_per_expert"])
    y, _ = combine_forward(out, s)
    assert not y[5].any()  # dropped: the residual carries token 5
    for ex, toks in rows.items():
        ye, _ = mlp_forward(expert_params(p, ex), h[toks])
        np.testing.assert_allclose(y[toks], s["gates"][toks] * ye, rtol=1e-14)


def routed(top_k: int, seed: int = 4) -> tuple[dict, np.ndarray, Any, dict]:
    """A float64 layer and tokens with drops and no near-tie in the routing."""
    d, e = 4, 3
    p = moe_params(d, 5, e, seed=seed, router_scale=2.0)
    h = np.random.default_rng(seed + 1).standard_normal((8, d))
    buffers, s = dispatch_forward(p["router"], h, e, top_k, capacity_factor=1.0, aux_loss_coef=0.3)
    logp = np.sort(np.log(s["probs"]), axis=1)[:, ::-1]
    assert s["dropped"] > 0 and (logp[:, top_k - 1] - logp[:, top_k]).min() > 1e-3
    return p, h, buffers, s


@pytest.mark.parametrize("top_k", [1, 2])
def test_dispatch_gradients_match_finite_differences(top_k: int) -> None:
    p, h, buffers, s = routed(top_k)
    r = np.random.default_rng(7)
    rb, rg = r.standard_normal(buffers.shape), r.standard_normal(s["gates"].shape)

    def loss() -> float:
        b, ss = dispatch_forward(p["router"], h, 3, top_k, capacity_factor=1.0, aux_loss_coef=0.3)
        return float((b * rb).sum() + (ss["gates"] * rg).sum()) + ss["aux_loss"]

    dh, d_router = dispatch_backward(p["router"], s, rb, rg, daux=1.0)
    assert rel_error(dh, numerical_grad(loss, h)) < 1e-6
    assert rel_error(d_router, numerical_grad(loss, p["router"])) < 1e-6


def test_experts_gradients_match_finite_differences() -> None:
    p, _, buffers, s = routed(1)
    counts = s["tokens_per_expert"]
    assert counts.min() < s["capacity"]  # some padding rows
    r = np.random.default_rng(8)
    r_out = r.standard_normal(buffers.shape)

    def loss() -> float:
        return float((experts_forward(p, buffers, counts)[0] * r_out).sum())

    out, saved = experts_forward(p, buffers, counts)
    d_buffers, g = experts_backward(p, saved, r_out)
    assert list(g) == [k for k in p if k != "router"]
    pad = np.arange(s["capacity"])[None, :] >= counts[:, None]
    assert not out[pad].any() and not d_buffers[pad].any()
    assert rel_error(d_buffers, numerical_grad(loss, buffers)) < 1e-6
    for k, v in g.items():
        assert rel_error(v, numerical_grad(loss, p[k])) < 1e-6, k


def test_experts_on_a_subset_are_those_experts() -> None:
    p, _, buffers, s = routed(1)
    counts = s["tokens_per_expert"]
    out, _ = experts_forward(p, buffers, counts)
    part, saved = experts_forward(p, buffers[1:], counts[1:], experts=[1, 2])
    assert np.array_equal(part, out[1:])
    _, g = experts_backward(p, saved, np.ones_like(part))
    assert sorted(g) == sorted(k for k in p if k.startswith(("experts.1.", "experts.2.")))


@pytest.mark.parametrize("top_k", [1, 2])
def test_combine_gradients_match_finite_differences(top_k: int) -> None:
    _, _, buffers, s = routed(top_k)
    r = np.random.default_rng(9)
    out = r.standard_normal(buffers.shape)
    gates = s["gates"].copy()
    routing = {**s, "gates": gates}
    dy = r.standard_normal((8, buffers.shape[-1]))

    def loss() -> float:
        return float((combine_forward(out, routing)[0] * dy).sum())

    _, saved = combine_forward(out, routing)
    d_out, d_gates = combine_backward(saved, dy)
    assert rel_error(d_out, numerical_grad(loss, out)) < 1e-6
    assert rel_error(d_gates, numerical_grad(loss, gates)) < 1e-6
    assert not d_out[~buffers.any(axis=-1)].any()  # padding rows get no gradient
    assert not d_gates[~s["kept"]].any()  # nor do dropped choices
