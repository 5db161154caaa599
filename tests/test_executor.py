"""The units executor: one walk over the model, hooks where strategies plug in.

Serial computation reproduced: ``GPT.loss_and_grads`` / ``MLP.loss_and_grads``
(themselves checked against finite differences in tests/test_nn_gpt.py), bit for
bit, whatever the hooks do with parameters and activations: the hooks' order,
a pipeline-like split into slices of units, activation checkpointing (drop
``saved``, recompute it in ``restore``) and offloading (copy out and back), the
gradient scale (the MoE auxiliary loss's gradient included), and the records.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from minipar.nn import GPT, MLP, GPTConfig, Hooks, MLPConfig, executor
from minipar.nn.units import spans
from minipar.optim import FlatParams

TINY = {"vocab_size": 9, "block_size": 6, "n_layer": 3, "n_head": 2, "d_model": 8}
CONFIGS = {"dense": GPTConfig(**TINY),
           "moe": GPTConfig(**TINY, n_experts=4, top_k=2, capacity_factor=1.0, moe_every=2)}


def setup(kind: str) -> tuple[GPT | MLP, dict, Any, Any]:
    r = np.random.default_rng(0)
    if kind == "mlp":
        model: GPT | MLP = MLP(MLPConfig(sizes=(3, 7, 5, 4)))
        x, y = r.standard_normal((9, 3)), r.integers(0, 4, 9)
    else:
        model = GPT(CONFIGS[kind])
        x = r.integers(0, 9, (3, 6))
        y = np.roll(x, -1, axis=1)
    p = {k: v + 0.1 * r.standard_normal(v.shape) for k, v in model.init(1).items()}
    return model, p, x, y


def same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def assert_walk_is_the_model(model: GPT | MLP, p: dict, hooks: Hooks, x: Any, y: Any) -> None:
    """The executor's walk with ``hooks`` gives the model's own loss and gradients, to the bit."""
    loss, grads = model.loss_and_grads(p, x, y)
    assert executor.loss_and_grads(model.units(), hooks, x, y) == loss
    assert same({k: hooks.grads[k] for k in p}, grads)


# ------------------------------------------------------------------ units
@pytest.mark.parametrize("kind", ["dense", "moe", "mlp"])
def test_units_tile_the_parameter_order(kind: str) -> None:
    model, p, _, _ = setup(kind)
    units = model.units()
    assert [n for u in units for n in u.full_names] == list(p)
    layout = FlatParams.like(p)
    sp = spans(units, layout)
    assert sp[0][0] == 0 and sp[-1][1] == layout.size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(sp))
    for u, (lo, hi) in zip(units, sp):
        assert hi - lo == sum(p[n].size for n in u.full_names)
    with pytest.raises(ValueError, match="do not tile"):
        spans(units[::-1], layout)
    with pytest.raises(ValueError, match="do not tile"):
        spans(units[1:], layout)


def test_unit_names_prefixes_and_aux_losses() -> None:
    model, p, x, _y = setup("moe")
    units = model.units()
    assert [u.name for u in units] == ["embed", "block 0", "block 1", "block 2", "head"]
    assert [u.prefix for u in units] == ["", "blocks.0.", "blocks.1.", "blocks.2.", ""]
    assert "moe.router" in units[2].names and "mlp.w_in" in units[1].names
    aux: list[float] = []
    executor.forward(units, Hooks(p), x, aux=aux)
    assert aux[0] == aux[1] == aux[3] == aux[4] == 0.0 and aux[2] > 0  # block 1 is the MoE
    assert [u.name for u in MLP(MLPConfig()).units()] == ["layer 0", "layer 1", "layer 2"]


# ------------------------------------------------------------------ the walk
class Log(Hooks):
    """Serial hooks that log every call: (hook, unit name)."""

    def __init__(self, params: dict) -> None:
        super().__init__(params)
        self.log: list[tuple[str, str]] = []

    def fetch(self, unit: Any) -> dict:
        self.log.append(("fetch", unit.name))
        return super().fetch(unit)

    def release(self, unit: Any, params: dict) -> None:
        self.log.append(("release", unit.name))

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        self.log.append(("on_saved", unit.name))
        return saved

    def restore(self, unit: Any, kept: Any) -> Any:
        self.log.append(("restore", unit.name))
        return kept

    def on_grads(self, unit: Any, grads: dict) -> None:
        self.log.append(("on_grads", unit.name))
        super().on_grads(unit, grads)


@pytest.mark.parametrize("kind", ["dense", "moe", "mlp"])
def test_the_walk_is_the_models_loss_and_grads_and_calls_the_hooks_in_order(kind: str) -> None:
    model, p, x, y = setup(kind)
    hooks = Log(p)
    assert_walk_is_the_model(model, p, hooks, x, y)
    names = [u.name for u in model.units()]
    fwd = [(h, n) for n in names for h in ("fetch", "release", "on_saved")]
    bwd = [(h, n) for n in reversed(names) for h in ("fetch", "restore", "release", "on_grads")]
    assert hooks.log == fwd + bwd


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_slices_of_units_compose_like_pipeline_stages(kind: str) -> None:
    """Stage 1 runs units [0, 2), stage 2 units [2, L+2) and the loss; backward in reverse."""
    from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward

    model, p, x, y = setup(kind)
    loss, grads = model.loss_and_grads(p, x, y, loss_scale=2.0)
    units, hooks = model.units(), Hooks(p)
    first, second = units[:2], units[2:]
    aux: list[float] = []
    h, kept1 = executor.forward(first, hooks, x, aux=aux)
    logits, kept2 = executor.forward(second, hooks, h, aux=aux)
    ce, s_ce = cross_entropy_forward(logits, y)
    assert ce + sum(aux) == loss
    dh = executor.backward(second, hooks, kept2, cross_entropy_backward(s_ce, 2.0), 2.0)
    assert dh.shape == h.shape and kept2 == []  # activations freed as the walk went
    assert executor.backward(first, hooks, kept1, dh, 2.0) is None  # the embedding's dx
    assert same({k: hooks.grads[k] for k in p}, grads)
    with pytest.raises(ValueError, match="kept activations"):
        executor.backward(first, hooks, [], dh)


class Checkpoint(Hooks):
    """Activation checkpointing: keep the unit's input instead of ``saved``; recompute."""

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        return x

    def restore(self, unit: Any, kept: Any) -> Any:
        return unit.forward(self.fetch(unit), kept)[1]


