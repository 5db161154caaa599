"""Mixture of experts: capacity, priority, drops, gates, aux loss (Switch eq. 4), gradients."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.nn import expert_capacity, mlp_forward, moe_backward, moe_forward, route
from minipar.nn.gradcheck import numerical_grad, rel_error
from minipar.nn.moe import expert_params


def moe_params(d: int, f: int, e: int, seed: int = 0, router_scale: float = 1.0) -> dict:
    r = np.random.default_rng(seed)
    p = {"router": router_scale * r.standard_normal((d, e))}
    for j in range(e):
        p.update({f"experts.{j}.w_in": r.standard_normal((d, f)), f"experts.{j}.b_in": r.standard_normal(f),
                  f"experts.{j}.w_out": r.standard_normal((f, d)), f"experts.{j}.b_out": r.standard_normal(d)})
    return p


def test_capacity_formula() -> None:
    assert expert_capacity(8, 4, 1.25) == 3  # ceil(2.5)
    assert expert_capacity(12, 4, 1.0) == 3
    assert expert_capacity(10, 1, 1.1) == 11  # no float round-up to 12
    assert expert_capacity(1, 8, 1.0) == 1


def test_ties_go_to_the_lower_expert_and_priority_is_by_position() -> None:
    probs = np.full((5, 4), 0.25)
    r = route(probs, top_k=2, capacity=3)
    np.testing.assert_array_equal(r["expert_index"], [[0, 1]] * 5)
    # expert 0: first choices of tokens 0, 1, 2 are kept, tokens 3, 4 dropped
    np.testing.assert_array_equal(r["kept"][:, 0], [True, True, True, False, False])
    np.testing.assert_array_equal(r["kept"][:, 1], [True, True, True, False, False])
    np.testing.assert_allclose(r["gates"], 0.5)


def test_first_choices_have_priority_over_second_choices() -> None:
    # token 0 picks (1, 0); tokens 1, 2 pick (0, 1): expert 0 takes the first
    # choices of tokens 1 and 2 before the second choice of token 0; expert 1
    # takes token 0's first choice, then token 1's second, and is then full
    probs = np.array([[0.3, 0.6, 0.1], [0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    r = route(probs, top_k=2, capacity=2)
    np.testing.assert_array_equal(r["expert_index"], [[1, 0], [0, 1], [0, 1]])
    np.testing.assert_array_equal(r["kept"], [[True, False], [True, True], [True, False]])
    np.testing.assert_allclose(r["gates"][0], [2 / 3, 1 / 3])


def test_buffer_rows_are_in_token_order_priority_decides_the_drops() -> None:
    # the same routing as above: priority is the place in the queue (first choices
    # first), the slot is the buffer row (kept tokens in token order)
    probs = np.array([[0.3, 0.6, 0.1], [0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    r = route(probs, top_k=2, capacity=2)
    np.testing.assert_array_equal(r["priority"], [[0, 2], [0, 1], [1, 2]])
    np.testing.assert_array_equal(r["slot"], [[0, -1], [0, 1], [1, -1]])
    r = route(probs, top_k=2, capacity=3)  # all kept: token 0's second choice takes row 0
    assert r["kept"].all()
    np.testing.assert_array_equal(r["slot"], [[0, 0], [1, 1], [2, 2]])
    r1 = route(probs, top_k=1, capacity=1)  # top-1: the slot is the priority
    np.testing.assert_array_equal(r1["slot"], [[0], [0], [-1]])
    np.testing.assert_array_equal(r1["priority"], [[0], [0], [1]])


def test_dropped_tokens_output_zero_and_stats_add_up() -> None:
    d, e = 4, 3
    p = moe_params(d, 6, e, router_scale=0.0)
    p["router"][:, 2] = 0.0
    x = np.random.default_rng(1).standard_normal((2, 5, d))
    y, s = moe_forward(p, x, e, top_k=1, capacity_factor=1.0)  # uniform router: all pick expert 0
    cap = expert_capacity(10, e, 1.0)
    assert s["capacity"] == cap == 4
    flat_y = y.reshape(10, d)
    ye, _ = mlp_forward(expert_params(p, 0), x.reshape(10, d)[:cap])
    np.testing.assert_allclose(flat_y[:cap], ye / e, rtol=1e-13)  # gate = 1/E
    np.testing.assert_array_equal(flat_y[cap:], 0.0)
    np.testing.assert_array_equal(s["tokens_per_expert"], [cap, 0, 0])
    np.testing.assert_array_equal(s["routed"], [10, 0, 0])
    assert s["dropped"] == 10 - cap
    # Switch aux loss with f = (1, 0, 0), P = (1/3, 1/3, 1/3): α·E·(1/E) = α
    assert abs(s["aux_loss"] - 0.01) < 1e-15


def test_aux_loss_matches_switch_formula() -> None:
    d, e = 5, 4
    p = moe_params(d, 3, e, seed=2)
    x = np.random.default_rng(3).standard_normal((3, 4, d))
    _, s = moe_forward(p, x, e, top_k=2, capacity_factor=2.0, aux_loss_coef=0.1)
    z = x.reshape(-1, d) @ p["router"]
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    f = np.bincount(prob.argmax(1), minlength=e) / 12
    assert abs(s["aux_loss"] - 0.1 * e * (f * prob.mean(0)).sum()) < 1e-14
    counts = s["tokens_per_expert"].sum() + s["dropped"]
    assert counts == 12 * 2


@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_gradients_match_finite_differences(top_k: int) -> None:
    d, e = 4, 3
    p = moe_params(d, 5, e, seed=4, router_scale=2.0)
    x = np.random.default_rng(5).standard_normal((2, 4, d))
    y, s = moe_forward(p, x, e, top_k=top_k, capacity_factor=1.0, aux_loss_coef=0.3)
    assert s["dropped"] > 0 and s["tokens_per_expert"].sum() > 0
    logp = np.sort(np.log(s["probs"]), axis=1)[:, ::-1]
    assert (logp[:, top_k - 1] - logp[:, top_k]).min() > 1e-3  # no near-ties
    r = np.random.default_rng(6).standard_normal(y.shape)

    def loss() -> float:
        yy, ss = moe_forward(p, x, e, top_k=top_k, capacity_factor=1.0, aux_loss_coef=0.3)
        return float((yy * r).sum()) + ss["aux_loss"]

    dx, g = moe_backward(p, s, r, daux=1.0)
    assert list(g) == list(p)
    assert rel_error(dx, numerical_grad(loss, x)) < 1e-6
    for k, v in p.items():
        assert rel_error(g[k], numerical_grad(loss, v)) < 1e-6, k
