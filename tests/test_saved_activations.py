"""``saved`` holds activations only: no array in any layer's or unit's ``saved`` shares
memory with a parameter (``numpy.shares_memory``), in float64 and in 16 bits.

The contract of ``minipar.nn`` (../shared/ARCHITECTURE.md §2): every backward is
handed its parameters again, so ZeRO-3 may free a gathered weight between a unit's
forward and its backward, and checkpointing or offloading may drop or move ``saved``
without touching a weight.  The parameters here are views of one flat buffer, as in
training (``ModelStates.param_views``), so a saved view of any weight — the array, a
transpose, a slice — shares memory with that buffer and is caught; the last tests
show the walk catching a weight saved on purpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from minipar.nn import (
    GPT,
    MLP,
    GPTConfig,
    Hooks,
    MLPConfig,
    attention_core_forward,
    attention_forward,
    block_forward,
    embed_forward,
    embedding_forward,
    executor,
    gelu_forward,
    head_forward,
    layernorm_forward,
    linear_forward,
    mlp_forward,
    moe_forward,
    sub,
)
from minipar.nn.mlp_model import LayerUnit, layer_forward
from minipar.nn.moe import expert_params
from minipar.optim import FlatParams

DTYPES = ["float64", "bfloat16", "float16"]
DENSE = {"vocab_size": 11, "block_size": 6, "n_layer": 2, "n_head": 2, "d_model": 8}
MOE = {**DENSE, "n_experts": 4, "top_k": 2, "capacity_factor": 1.0}


def arrays(tree: Any, path: str = "saved") -> list[tuple[str, np.ndarray]]:
    """Every NumPy array in a nested dict / list / tuple, with where it sits."""
    if isinstance(tree, np.ndarray):
        return [(path, tree)]
    if isinstance(tree, dict):
        return [a for k, v in tree.items() for a in arrays(v, f"{path}[{k!r}]")]
    if isinstance(tree, (list, tuple)):
        return [a for i, v in enumerate(tree) for a in arrays(v, f"{path}[{i}]")]
    return []


def shared(saved: Any, flat: np.ndarray) -> list[str]:
    """Paths of the arrays in ``saved`` that share memory with the parameter buffer ``flat``."""
    found = arrays(saved)
    assert found, "nothing saved: the walk would prove nothing"
    return [p for p, a in found if np.shares_memory(a, flat)]


def flat_params(model: GPT | MLP, dtype: str, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Perturbed initial parameters as views of one flat buffer of ``dtype``."""
    p64 = model.init(seed)
    r = np.random.default_rng(seed + 1)
    p64 = {k: v + 0.1 * r.standard_normal(v.shape) for k, v in p64.items()}
    layout = FlatParams.like(p64)
    flat = layout.flatten(p64, np.float64).astype(model.cfg.dtype)
    return flat, layout.unflatten(flat)


def gpt(kw: dict, dtype: str) -> tuple[GPT, np.ndarray, dict, np.ndarray]:
    model = GPT(GPTConfig(**kw, dtype=dtype))
    flat, p = flat_params(model, dtype)
    tokens = np.random.default_rng(2).integers(0, kw["vocab_size"], (3, kw["block_size"]))
    return model, flat, p, tokens


