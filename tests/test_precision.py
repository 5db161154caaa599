"""Precision policies: 2 + 2 + 12 = 16 bytes per parameter measured, master weights, loss scaling."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from minipar.nn import GPT, GPTConfig
from minipar.precision import DynamicLossScaler, ModelStates, get

CFG = {"vocab_size": 13, "block_size": 8, "n_layer": 2, "n_head": 2, "d_model": 16}


def states(policy: str, **kw) -> tuple[GPT, ModelStates]:
    model = GPT(GPTConfig(**CFG, dtype=get(policy).model_dtype))
    return model, ModelStates(policy, GPT(GPTConfig(**CFG)).init(0), "adamw", lr=1e-2, **kw)


@pytest.mark.parametrize("policy,per_param", [("mixed", 16), ("mixed-fp16", 16),
                                              ("float32", 16), ("float64", 32)])
def test_bytes_per_parameter_measured(policy: str, per_param: int) -> None:
    model, st = states(policy)
    psi = model.n_params()
    b = st.bytes_by_category()
    assert sum(b.values()) == per_param * psi
    if policy.startswith("mixed"):  # ZeRO's split: 2Ψ + 2Ψ + 12Ψ
        assert (b["params"], b["grads"], b["optimizer states"]) == (2 * psi, 2 * psi, 12 * psi)
    # the ledger is the arrays' own sizes
    arrays = [st.params, st.grads, *st.optimizer.state_arrays()] + ([st.master] if st.master is not None else [])
    assert sum(a.nbytes for a in arrays) == per_param * psi


def test_mixed_step_updates_fp32_master_and_rounds_params() -> None:
    model, st = states("mixed")
    assert st.params.dtype == np.dtype(ml_dtypes.bfloat16) and st.master.dtype == np.float32
    x = np.random.default_rng(0).integers(0, 13, (2, 8))
    _loss, grads = model.loss_and_grads(st.param_views(), x, x)
    assert all(g.dtype == np.dtype(ml_dtypes.bfloat16) for g in grads.values())
    st.set_grads(grads)
    before = st.master.copy()
    assert st.step()
    assert not np.array_equal(before, st.master)
    np.testing.assert_array_equal(st.params, st.master.astype(ml_dtypes.bfloat16))


def test_sliced_states_equal_full_states_bitwise() -> None:
    """ZeRO's premise: two ranks stepping halves == one rank stepping all."""
    model, full = states("mixed")
    n = full.layout.size
    halves = [ModelStates("mixed", GPT(GPTConfig(**CFG)).init(0), "adamw", lo=lo, hi=hi, lr=1e-2)
              for lo, hi in ((0, n // 3), (n // 3, n))]
    x = np.random.default_rng(1).integers(0, 13, (2, 8))
    for _ in range(2):
        _, g = model.loss_and_grads(full.param_views(), x, x)
        full.set_grads(g)
        full.step()
        for h in halves:
            h.set_grads(g)
            h.step()
            h.params[:] = full.params  # stands in for the all-gather of the other shard
    np.testing.assert_array_equal(full.master, np.concatenate([h.master for h in halves]))


def test_loss_scaler_skips_nonfinite_steps_and_regrows() -> None:
    _model, st = states("mixed-fp16")
    s0 = st.loss_scale
    assert s0 == 2.0**15 and st.params.dtype == np.float16
    st.grads[3] = np.inf
    before = st.params.copy()
    assert not st.step()
    assert st.loss_scale == s0 / 2 and st.scaler.skipped == 1
    np.testing.assert_array_equal(st.params, before)
    sc = DynamicLossScaler(scale=4.0, growth_interval=2)
    for inf in (False, False, False, True, False):
        sc.update(inf)
    assert sc.scale == 4.0  # x2 after two clean steps, /2 on the overflow


def test_fp16_scaled_gradients_are_unscaled_before_the_update() -> None:
    """With scale S the optimizer sees grad(S·loss)/S: same step as a run with S = 1 (to fp16)."""
    model, st = states("mixed-fp16")
    x = np.random.default_rng(2).integers(0, 13, (2, 8))
    _, g_scaled = model.loss_and_grads(st.param_views(), x, x, loss_scale=st.loss_scale)
    _, g64 = GPT(GPTConfig(**CFG)).loss_and_grads(GPT(GPTConfig(**CFG)).init(0), x, x)
    for k in g64:
        got = g_scaled[k].astype(np.float64) / st.loss_scale
        scale = max(np.abs(g64[k]).max(), 1e-12)
        assert np.abs(got - g64[k]).max() / scale < 3e-2, k
    st.set_grads(g_scaled)
    assert np.isfinite(st.grads.astype(np.float32)).all() and st.step()


def test_bad_policy_and_slice() -> None:
    with pytest.raises(ValueError,
                       match="precision must be one of float64, float32, mixed, mixed-fp16, fp8; "
                             "got .fp4."):
        get("fp4")
    with pytest.raises(ValueError, match="outside"):
        ModelStates("float64", {"w": np.zeros(3)}, lo=2, hi=5)
    assert math.isclose(get("mixed").param_dtype.itemsize, 2)
