"""Hybrid (3D/4D) parallelism: parity on every 8-rank grid, bytes per axis, memory per rank.

Each world size is ONE launch of tests/mpi/hybrid_check.py, which rebuilds the Grid on
the same ranks for every layout (and frees it): on 8 ranks every dp x pp x tp of 8 the
model allows (heads 8, vocab 8, 4 layers; pp = 8 on 8 layers), ZeRO-1, -2, -3 and
sequence parallelism on 2x2x2, ZeRO-3 on 4x2x1, SP on 1x2x4 with GPipe, dp x pp x cp
= 2x2x2, and context parallelism with tensor parallelism, dp x pp x cp x tp = 1x2x2x2
(ring zigzag) and 2x1x2x2 (Ulysses on each tp rank's heads); on 4 ranks ring and
Ulysses context parallelism, interleaving with
remat, ring and Ulysses attention with remat (a recomputed block sends its forward
traffic again), GPipe with activations offloaded to the host, ZeRO-1 (with and without
cp), ZeRO-2 on 2x2x1, ZeRO-3 on 2x2x1 (GPipe, remat: a recomputed unit is gathered again)
and over dp·cp (1x2 x cp 2), an MoE GPT with ep = 2 (dp 2 x pp 2, dp 4), an
MoE under tp and one under ZeRO-3 (dp 2 x pp 2).  ZeRO's model states per rank equal its formula on the stage's share.  Each run: float64 parity with the serial GPT over 3 AdamW steps (the shared
verdict), bytes per axis equal to the exact formulas and to the planner's
(``minipar.plan.step_time.axis_traffic``, where it models the same traffic), parameters
per rank equal to ``stage_param_count``, model states within 5% of ``layout_memory``
(exact but for ZeRO's uneven shard), model states + activations within 5% (1F1B, cp
included), and bad layouts refused on every rank before any message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minipar import launch, run
from minipar.parallel.common import RunSpec
from minipar.parallel.hybrid.layout import check_hybrid
from minipar.parallel.hybrid.measure import bytes_formula

MPI_DIR = Path(__file__).parent / "mpi"


@pytest.mark.parametrize(("n", "runs"), [(4, 31), (8, 28)])
def test_parity_bytes_and_memory_on_every_grid(n: int, runs: int) -> None:
    proc = launch.run(n, str(MPI_DIR / "hybrid_check.py"), timeout=300,
                      env={"MINIPAR_WATCHDOG_S": "120"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("HYBRID-SUMMARY")]
    assert line, proc.stdout
    fields = dict(kv.split("=") for kv in line[0].split()[1:])
    assert fields["N"] == str(n) and fields["failures"] == "0"
    assert int(fields["runs"]) == runs
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("HYBRID-REFUSED")]
    assert len(refused) == 5


@pytest.mark.parametrize(("sizes", "says"), [
    ({"dp": 3, "pp": 2, "tp": 2}, "dp·pp·cp·tp = 3·2·1·2 = 12 must equal the number of ranks, 8"),
    ({"dp": 2, "pp": 1, "tp": 4}, "heads = 2 is not divisible by the tensor-parallel size t = 4"),
    ({"dp": 1, "pp": 8, "tp": 1}, "8 stages but the model has only 2 layers"),
    ({"dp": 8, "ep": 8, "experts": 4}, "--ep 8 does not divide --experts 4"),
    ({"dp": 2, "pp": 4, "ep": 4, "experts": 4}, "ep = 4 must divide dp·cp = 2·1 = 2"),
    ({"dp": 2, "pp": 2, "tp": 2, "zero": 4},
     ("--zero must be an integer from 0 to 3 (the ZeRO stage, over the dp·cp ranks of each "
      "pipeline stage), got 4")),
    ({"dp": 2, "cp": 2, "tp": 2, "sequence_parallel": True}, "cp = 2 with sequence parallelism"),
    ({"dp": 1, "cp": 4, "tp": 2, "cp_kind": "ulysses", "heads": 4},
     "heads/t = 4/2 = 2 is not divisible by cp = 4"),
])
def test_bad_layouts_are_one_line_without_mpi(sizes: dict, says: str) -> None:
    sizes = dict(sizes)
    spec = RunSpec(experts=sizes.pop("experts", 0), heads=sizes.pop("heads", 2), batch=16)
    with pytest.raises(ValueError) as e:
        check_hybrid(8, spec, **sizes)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("argv", "says"), [
    (["-n", "8", "--dp", "3", "--tp", "2", "--pp", "2"], "must equal the number of ranks, 8"),
    (["-n", "8", "--tp", "8"], "heads = 4 is not divisible"),
    (["-n", "8", "--pp", "8"], "8 stages but the model has only 4 layers"),
    (["-n", "4", "--ep", "4", "--experts", "2", "--batch", "8"], "--ep 4 does not divide --experts 2"),
    (["-n", "4", "--ep", "3", "--experts", "3"], "ep = 3 must divide dp·cp"),
    (["-n", "4", "--ep", "2", "--experts", "2", "--zero", "3"], "--zero 3 with ep = 2"),
    (["-n", "8", "--cp", "2", "--tp", "2", "--sequence-parallel"],
     "cp = 2 with sequence parallelism"),
    (["-n", "4", "--pp", "2", "--zeropp", "qwz"], "--zeropp is ZeRO-3's"),
    (["-n", "4", "--pp", "2", "--zero", "3", "--zeropp", "qwx"], "unknown part 'qwx'"),
    (["-n", "4", "--pp", "2", "--zero", "3", "--zeropp-block", "64"], "add --zeropp PARTS"),
    (["-n", "4", "--pp", "2", "--zero", "3", "--zeropp", "hpz", "--no-reshard-after-forward"],
     "drop one of them"),
    (["-n", "6", "--dp", "3", "--pp", "2", "--zero", "3", "--zeropp", "hpz", "--node", "3"],
     "not in equal blocks of consecutive ranks"),
])
def test_the_command_refuses_bad_input_in_one_line(argv: list[str], says: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        run.options.parse(["hybrid", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("minipar run: ") and says in err


def test_formula_of_a_2x2x2_grid_by_hand() -> None:
    spec = RunSpec(batch=8, seq=8, d_model=16, layers=2, heads=2)
    from minipar.comm.topology import Layout

    lay = Layout(dp=2, pp=2, tp=2)
    f = bytes_formula(spec, lay, {"dp": 1, "pp": 0, "cp": 0, "tp": 1}, m=2, blocks=1, sends=1,
                      psi_stage=1000, itemsize=8)
    bsh = 2 * 8 * 16  # b_i = 2 rows per micro-batch
    assert f["tp"] == 2 * 4 * 1 * bsh * 8  # 4 all-reduces, 2(t-1)/t = 1, per micro-batch
    assert f["pp_p2p"] == 2 * bsh * 8  # one activation per micro-batch
    assert f["dp"] == 1000 * 8 and f["cp"] == f["edp"] == 0


def test_formula_of_cp_with_tp_by_hand() -> None:
    """cp 2 x tp 2: the blocks' all-reduces carry my s/cp tokens, the ring my h/t columns."""
    spec = RunSpec(batch=8, seq=8, d_model=16, layers=2, heads=2)
    from minipar.comm.topology import Layout

    lay = Layout(dp=1, pp=1, cp=2, tp=2)
    f = bytes_formula(spec, lay, {"dp": 0, "pp": 0, "cp": 1, "tp": 0}, m=2, blocks=2, sends=0,
                      psi_stage=1000, itemsize=8)
    e = 4 * 4 * 16 * 8  # b_i = 4 rows of s/cp = 4 tokens, h = 16, 8 bytes
    assert f["tp"] == 2 * 4 * 2 * e  # 2 micro-batches x 4 all-reduces x 2 blocks, 2(t-1)/t = 1
    # ring, per micro-batch and block: 2(P-1)·E/t forward, 2(P-1)·E/t + 2P·E/t backward
    assert f["cp"] == 2 * 2 * (2 * e // 2 + 2 * e // 2 + 4 * e // 2)
    assert f["edp"] == 1000 * 8 and f["dp"] == f["pp_p2p"] == 0


def test_the_glossary_command_runs_and_equals_the_serial_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["hybrid", "--dp", "2", "--tp", "2", "--pp", "2", "-n", "8", "--steps", "2",
                     "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["verdict"]["status"] == "equal" and (s["dp"], s["pp"], s["tp"]) == (2, 2, 2)
    for got, want, o in zip(s["bytes_by_axis_per_rank"], s["bytes_formula_by_axis_per_rank"],
                            s["tp_bytes_by_op_per_rank"]):
        assert o["tp_f"] + o["tp_g"] + o["pp_tp_gather"] == want["tp"] > 0
        assert got["pp_p2p"] == want["pp_p2p"] > 0
        assert got["dp"] == want["dp"]
    plan = s["plan_memory"]
    stage = [i for i, c in enumerate(s["coords_per_rank"]) if c["pp"] == plan["stage"]]
    for i in stage:
        held = s["model_state_bytes_per_rank"][i] + s["activation_peak_bytes_per_rank"][i]
        assert abs(held - plan["total"]) <= 0.05 * plan["total"]


def test_zeropp_in_the_hybrid_equals_its_serial_arithmetic_bit_for_bit(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--zero 3 --zeropp on dp 2 x pp 2 in one node: parity true against the serial ZeRO++
    arithmetic of the pipeline, ZeRO++'s bytes per rank = the exact formula."""
    assert run.main(["hybrid", "--dp", "2", "--pp", "2", "-n", "4", "--zero", "3", "--zeropp",
                     "qwz,hpz,qgz", "--node", "4", "--steps", "2", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["parity"] is True and s["verdict"]["status"] == "equal"
    assert "serial ZeRO++ arithmetic of the pipeline" in s["verdict"]["line"]
    z = s["zeropp"]
    assert z["parts"] == ["qwz", "hpz", "qgz"] and z["node"] == 2
    assert z["bytes_per_rank"] == z["bytes_exact_per_rank"]
    assert z["inter_per_rank"] == [0, 0, 0, 0]
    assert z["hpz_held_per_rank"] == z["hpz_formula_per_rank"]
    assert max(z["bytes_per_rank"]) < min(z["zero3_bytes_exact_per_rank"])
    assert s["from_serial"]["max_param_diff"] > 0
    # every bytes line counts hpZ's and qgZ's communicators: the dp axis is ZeRO++'s all
    assert [r["dp"] for r in s["bytes_by_axis_per_rank"]] == z["bytes_per_rank"]
    assert s["serial_losses"] == s["losses"] != s["unquantized_serial_losses"]
    assert any("one node holds all 2" in n for n in s["notes"])  # --node 4: K = every dp rank


def test_zeropp_runs_the_oracle_cannot_replay_say_why() -> None:
    """tp or cp, experts, other schedules, fp8: "not comparable", naming why (no bitwise
    oracle); dp x pp with one chunk of GPipe, 1F1B or ZB-H1/H2: none (bit for bit)."""
    from minipar.run import hybrid, zero

    assert hybrid.not_comparable({"zeropp": "qwz", "pp": 2}) is None
    assert hybrid.not_comparable({"zeropp": "qwz", "schedule": "zb-h1"}) is None
    assert "TP's and CP's sums" in hybrid.not_comparable({"zeropp": "qwz", "tp": 2})
    assert "TP's and CP's sums" in hybrid.not_comparable({"zeropp": "qwz", "cp": 2})
    assert "dense GPT" in hybrid.not_comparable({"zeropp": "qwz", "schedule": "dualpipe"})
    assert "fp8 with ZeRO++" in hybrid.not_comparable({"zeropp": "qwz", "precision": "fp8"})
    assert "fp8 with ZeRO++" in zero.not_comparable({"zeropp": "qwz", "precision": "fp8"})
    assert hybrid.not_comparable({"tp": 2}) is None