# ------------------------------------------------------------------ every layer
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_layer_saves_activations_only(dtype: str) -> None:
    model, flat, p, tokens = gpt(MOE, dtype)
    cfg = model.cfg
    x = np.random.default_rng(3).standard_normal((3, cfg.block_size, cfg.d_model)).astype(cfg.dtype)
    b0, b1 = sub(p, "blocks.0."), sub(p, "blocks.0.moe.")
    r = np.random.default_rng(4)
    heads = [r.standard_normal((3, 2, cfg.block_size, 4)).astype(cfg.dtype) for _ in range(3)]
    saved = {
        "linear": linear_forward(x, b0["attn.w_qkv"])[1],
        "layernorm": layernorm_forward(x, b0["ln1.gamma"], b0["ln1.beta"])[1],
        "embedding": embedding_forward(p["tok_emb"], tokens)[1],
        "gelu": gelu_forward(x)[1],
        "attention core": attention_core_forward(*heads)[1],
        "attention": attention_forward(sub(b0, "attn."), x, cfg.n_head)[1],
        "mlp (expert 0)": mlp_forward(expert_params(b1, 0), x)[1],
        "moe": moe_forward(b1, x, cfg.n_experts, cfg.top_k, cfg.capacity_factor)[1],
        "embed": embed_forward(p, tokens, cfg)[1],
        "block": block_forward(b0, x, cfg)[1],
        "head": head_forward(p, x)[1],
    }
    for name, s in saved.items():
        assert shared(s, flat) == [], f"{name} ({dtype}) saved a parameter: {shared(s, flat)}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_mlp_model_layers_save_activations_only(dtype: str) -> None:
    model = MLP(MLPConfig(sizes=(3, 5, 4, 2), dtype=dtype))
    flat, p = flat_params(model, dtype)
    h = np.random.default_rng(0).standard_normal((6, 3)).astype(dtype)
    for i in range(3):
        h, s = layer_forward(sub(p, f"layers.{i}."), h, i == 2)
        assert shared(s, flat) == [], (i, shared(s, flat))


# ------------------------------------------------------------------ every unit
class Keep(Hooks):
    """The serial hooks, keeping every unit's ``saved`` by name."""

    def __init__(self, params: dict) -> None:
        super().__init__(params)
        self.saved: dict[str, Any] = {}

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        self.saved[unit.name] = saved
        return saved


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["dense", "moe", "mlp"])
def test_every_unit_saves_activations_only(kind: str, dtype: str) -> None:
    if kind == "mlp":
        model: GPT | MLP = MLP(MLPConfig(sizes=(3, 6, 5, 2), dtype=dtype))
        flat, p = flat_params(model, dtype)
        x = np.random.default_rng(0).standard_normal((7, 3))
        y = np.random.default_rng(1).integers(0, 2, 7)
    else:
        model, flat, p, x = gpt(MOE if kind == "moe" else DENSE, dtype)
        y = np.roll(x, -1, axis=1)
    hooks = Keep(p)
    executor.loss_and_grads(model.units(), hooks, x, y)
    assert list(hooks.saved) == [u.name for u in model.units()]
    for name, s in hooks.saved.items():
        assert shared(s, flat) == [], f"{kind} {name} ({dtype}) saved {shared(s, flat)}"
    assert set(hooks.grads) == set(p)


# ------------------------------------------------------------------ the walk can fail
def test_the_walk_catches_a_saved_weight_its_view_and_its_slice() -> None:
    _model, flat, p, _ = gpt(DENSE, "float64")
    w = p["blocks.1.attn.w_out"]
    x = np.ones((2, 8))
    saved = {"ok": (x, [x * 2]), "weight": w, "nested": [(x, w.T)], "slice": {"s": w[:, 1:3]}}
    assert shared(saved, flat) == ["saved['weight']", "saved['nested'][0][1]",
                                   "saved['slice']['s']"]


def test_the_walk_catches_a_unit_that_saves_its_weight() -> None:
    """The old layer API saved ``(x, w, has_bias)``: a unit doing so is caught."""

    class LeakyLayer(LayerUnit):
        def forward(self, p: dict, x: Any) -> tuple[Any, Any]:
            y, s = super().forward(p, x)
            return y, (s, p["w"])

    model = MLP(MLPConfig(sizes=(3, 4, 2)))
    flat, p = flat_params(model, "float64")
    units = (LeakyLayer(model.cfg, 0), *model.units()[1:])
    hooks = Keep(p)
    executor.forward(units, hooks, np.ones((2, 3)))
    assert shared(hooks.saved["layer 0"], flat) == ["saved[1]"]
    assert shared(hooks.saved["layer 1"], flat) == []
