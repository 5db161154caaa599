"""The grid_groups exercise: the reference passes on 1, 4 and 8 ranks, wrong ones fail, named.

Each grading run is one launch through minipar.launch.run (bounded by a
timeout); the wrong solutions live in tests/mpi/ex_wrong_grid_*.py.  The
named mistakes are also checked in-process, on records made by simulating
``comm.Split`` (same colour -> one group, ordered by key, ties by rank).
The generic checks every exercise gets (start, untouched skeleton, hints)
are in tests/test_exercises.py, which iterates over EXERCISES.
"""

from __future__ import annotations

import pytest
from conftest import MPI_DIR, assert_caught, failed

from minipar.comm.topology import AXES, Layout
from minipar.exercises import get
from minipar.exercises.grading import check
from minipar.exercises.grid_groups import grader, mistakes

NAME = "grid_groups"


@pytest.mark.parametrize("n", [2, 4, 8])
def test_reference_solution_passes_on_every_grid(n):
    report = check(NAME, get(NAME).solution_path, n, timeout=90)
    assert report.passed, report.text()
    assert all(c.ok for c in report.checks), report.text()
    assert f"runs on {n} rank{'s' if n > 1 else ''}: {len(grader.cases(n))} cases" in (
        report.checks[0].name)


WRONG = [
    # file, {failing check (substring): message (substrings)}; every other check passes
    ("ex_wrong_grid_swapped.py", {
        "holds exactly its group": [("rank 0: comms['dp'] holds ranks [0, 1] (2); its dp group "
                                    "is [0, 2]"), "colour and key swapped"],
        "all-reduce over comms[axis]": ["comms['dp'] summed the contributions of ranks [0, 1]"]}),
    ("ex_wrong_grid_tp_outer.py", {
        "coordinates = minipar's Layout": [
            "your coordinates {dp 1, pp 0, cp 0, tp 0}, the Layout's {dp 0, pp 0, cp 0, tp 1}",
            "in the order tp, dp (outermost first; rank = t·dp + d)", "tp innermost"],
        "holds exactly its group": [("Your groups are, on every rank, those of the grid with the "
                                    "axes in the order tp, dp")],
        "all-reduce over comms[axis]": ["summed the contributions of ranks"]}),
    ("ex_wrong_grid_wrong_axis.py", {
        "holds exactly its group": ["comms['pp'] holds ranks [0, 1]",
                                    "That is your tp group: a group over the wrong axis"],
        "all-reduce over comms[axis]": ["summed the contributions of ranks"]}),
    ("ex_wrong_grid_one_color.py", {
        "holds exactly its group": [("comms['cp'] and comms['tp'] hold the same ranks, your tp "
                                    "group"), "one colour used for two axes"],
        "all-reduce over comms[axis]": ["summed the contributions of ranks"]}),
    ("ex_wrong_grid_split_order.py", {
        "holds exactly its group": [("Split call #1 made comms['dp'] on ranks 0, 2 but "
                                    "comms['tp'] on ranks 1, 3"), "the same order on every rank"],
        "all-reduce over comms[axis]": ["summed the contributions of ranks"]}),
    ("ex_wrong_grid_key.py", {
        "in coordinate order": [("comms['dp'] holds the right ranks in the wrong order: by their "
                                 "rank in it [2, 0], by dp coordinate [0, 2]"),
                                "key = your dp coordinate"]}),
    ("ex_wrong_grid_allgather.py", {
        "no messages": ["rank 0 called comm.Allgather 1 time",
                        "follow from your rank and the sizes alone"]}),
    ("ex_wrong_grid_skip_split.py", {
        "runs without error": ["raised SplitNotCalledEverywhere", "in comm.Split call #3",
                               "EVERY rank calls it, as many times, in the same order",
                               "ex_wrong_grid_skip_split.py:18: comms[a] = comm.Split("]}),
]