class Offload(Hooks):
    """Offloading: ``saved`` moved out (copied, the device copy dropped) and back."""

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        return _copy(saved)

    def restore(self, unit: Any, kept: Any) -> Any:
        return _copy(kept)


def _copy(tree: Any) -> Any:
    if isinstance(tree, np.ndarray):
        return tree.copy()
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copy(v) for v in tree)
    return tree


@pytest.mark.parametrize("kind", ["dense", "moe", "mlp"])
def test_dropping_or_moving_saved_changes_nothing(kind: str) -> None:
    model, p, x, y = setup(kind)
    assert_walk_is_the_model(model, p, Offload(p), x, y)
    ck = Checkpoint(p)
    assert_walk_is_the_model(model, p, ck, x, y)
    _, kept = executor.forward(model.units(), ck, x)
    assert kept[0] is x and all(isinstance(k, np.ndarray) for k in kept)  # inputs only


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_scale_multiplies_every_gradient_and_the_aux_loss_gets_it_too(kind: str) -> None:
    """grads(scale S) = S x grads(1) (to rounding), the router's included: if the MoE
    aux loss's gradient were not scaled (daux = 1), the router's would differ."""
    model, p, x, y = setup(kind)
    loss, g1 = model.loss_and_grads(p, x, y)
    hooks = Hooks(p)
    assert executor.loss_and_grads(model.units(), hooks, x, y, scale=8.0) == loss  # unscaled
    for k in p:
        np.testing.assert_allclose(hooks.grads[k], 8.0 * g1[k], rtol=1e-12, atol=1e-15,
                                   err_msg=k)
    if kind == "moe":  # and the check can fail: daux left at 1 breaks the router's gradient
        units = model.units()
        h, kept = executor.forward(units, Hooks(p), x)
        from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward

        dlogits = cross_entropy_backward(cross_entropy_forward(h, y)[1], 8.0)
        wrong = Hooks(p)
        for u in reversed(units):
            dlogits, g = u.backward(u.params(p), kept.pop(), dlogits)  # daux = 1
            wrong.on_grads(u, g)
        r = "blocks.1.moe.router"
        assert not np.allclose(wrong.grads[r], 8.0 * g1[r], rtol=1e-9, atol=0)


def test_records_time_every_unit_forward_and_backward() -> None:
    model, p, x, y = setup("dense")
    records: list = []
    executor.loss_and_grads(model.units(), Hooks(p), x, y, records=records)
    names = [u.name for u in model.units()]
    assert [(w, n) for w, n, _, _ in records] == ([("forward", n) for n in names]
                                                   + [("backward", n) for n in reversed(names)])
    assert all(t0 <= t1 for _, _, t0, t1 in records)
    assert all(a[3] <= b[2] for a, b in itertools.pairwise(records))  # one after another


def test_hooks_without_params_say_what_to_do() -> None:
    model, _, x, _ = setup("dense")
    with pytest.raises(ValueError, match="pass the parameter dict or override fetch"):
        executor.forward(model.units(), Hooks(), x)
