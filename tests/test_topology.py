"""minipar.comm.topology: the rank grid, against tables written by hand, on 1 to 8 ranks.

The layout arithmetic is checked in-process (hand tables; every
factorisation of 1..8 for the generic properties; the error messages).  Each
world size is then ONE launch of tests/mpi/topology_check.py, which builds
every grid of that size through real ``Split`` communicators and checks them
from MPI's side (who is in each communicator, who an all-reduce reaches,
which axis its bytes are counted on); its grids for 8 = 2x2x2, 8 = 1x2x4,
4 = 2x1x2 and 8 = 4x1x2 with ep 2 are compared with the same hand tables.
"""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import MPI_DIR, summary_of

from minipar import launch
from minipar.comm.topology import AXES, EXPERT_AXES, Layout

# rank: (dp, pp, tp coordinates), tp group, pp group, dp group -- written out by hand
HAND_2x2x2 = {  # dp 2, pp 2, tp 2: rank = 4d + 2p + t
    0: ((0, 0, 0), [0, 1], [0, 2], [0, 4]),
    1: ((0, 0, 1), [0, 1], [1, 3], [1, 5]),
    2: ((0, 1, 0), [2, 3], [0, 2], [2, 6]),
    3: ((0, 1, 1), [2, 3], [1, 3], [3, 7]),
    4: ((1, 0, 0), [4, 5], [4, 6], [0, 4]),
    5: ((1, 0, 1), [4, 5], [5, 7], [1, 5]),
    6: ((1, 1, 0), [6, 7], [4, 6], [2, 6]),
    7: ((1, 1, 1), [6, 7], [5, 7], [3, 7]),
}
HAND_1x2x4 = {  # dp 1, pp 2, tp 4: rank = 4p + t
    0: ((0, 0, 0), [0, 1, 2, 3], [0, 4], [0]),
    1: ((0, 0, 1), [0, 1, 2, 3], [1, 5], [1]),
    2: ((0, 0, 2), [0, 1, 2, 3], [2, 6], [2]),
    3: ((0, 0, 3), [0, 1, 2, 3], [3, 7], [3]),
    4: ((0, 1, 0), [4, 5, 6, 7], [0, 4], [4]),
    5: ((0, 1, 1), [4, 5, 6, 7], [1, 5], [5]),
    6: ((0, 1, 2), [4, 5, 6, 7], [2, 6], [6]),
    7: ((0, 1, 3), [4, 5, 6, 7], [3, 7], [7]),
}
HAND_2x1x2 = {  # dp 2, pp 1, tp 2 on 4 ranks: rank = 2d + t
    0: ((0, 0, 0), [0, 1], [0], [0, 2]),
    1: ((0, 0, 1), [0, 1], [1], [1, 3]),
    2: ((1, 0, 0), [2, 3], [2], [0, 2]),
    3: ((1, 0, 1), [2, 3], [3], [1, 3]),
}
# dp 4, tp 2, ep 2 on 8 ranks: experts in blocks of 2 data-parallel ranks
# rank: (ep coord, edp coord), ep group, edp group
HAND_EP = {
    0: ((0, 0), [0, 2], [0, 4]), 1: ((0, 0), [1, 3], [1, 5]),
    2: ((1, 0), [0, 2], [2, 6]), 3: ((1, 0), [1, 3], [3, 7]),
    4: ((0, 1), [4, 6], [0, 4]), 5: ((0, 1), [5, 7], [1, 5]),
    6: ((1, 1), [4, 6], [2, 6]), 7: ((1, 1), [5, 7], [3, 7]),
}
HAND = {(2, 2, 1, 2, 1): HAND_2x2x2, (1, 2, 1, 4, 1): HAND_1x2x4, (2, 1, 1, 2, 1): HAND_2x1x2}


def _check_hand(table, coords_of, group_of):
    for rank, (co, tp, pp, dp) in table.items():
        assert tuple(coords_of(rank)[a] for a in ("dp", "pp", "tp")) == co, rank
        assert coords_of(rank)["cp"] == 0
        assert (group_of(rank, "tp"), group_of(rank, "pp"), group_of(rank, "dp")) == (tp, pp, dp)


def _check_hand_ep(coords_of, group_of):
    for rank, (co, ep, edp) in HAND_EP.items():
        assert (coords_of(rank)["ep"], coords_of(rank)["edp"]) == co, rank
        assert (group_of(rank, "ep"), group_of(rank, "edp")) == (ep, edp), rank


@pytest.mark.parametrize("shape", sorted(HAND))
def test_layout_matches_hand_tables(shape):
    dp, pp, cp, tp, ep = shape
    lay = Layout.check(dp * pp * cp * tp, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep)
    _check_hand(HAND[shape], lay.coords, lay.ranks)


def test_layout_expert_groups_match_hand_table():
    lay = Layout.check(8, dp=4, tp=2, ep=2)
    _check_hand_ep(lay.coords, lay.ranks)