@pytest.mark.parametrize("file, expected", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_solution_is_caught_and_named(file, expected):
    report = check(NAME, MPI_DIR / file, 4, timeout=60, watchdog=3)
    assert len(failed(report)) == len(expected), report.text()
    for check_name, words in expected.items():
        assert_caught(report, check_name, words)


# -- in process: cases, the arithmetic, the named mistakes ------------------------------------
@pytest.mark.parametrize("n, count", [(1, 1), (2, 4), (4, 10), (6, 16), (8, 20)])
def test_cases_are_every_grid_of_n_ranks_once(n, count):
    cs = grader.cases(n)
    assert len(cs) == count == len({grader.label(c) for c in cs})
    assert all(c["dp"] * c["pp"] * c["cp"] * c["tp"] == n for c in cs)
    if n == 8:
        assert grader.label(cs[0]) == "dp 2 x pp 2 x cp 1 x tp 2"
    with_cp = [c["cp"] > 1 for c in cs]
    assert with_cp == sorted(with_cp)  # cp > 1 last


SIZES = {"dp": 2, "pp": 2, "cp": 1, "tp": 2}


def test_arithmetic_in_minipars_order_is_the_layouts():
    lay = Layout(dp=2, pp=2, cp=1, tp=2)
    for r in range(8):
        assert mistakes.coords_in(AXES, SIZES, r) == mistakes.coords(SIZES, r)
        for a in AXES:
            assert mistakes.group_in(AXES, SIZES, r, a) == lay.ranks(r, a)
    assert mistakes.formula(AXES) == "rank = ((d·pp + p)·cp + c)·tp + t"
    assert mistakes.formula(("tp", "dp")) == "rank = t·dp + d"
    assert mistakes.group_in(("tp", "pp", "dp"), SIZES, 5, "tp") == [1, 5]


def simulate(sizes: dict, plan) -> list[dict]:
    """Every rank's record when rank r calls Split with ``plan(r)`` = [(axis, colour, key)]
    and reports ``coords`` from the Layout (as the grader's run_grid would measure it)."""
    n = Layout(**sizes).world
    calls = [plan(r) for r in range(n)]
    out = [{"contract": None, "coords": mistakes.coords(sizes, r), "members": {},
            "reduced": {}, "split_axes": []} for r in range(n)]
    for i in range(len(calls[0])):
        for r in range(n):
            axis, color, _ = calls[r][i]
            group = sorted((q for q in range(n) if calls[q][i][1] == color),
                           key=lambda q, i=i: (calls[q][i][2], q))
            out[r]["members"][axis] = group
            out[r]["reduced"][axis] = sorted(group)
            out[r]["split_axes"].append(axis)
    return out


def right(sizes: dict, r: int, axes=AXES, color=None, key=None) -> list:
    lay = Layout(**sizes)
    co = lay.coords(r)
    return [(a, (color or (lambda a, r: lay.ranks(r, a)[0]))(a, r),
             (key or (lambda a, r: co[a]))(a, r)) for a in axes]


def test_the_reference_plan_has_no_findings():
    everyone = simulate(SIZES, lambda r: right(SIZES, r))
    assert all(mistakes.findings(SIZES, r, everyone) == {} for r in range(8))


def test_each_mistake_is_named_in_process():
    lay = Layout(**SIZES)

    def said(plan, key="members", rank=5):
        return mistakes.findings(SIZES, rank, simulate(SIZES, plan)).get(key, "")

    swapped = said(lambda r: right(SIZES, r, color=lambda a, r: lay.coords(r)[a],
                                   key=lambda a, r: lay.ranks(r, a)[0]))
    assert "colour and key swapped" in swapped
    backwards = said(lambda r: right(SIZES, r, key=lambda a, r: -lay.coords(r)[a]), "order")
    assert "rank 5: comms['dp'] holds the right ranks in the wrong order: by their rank in it " \
           "[5, 1], by dp coordinate [1, 5]" in backwards
    mixed = said(lambda r: right(SIZES, r, AXES if r < 4 else AXES[::-1]))
    assert "Split call #1 made comms['dp'] on ranks 0, 1, 2, 3 but comms['tp'] on ranks 4, 5, " \
           "6, 7" in mixed
    reused = said(lambda r: [*right(SIZES, r, ("dp", "tp")),
                             ("pp", lay.ranks(r, "tp")[0], lay.coords(r)["pp"]),
                             ("cp", r, 0)])
    assert "comms['pp'] and comms['tp'] hold the same ranks, your tp group" in reused
    relabel = simulate(SIZES, lambda r: right(SIZES, r))
    for rec in relabel:
        rec["members"]["pp"], rec["members"]["tp"] = rec["members"]["tp"], rec["members"]["pp"]
    words = mistakes.findings(SIZES, 5, relabel)["members"]
    assert "rank 5: comms['pp'] holds ranks [4, 5] (2); its pp group is [5, 7]" in words
    assert "That is your tp group: a group over the wrong axis" in words


def test_another_axis_order_is_named_for_coordinates_and_groups():
    order = ("tp", "pp", "dp")  # tp outermost, dp innermost
    everyone = simulate(SIZES, lambda r: [(a, mistakes.group_in(order, SIZES, r, a)[0],
                                           mistakes.coords_in(order, SIZES, r)[a])
                                          for a in AXES])
    for r, rec in enumerate(everyone):
        rec["coords"] = mistakes.coords_in(order, SIZES, r)
    found = mistakes.findings(SIZES, 1, everyone)
    assert "in the order tp, pp, dp (outermost first; rank = (t·pp + p)·dp + d)" in found["coords"]
    assert "in the order tp, pp, dp" in found["members"]
    at_zero = mistakes.findings(SIZES, 0, everyone)  # rank 0's own coordinates are right
    assert "coords" not in at_zero and "in the order tp, pp, dp" in at_zero["members"]
    assert "an all-reduce over comms['dp'] summed" in found["allreduce"]


def test_a_communicator_not_made_by_split_is_not_reduced_over_and_says_so():
    everyone = simulate(SIZES, lambda r: right(SIZES, r))
    everyone[3]["reduced"]["dp"] = None
    words = mistakes.findings(SIZES, 3, everyone)["allreduce"]
    assert "comms['dp'] was not made by comm.Split on the communicator you were given" in words


def test_the_grid_drawing_shows_every_group_once():
    import matplotlib

    matplotlib.use("Agg")
    from minipar.viz import grid as vg

    layouts = [Layout(dp=2, pp=2, tp=2), Layout(dp=1, pp=2, tp=4), Layout(dp=2, cp=2, tp=2)]
    for lay in layouts:
        for a in AXES:
            gs = vg.groups(lay, a)
            assert sorted(r for g in gs for r in g) == list(range(8))
            assert all(len(g) == lay.size(a) and g == lay.ranks(g[0], a) for g in gs)
        assert len(set(vg.positions(lay).values())) == 8  # no two boxes on one spot
    assert vg.groups(layouts[0], "pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    fig = vg.grid_figure(layouts, me=5)
    titles = [ax.get_title() for ax in fig.axes]
    assert "rank 5: dp [1, 5], pp [5, 7], tp [4, 5]" in titles[0]
