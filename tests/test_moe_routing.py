"""DeepSeek-V3's experts, serially: shared experts, fine-grained top-k, sigmoid routing, the
sequence-wise loss, loss-free balancing, dropless, node-limited routing (issue 34)."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.nn import GPT, GPTConfig, moe_backward, moe_forward
from minipar.nn.gradcheck import numerical_grad, rel_error
from minipar.nn.moe_routing import group_mask, update_bias
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.engine import build as serial_build


def params(d: int, w: int, e: int, shared: int = 0, seed: int = 0, scale: float = 2.0) -> dict:
    r = np.random.default_rng(seed)
    p = {"router": scale * r.standard_normal((d, e))}
    for kind, n in (("experts", e), ("shared", shared)):
        for j in range(n):
            p.update({f"{kind}.{j}.w_in": r.standard_normal((d, w)),
                      f"{kind}.{j}.b_in": r.standard_normal(w),
                      f"{kind}.{j}.w_out": r.standard_normal((w, d)),
                      f"{kind}.{j}.b_out": r.standard_normal(d)})
    return p


#: (top_k, capacity_factor, aux, options): each new option, and all of them at once
CASES = {
    "shared": (2, 1.0, 0.1, {"n_shared": 2}),
    "fine-grained-top3": (3, 1.0, 0.1, {}),
    "sigmoid": (2, 1.0, 0.1, {"scoring": "sigmoid"}),
    "seq-aux": (2, 1.0, 0.0, {"scoring": "sigmoid", "seq_aux_loss_coef": 0.3}),
    "dropless": (2, None, 0.1, {}),
    "node-limited": (2, 1.0, 0.1, {"groups": (3, 2)}),
    "all": (4, None, 0.0, {"n_shared": 1, "scoring": "sigmoid", "groups": (3, 2),
                           "seq_aux_loss_coef": 0.2}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_option_matches_finite_differences(case: str) -> None:
    k, cf, aux, opt = CASES[case]
    d, w, e = 4, 3, 6
    p = params(d, w, e, opt.get("n_shared", 0), seed=1)
    p["expert_bias"] = np.array([0.3, -0.2, 0.0, 0.1, -0.1, 0.25])  # selection only
    x = np.random.default_rng(2).standard_normal((2, 5, d))
    y, s = moe_forward(p, x, e, k, cf, aux, **opt)
    key = np.where(s["scores"] > -1, s["scores"] + p["expert_bias"], 0)
    gap = np.sort(key, axis=1)[:, ::-1]
    assert (gap[:, k - 1] - gap[:, k]).min() > 1e-4  # no near-tie of the selection
    if cf is None:
        assert s["dropped"] == 0 and s["capacity"] == int(s["loads"].max())
    r = np.random.default_rng(3).standard_normal(y.shape)

    def loss() -> float:
        yy, ss = moe_forward(p, x, e, k, cf, aux, **opt)
        return float((yy * r).sum()) + ss["aux_loss"]

    dx, g = moe_backward(p, s, r, daux=1.0)
    assert "expert_bias" not in g and set(g) == set(p) - {"expert_bias"}
    assert rel_error(dx, numerical_grad(loss, x)) < 1e-6
    for name, v in g.items():
        assert rel_error(v, numerical_grad(loss, p[name])) < 1e-6, name


def test_sigmoid_gates_are_the_chosen_scores_normalised_without_the_bias() -> None:
    d, e = 4, 4
    p = params(d, 3, e, seed=4)
    x = np.random.default_rng(5).standard_normal((1, 6, d))
    p["expert_bias"] = np.array([10.0, 0.0, 0.0, 10.0])  # forces experts 0 and 3
    _, s = moe_forward(p, x, e, 2, 2.0, 0.0, scoring="sigmoid")
    sig = 1 / (1 + np.exp(-(x.reshape(-1, d) @ p["router"])))
    np.testing.assert_array_equal(np.sort(s["expert_index"], axis=1), [[0, 3]] * 6)
    chosen = np.take_along_axis(sig, s["expert_index"], axis=1)
    want = chosen / chosen.sum(1, keepdims=True)
    np.testing.assert_allclose(s["gates"], want, rtol=1e-14)


def test_node_limited_groups_by_the_papers_rule() -> None:
    # 2 groups of 3; top-2 over M = 1 group: a group's score = its best K_r/M = 2 scores
    s = np.array([[0.9, 0.1, 0.1, 0.6, 0.6, 0.0]])  # group 0: 1.0, group 1: 1.2
    np.testing.assert_array_equal(group_mask(s, 2, 2, 1), [[False] * 3 + [True] * 3])
    assert group_mask(s, 2, 2, 2) is None


def test_loss_free_update_rule() -> None:
    b = update_bias(np.zeros(4), np.array([5, 3, 3, 1]), 0.1)  # mean 3: sign(0) = 0
    np.testing.assert_array_equal(b, [-0.1, 0.0, 0.0, 0.1])


def moe_spec(**kw) -> RunSpec:
    base = dict(vocab=12, seq=6, d_model=8, layers=2, heads=2, batch=6, steps=3, experts=4,
                top_k=2)
    return RunSpec(**{**base, **kw})


def test_loss_free_bias_is_state_counted_once_per_step_and_resumes() -> None:
    spec = moe_spec(load_balance="loss-free", bias_update_rate=0.05, router="sigmoid",
                    shared_experts=1, expert_width=12, capacity_factor=None, routing=(2, 3))
    eng = serial_build(spec)
    assert not any("expert_bias" in n for n in eng.states.layout.names)  # not a parameter
    batches = [spec.batch_at(s) for s in range(3)]
    eng.step(batches[0])
    loads = eng.bias.loads[-1]["blocks.0."]
    assert sum(loads) == spec.batch * spec.seq * spec.top_k  # the step's global batch, once
    b = eng.state_dict().arrays[("buffer", "blocks.0.moe.expert_bias")][1]
    mean = sum(loads) / 4
    np.testing.assert_allclose(b, [0.05 * np.sign(mean - v) for v in loads], atol=0)
    saved = eng.state_dict()
    saved = type(saved)({k: (s, a.copy()) for k, (s, a) in saved.arrays.items()},
                        dict(saved.scalars))
    eng.step(batches[1])
    eng.step(batches[2])
    other = serial_build(spec)
    other.load_state_dict(saved)
    other.step(batches[1])
    other.step(batches[2])
    for n, v in eng.full_params().items():
        np.testing.assert_array_equal(other.full_params()[n], v)
    np.testing.assert_array_equal(other.bias.arrays["blocks.1.moe.expert_bias"],
                                  eng.bias.arrays["blocks.1.moe.expert_bias"])


def test_the_gpt_names_shared_experts_after_the_routed_ones() -> None:
    cfg = GPTConfig(n_experts=2, top_k=2, shared_experts=2, expert_width=5, n_layer=1)
    names = [n for n in GPT(cfg).param_shapes() if ".moe." in n]
    assert names[0] == "blocks.0.moe.router" and names[-4:] == [
        f"blocks.0.moe.shared.1.{k}" for k in ("w_in", "b_in", "w_out", "b_out")]
    assert GPT(cfg).param_shapes()["blocks.0.moe.shared.0.w_in"] == (32, 5)


@pytest.mark.parametrize("kw,match", [
    ({"router": "sigmoid", "top_k": 1}, "--router sigmoid needs --top-k >= 2"),
    ({"load_balance": "loss-free", "bias_update_rate": 0.0}, "--bias-update-rate must be > 0"),
    ({"expert_groups": 3}, "--expert-groups 3 does not divide --experts 4"),
    ({"expert_groups": 2, "groups_per_token": 3}, "--groups-per-token must be"),
    ({"top_k": 5}, "--top-k 5 exceeds --experts 4"),
    ({"top_k": 3, "expert_groups": 4, "groups_per_token": 2}, "exceeds the 2 experts of"),
    ({"load_balance": "loss", "top_k": 1}, "--load-balance must be one of"),
])
def test_bad_routing_options_are_one_line(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        moe_spec(**kw)


def test_dropless_drops_nothing_and_serial_reference_runs() -> None:
    spec = moe_spec(capacity_factor=None, top_k=3, expert_groups=2, groups_per_token=2)
    ref = serial_reference(spec, 2)
    assert np.isfinite(ref["losses"]).all()


def test_loss_free_is_refused_where_the_bias_is_not_kept(tmp_path) -> None:
    from conftest import refused_before_mpi

    line = refused_before_mpi(["run", "dp", "-n", "2", "--experts", "4", "--top-k", "2",
                               "--load-balance", "loss-free"], tmp_path).stderr.strip()
    assert line.startswith("minipar run: --load-balance loss-free: minipar run dp does not "
                           "keep the expert bias"), line


def test_a_loss_free_checkpoint_file_resumes_with_its_bias(tmp_path) -> None:
    """Saved to disk (kind "buffer"), loaded by another routing layout's serial engine: the
    bias comes back and the resumed run equals the uninterrupted one (dropless: the routing
    of a token does not depend on its group)."""
    from mpi4py import MPI

    from minipar.comm import TracedComm
    from minipar.parallel import checkpoint

    spec = moe_spec(load_balance="loss-free", bias_update_rate=0.05, router="sigmoid",
                    capacity_factor=None, routing=(2,))
    a = serial_build(spec)
    for k in range(3):
        a.step(spec.batch_at(k))
    d = checkpoint.save(a, tmp_path, TracedComm(MPI.COMM_SELF), spec=spec)
    _, _, whole = checkpoint.full_tensors(d)  # what sample and export read: the bias too
    for name, bias in a.bias.arrays.items():
        np.testing.assert_array_equal(whole[name], bias)
    b = serial_build(spec.with_(routing=(3,)))
    checkpoint.load(b, d, spec=spec.with_(routing=(3,)))
    for name, bias in a.bias.arrays.items():
        np.testing.assert_array_equal(b.bias.arrays[name], bias)
    assert max(np.abs(v).max() for v in a.bias.arrays.values()) > 0
    la, lb = a.step(spec.batch_at(3)).loss, b.step(spec.batch_at(3)).loss
    assert abs(la - lb) <= 1e-12 * abs(la)
    for name, bias in a.bias.arrays.items():
        np.testing.assert_array_equal(b.bias.arrays[name], bias)