def _factorisations(n):
    for dp, pp, cp in itertools.product(range(1, n + 1), repeat=3):
        if n % (dp * pp * cp) == 0:
            tp = n // (dp * pp * cp)
            for ep in range(1, dp * cp + 1):
                if dp * cp % ep == 0:
                    yield dp, pp, cp, tp, ep


@pytest.mark.parametrize("n", range(1, 9))
def test_every_factorisation_is_a_grid(n):
    """Groups partition the world, have size(axis) ranks, differ only on their axis."""
    shapes = list(_factorisations(n))
    assert len({s[:4] for s in shapes}) == {1: 1, 2: 4, 3: 4, 4: 10, 5: 4, 6: 16, 7: 4, 8: 20}[n]
    for dp, pp, cp, tp, ep in shapes:
        lay = Layout.check(n, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep)
        coords = [lay.coords(r) for r in range(n)]
        assert len({tuple(c[a] for a in AXES) for c in coords}) == n  # a bijection
        for r, c in enumerate(coords):
            assert r == ((c["dp"] * pp + c["pp"]) * cp + c["cp"]) * tp + c["tp"]
            assert lay.rank_of(**{a: c[a] for a in AXES}) == r
        for axis in AXES + EXPERT_AXES:
            groups = {tuple(lay.ranks(r, axis)) for r in range(n)}
            assert sorted(m for g in groups for m in g) == list(range(n)), (axis, groups)
            for g in groups:
                assert len(g) == lay.size(axis)
                assert [coords[m][axis] for m in g] == list(range(len(g)))
                others = [a for a in AXES if a != axis] if axis in AXES else ["pp", "tp"]
                assert len({tuple(coords[m][a] for a in others) for m in g}) == 1
        assert lay.size("ep") * lay.size("edp") == dp * cp
        # tensor-parallel ranks are adjacent
        assert all(lay.ranks(r, "tp") == list(range(r - r % tp, r - r % tp + tp))
                   for r in range(n))


@pytest.mark.parametrize("world, kwargs, words", [
    (4, {"dp": 3}, ["3·1·1·1 = 3", "number of ranks, 4"]),
    (8, {"dp": 2, "pp": 2, "tp": 3}, ["2·2·1·3 = 12", "8"]),
    (4, {"dp": 0, "tp": 4}, ["dp must be a positive integer, got 0"]),
    (4, {"tp": -4}, ["tp must be a positive integer, got -4"]),
    (2, {"dp": 2.0}, ["dp must be a positive integer, got 2.0"]),
    (2, {"cp": True, "dp": 2}, ["cp must be a positive integer, got True"]),
    (6, {"dp": 2, "cp": 1, "tp": 3, "ep": 4}, ["ep = 4 must divide dp·cp = 2·1 = 2"]),
])
def test_bad_sizes_name_the_numbers(world, kwargs, words):
    with pytest.raises(ValueError) as err:
        Layout.check(world, **kwargs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_unknown_axis_is_named():
    with pytest.raises(ValueError, match="unknown grid axis 'sp'.*dp, pp, cp, tp, ep, edp"):
        Layout.check(2, dp=2).size("sp")


@pytest.mark.parametrize("n", range(1, 9))
def test_grid_on_real_ranks(n):
    proc = launch.run(n, str(MPI_DIR / "topology_check.py"), timeout=240,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    out = proc.stdout + proc.stderr
    fields = summary_of(proc, "TOPO")
    assert fields["N"] == str(n) and fields["failures"] == "0", out[-4000:]
    assert int(fields["grids"]) == len(list(_factorisations(n)))

    grids = [json.loads(ln.split(" ", 1)[1]) for ln in proc.stdout.splitlines()
             if ln.startswith("TOPO-GRID ")]
    seen = {tuple(g["shape"]) for g in grids}
    want = {s for s in HAND if s[0] * s[1] * s[2] * s[3] == n} | ({(4, 1, 1, 2, 2)} if n == 8 else set())
    assert seen == want
    for g in grids:
        def coords_of(r, ranks=g["ranks"]):
            return ranks[r]["coords"]

        def group_of(r, a, ranks=g["ranks"]):
            return ranks[r]["groups"][a]

        if tuple(g["shape"]) in HAND:
            _check_hand(HAND[tuple(g["shape"])], coords_of, group_of)
        else:
            _check_hand_ep(coords_of, group_of)
    if n == 8:  # describe(): rank 0 of the 2x2x2 grid, every rank's line and its groups
        assert "grid of 8 ranks = dp 2 x pp 2 x cp 1 x tp 2" in proc.stdout
        assert "    5 |  1  0  0  1 |  0   1" in proc.stdout
        assert "  tp  coord 0 of 2: ranks [0, 1]" in proc.stdout

    bad = json.loads(next(ln for ln in proc.stdout.splitlines()
                          if ln.startswith("TOPO-BAD "))[len("TOPO-BAD "):])
    assert all(m is not None and m.startswith("Grid: ") for m in bad["messages"]), bad
    if n == 4:  # Grid(world of 4, dp=3)
        assert bad["messages"][-1] == ("Grid: dp·pp·cp·tp = 3·1·1·1 = 3 must equal the number "
                                       "of ranks, 4; choose sizes whose product is 4")
