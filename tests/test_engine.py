"""The engine interface's shared parts: shards, flat ranges, read_region, the serial engine."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.engine import (
    Batch,
    Engine,
    Piece,
    SerialEngine,
    Shard,
    State,
    assemble,
    flat_pieces,
    load_pieces,
    read_region,
    routing_spans,
    whole,
)


def _flat_state(g: np.ndarray, cuts: list[int], place: Shard | None = None) -> list[State]:
    """One state per flat range [cuts[i], cuts[i+1]) of g (ZeRO's cut)."""
    place = place or whole("w", g.shape)
    flat = g.reshape(-1)
    out = []
    for a, b in itertools.pairwise(cuts):
        st = State()
        st.arrays[("param", "w")] = (Shard("w", g.shape, flat_pieces(place, g.shape, a, b)),
                                     flat[a:b])
        out.append(st)
    return out


@pytest.mark.parametrize("shape", [(7,), (4, 8), (3, 5, 4), (1, 1), (2, 3, 1, 5)])
def test_flat_ranges_of_any_cut_reassemble_the_tensor(shape):
    rng = np.random.default_rng(0)
    g = rng.standard_normal(shape)
    n = g.size
    for trial in range(20):
        cuts = sorted({0, n, *rng.integers(0, n + 1, size=3).tolist()})
        states = _flat_state(g, cuts)
        for st in states:  # every piece's local block, read in C order, is its global block
            shard, arr = st.arrays[("param", "w")]
            for p in shard.pieces:
                np.testing.assert_array_equal(arr[p.local].reshape(g[p.global_].shape),
                                              g[p.global_])
        np.testing.assert_array_equal(assemble(states, "param", "w", shape), g)


def test_flat_range_pieces_are_row_blocks():
    pieces = flat_pieces(whole("w", (4, 8)), (4, 8), 8, 32)  # the docstring's example
    assert pieces == (Piece((slice(0, 24),), (slice(1, 4), slice(0, 8))),)
    pieces = flat_pieces(whole("w", (4, 8)), (4, 8), 3, 30)
    assert [p.global_ for p in pieces] == [(slice(0, 1), slice(3, 8)), (slice(1, 3), slice(0, 8)),
                                           (slice(3, 4), slice(0, 6))]


def _tp_qkv(g: np.ndarray, t: int, r: int) -> tuple[Shard, np.ndarray]:
    """TP's w_qkv (d, 3d) on rank r of t: three column groups."""
    d = g.shape[0]
    c = d // t
    pieces = tuple(Piece((slice(0, d), slice(j * c, (j + 1) * c)),
                         (slice(0, d), slice(j * d + r * c, j * d + (r + 1) * c))) for j in range(3))
    local = np.concatenate([g[:, j * d + r * c:j * d + (r + 1) * c] for j in range(3)], axis=1)
    return Shard("w_qkv", g.shape, pieces), local


def test_tensor_parallel_column_groups_and_a_flat_range_of_them():
    g = np.arange(4 * 12, dtype=float).reshape(4, 12)
    states = []
    for r in range(2):
        shard, local = _tp_qkv(g, 2, r)
        st = State()
        st.arrays[("param", "w_qkv")] = (shard, local)
        # ZeRO over the TP rank's local tensor: a flat range cut at 5 of 24 elements
        for a, b in ((0, 5), (5, 24)):
            s2 = State()
            s2.arrays[("exp_avg", "w_qkv")] = (Shard("w_qkv", g.shape,
                                                     flat_pieces(shard, local.shape, a, b)),
                                               local.reshape(-1)[a:b])
            states.append(s2)
        states.append(st)
    np.testing.assert_array_equal(assemble(states, "param", "w_qkv", g.shape), g)
    np.testing.assert_array_equal(assemble(states, "exp_avg", "w_qkv", g.shape), g)
    np.testing.assert_array_equal(read_region(states, "param", "w_qkv", (slice(1, 3), slice(2, 9))),
                                  g[1:3, 2:9])


def test_a_region_no_state_holds_is_refused():
    g = np.zeros((4, 8))
    states = _flat_state(g, [0, 10])
    with pytest.raises(ValueError, match="not all of it is held"):
        assemble(states, "param", "w", g.shape)


def test_load_pieces_across_layouts():
    g = np.random.default_rng(1).standard_normal((6, 5))
    saved = _flat_state(g, [0, 7, 19, 30])  # three ZeRO ranks
    target = _flat_state(np.zeros((6, 5)), [0, 13, 30])  # resumed on two
    load_pieces(target[0], saved)
    load_pieces(target[1], saved)
    np.testing.assert_array_equal(assemble(target, "param", "w", g.shape), g)


def test_routing_spans_nest_like_the_ranks_rows():
    assert routing_spans(10, ()) == [(0, 10)]
    assert routing_spans(10, (2, 2)) == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert routing_spans(10, (4,)) == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize("spec", [RunSpec(), RunSpec(precision="mixed"),
                                  RunSpec(experts=4, top_k=2, capacity_factor=1.0),
                                  RunSpec(optimizer="sgd", precision="mixed-fp16")])
def test_serial_engine_is_the_oracle_and_resumes_to_the_bit(spec):
    world = 2 if spec.experts else 1
    ref = serial_reference(spec, world)
    eng = SerialEngine(spec.model(), spec.precision, spec.optimizer, spec.seed,
                       routing=(world,) if spec.experts else (), **spec.opt_kwargs())
    assert isinstance(eng, Engine)
    losses = []
    for s in range(spec.steps):
        losses.append(eng.step(Batch(s, *spec.global_batch(s))).loss)
        if s == 0:
            saved = eng.state_dict()
            copy = State({k: (sh, a.copy()) for k, (sh, a) in saved.arrays.items()},
                         dict(saved.scalars))
    assert losses == ref["losses"]
    np.testing.assert_array_equal(eng.states.params, ref["params"])
    fresh = SerialEngine(spec.model(), spec.precision, spec.optimizer, spec.seed + 1,
                         routing=eng.routing, **spec.opt_kwargs())
    fresh.load_state_dict(copy)
    assert fresh.steps_done == 1
    again = [fresh.step(Batch(s, *spec.global_batch(s))).loss for s in range(1, spec.steps)]
    assert again == losses[1:]
    np.testing.assert_array_equal(fresh.states.params, eng.states.params)
    full = eng.full_params()
    assert list(full) == list(spec.model().param_shapes())
    assert eng.memory()["params"] == eng.states.params.nbytes
    assert eng.evaluate(Batch(9, *spec.global_batch(9))) > 0
