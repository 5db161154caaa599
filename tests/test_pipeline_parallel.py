"""The pipeline executor over MPI: parity with the serial GPT, the bubble measured and rebuilt.

Each world size 1-4 is ONE launch of tests/mpi/pp_check.py, which trains every
schedule (naive, GPipe, 1F1B, interleaved with v = 2) for several m in 1..8,
even and ``balance`` splits, remat, a mixture of experts and a learner's
instruction list, each against the serial run (float64, the shared verdict
over 3 AdamW steps); on 4 ranks also dp 2 x pp 2.  It also checks one record
per instruction, the bytes on ``pp_p2p`` and bad input on every rank.

Without MPI: the rebuilt (dedicated-machine) bubble of equal costs is the
papers' formula exactly, waits in the wall-clock trace do not change it, the
timeline JSON round-trips, and the partition's checks name the numbers.
``minipar run pp``: every bad option is one line and exit 2 before MPI starts;
a 2x2 grid with interleaving, remat and ``--timeline`` equals the serial run.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import refused_before_mpi

from minipar import launch
from minipar.nn import GPTConfig, gpt_units
from minipar.parallel.pipeline.measure import (
    measured_bubble,
    read_timeline,
    rebuild,
    synced_bubble_fraction,
    write_timeline,
)
from minipar.parallel.pipeline.partition import check_pipeline, parse_balance, stage_units
from minipar.parallel.pipeline.schedule import schedules
from minipar.parallel.pipeline.simulate import Record, replay, uniform_cost
from minipar.plan.pipeline import bubble_formula

MPI_DIR = Path(__file__).parent / "mpi"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_parity_records_bytes_and_bad_input_on_n_ranks(n: int) -> None:
    proc = launch.run(n, str(MPI_DIR / "pp_check.py"), timeout=240,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PP-SUMMARY")]
    assert line, proc.stdout
    fields = dict(kv.split("=") for kv in line[0].split()[1:])
    assert fields["N"] == str(n) and fields["failures"] == "0"
    assert int(fields["runs"]) >= (13 if n < 4 else 20)


CASES = [("naive", p, m, 1) for p in (1, 2, 4) for m in (1, 3)] + \
    [(k, p, m, 1) for k in ("gpipe", "1f1b") for p in (1, 2, 3, 4) for m in (1, 2, 5, 8)] + \
    [("interleaved", p, m, v) for p in (1, 2, 4) for v in (2, 3) for m in (p, 2 * p, 4 * p)]


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_rebuilt_bubble_of_equal_costs_is_the_formula_exactly(kind: str, p: int, m: int,
                                                              v: int) -> None:
    records = replay(schedules(kind, p, m, v), uniform_cost(1, 2, v=v))
    b = measured_bubble(records, kind, p, m, v)
    f = bubble_formula(kind, p, m, v)
    assert isinstance(b["rebuilt"], Fraction | int)
    assert b["rebuilt"] == b["wall_clock"] == b["rebuilt_median"] == f["fraction"]
    assert b["rebuilt_ratio"] == f["ratio"]
    if kind != "naive":
        assert f["ratio"] == Fraction(p - 1, v * m)


def test_waits_in_the_wall_clock_do_not_change_the_rebuilt_timeline() -> None:
    # a shared machine: stage 1 starts 7 units late and every record after a wait is shifted
    p, m = 3, 6
    exact = replay(schedules("1f1b", p, m), uniform_cost(1, 2))
    late = [r._replace(start=r.start + 7 * (r.stage == 1) + r.micro_batch % 2 * (r.stage == 2)
                       if r.micro_batch is not None else r.start,
                       end=r.end + 7 * (r.stage == 1) + r.micro_batch % 2 * (r.stage == 2)
                       if r.micro_batch is not None else r.end) for r in exact]
    b = measured_bubble(late, "1f1b", p, m)
    # the late start moves stage 1 as a whole (its span is the same); the step's makespan grows
    assert synced_bubble_fraction(late) > b["rebuilt"] == Fraction(p - 1, m + p - 1)
    assert b["wall_clock"] == b["rebuilt"]  # no stage's own span grew longer than stage 0's
    assert b["rebuilt_synced"] == b["rebuilt"]  # 1F1B: stage 0 spans the whole step
    assert sorted(rebuild(late, "1f1b", p, m)) == sorted(exact)


def test_median_costs_remove_a_one_off_stall() -> None:
    # one backward on stage 0 took 10 units instead of 2 (the OS ran something else)
    recs = replay(schedules("1f1b", 2, 4), uniform_cost(1, 2))
    stalled = [r._replace(end=r.end + 8) if (r.stage, r.what, r.micro_batch) ==
               (0, "backward", 1) else r for r in recs]
    b = measured_bubble(stalled, "1f1b", 2, 4)
    assert b["rebuilt"] > b["rebuilt_median"] == Fraction(1, 5)


def test_unequal_stages_make_a_larger_bubble_than_the_formula() -> None:
    # the last stage twice as slow: the rebuilt bubble is the schedule's, not the formula's
    def cost(ins, stage):
        return uniform_cost(1, 2)(ins, stage) * (2 if stage == 1 else 1)
    recs = replay(schedules("gpipe", 2, 4), cost)
    assert measured_bubble(recs, "gpipe", 2, 4)["rebuilt"] > Fraction(1, 5)


def test_records_of_another_schedule_are_refused() -> None:
    recs = replay(schedules("gpipe", 2, 2), uniform_cost())
    with pytest.raises(ValueError, match="not of this schedule"):
        rebuild(recs, "gpipe", 2, 3)


def test_timeline_json_round_trips(tmp_path: Path) -> None:
    recs = replay(schedules("interleaved", 2, 2, 2), uniform_cost(1, 2, v=2))
    recs = [r._replace(start=float(r.start), end=float(r.end)) for r in recs]
    path = tmp_path / "t.json"
    write_timeline(path, recs, "interleaved", 2, 2, 2)
    doc = json.loads(path.read_text())
    assert doc["format"] == "minipar-pipeline-timeline" and doc["v"] == 2
    assert set(doc["records"][0]) == {"stage", "what", "micro_batch", "chunk", "start", "end"}
    back, meta = read_timeline(path)
    assert back == recs and meta == {"schedule": "interleaved", "p": 2, "m": 2, "v": 2,
                                     "unit": "s"}
    (tmp_path / "x.json").write_text("[]")
    with pytest.raises(ValueError, match="not a pipeline timeline"):
        read_timeline(tmp_path / "x.json")


def test_partition_even_balance_and_interleaved_chunks() -> None:
    units = gpt_units(GPTConfig(n_layer=6, d_model=8, n_head=2, vocab_size=5, block_size=4))
    names = [[u.name for u in c] for c in stage_units(units, [2, 2, 2], 0, 3)]
    assert names == [["embed", "block 0", "block 1"]]
    assert [[u.name for u in c] for c in stage_units(units, [1, 1, 4], 2, 3)] == \
        [["block 2", "block 3", "block 4", "block 5", "head"]]
    # p = 2, v = 3: rank 1 holds virtual stages 1, 3, 5 (chunk c = c·p + s)
    got = [[u.name for u in c] for c in stage_units(units, [1] * 6, 1, 2, 3)]
    assert got == [["block 1"], ["block 3"], ["block 5", "head"]]
    assert check_pipeline(5, 2, 4) == [3, 2] and parse_balance("2,3") == [2, 3]


@pytest.mark.parametrize("args,kw,words", [
    ((2, 3, 4), {}, "3 stages but the model has only 2 layers"),
    ((4, 2, 0), {}, "--micro-batches m must be a positive integer, got 0"),
    ((4, 2, 4), {"balance": [1, 2]}, "sums to 3 layers, but the model has 4"),
    ((4, 2, 4), {"balance": [4]}, "needs 2 whole numbers"),
    ((8, 2, 3), {"schedule": "interleaved", "v": 2}, "m=3 micro-batches is not a multiple of p=2"),
    ((6, 2, 4), {"schedule": "interleaved", "v": 2}, "6 layers divisible by p·v = 2·2 = 4"),
    ((4, 2, 4), {"remat": 0}, ("remat interval must be a positive integer (units per "
                               "checkpointed segment), got 0")),
    ((4, 2, 4), {"remat": 4}, ("remat interval 4 is more than the 3 units of stage 0 "
                               "(2 blocks + embedding): use 1..3")),
    ((8, 2, 4), {"schedule": "interleaved", "v": 2, "remat": 3},
     "more than the 2 units of virtual stage 1 (2 blocks)"),
    ((4, 2, 6), {"rows": 5}, "m=6 micro-batches but a data-parallel replica has only 5 rows"),
    ((4, 2, 2), {"v": 2}, "needs --schedule interleaved"),
])
def test_bad_input_names_the_numbers(args: tuple, kw: dict, words: str) -> None:
    with pytest.raises(ValueError) as e:
        check_pipeline(*args, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="integers separated by commas"):
        parse_balance("2;2")


def test_a_record_is_the_simulators() -> None:
    r = Record(0, "forward", 1, 0, 0.5, 1.0)
    assert r._fields == ("stage", "what", "micro_batch", "chunk", "start", "end")


# -- minipar run pp -------------------------------------------------------------------
BAD_RUN = [
    (["-n", "3", "--dp", "2"], ("--dp 2 does not divide -n 3: the pipeline replicas take equal "
                                "numbers of ranks; use -n a multiple of 2")),
    (["-n", "2", "--layers", "1"], "2 stages but the model has only 1 layer"),
    (["--micro-batches", "0"], "--micro-batches"),
    (["-n", "2", "--balance", "1,2"], "sums to 3 layers, but the model has 4"),
    (["-n", "2", "--balance", "a,b"], "--balance must be integers"),
    (["-n", "2", "--layers", "4", "--schedule", "interleaved", "--chunks", "2",
      "--micro-batches", "3"], "m=3 micro-batches is not a multiple of p=2"),
    (["-n", "2", "--layers", "6", "--schedule", "interleaved", "--chunks", "2",
      "--micro-batches", "2"], "divisible by p·v = 2·2 = 4"),
    (["-n", "2", "--chunks", "2"], "needs --schedule interleaved"),
    (["-n", "2", "--remat", "0"], "--remat"),
    (["-n", "4", "--remat", "2"], "remat interval 2 is more than the 1 unit of stage 1"),
    (["-n", "2", "--micro-batches", "11"], "m=11 micro-batches but a data-parallel replica"),
    (["-n", "4", "--dp", "2", "--experts", "2", "--batch", "10", "--micro-batches", "2"],
     "use a --batch divisible by --dp 2"),
    (["-n", "2", "--offload-dir", "/no/such/dir", "--offload", "disk"], "--offload-dir"),
]


@pytest.mark.parametrize("args,words", BAD_RUN, ids=[" ".join(a) for a, _ in BAD_RUN])
def test_run_pp_bad_option_is_one_line_exit_2(args: list[str], words: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from minipar import run

    with pytest.raises(SystemExit) as e:
        run.options.parse(["pp", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minipar run: ") and words in err[0], err


def test_run_pp_refuses_before_mpi_starts(tmp_path: Path) -> None:
    proc = refused_before_mpi(["run", "pp", "-n", "5"], tmp_path)
    assert "5 stages but the model has only 4 layers" in proc.stderr


def test_run_pp_json_on_a_2x2_grid_with_interleaving_remat_and_a_timeline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from minipar import run
    from minipar.parallel.pipeline.schedule import KINDS
    from minipar.run import pp as run_pp

    assert run_pp.SCHEDULES == KINDS  # the launcher's copy
    tl = tmp_path / "tl.json"
    rc = run.main(["pp", "-n", "4", "--dp", "2", "--schedule", "interleaved", "--chunks", "2",
                   "--micro-batches", "2", "--layers", "4", "--remat", "--steps", "2",
                   "--timeline", str(tl), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    s = json.loads(out)
    assert s["strategy"] == "pp" and s["verdict"]["status"] == "equal" and s["ranks"] == 4
    assert (s["stages"], s["dp"], s["micro_batches"], s["chunks"]) == (2, 2, 2, 2)
    assert s["bubble_formula"] == pytest.approx(1 / 5)  # r = (1/2)(1/2) = 1/4, r/(1+r)
    assert set(s["bubble_measured"]) == {"rebuilt", "rebuilt_median", "rebuilt_cpu",
                                         "wall_clock", "rebuilt_ratio", "wall_clock_ratio"}
    assert len(s["activation_peak_bytes_per_stage"]) == 2
    assert min(s["activation_peak_bytes_per_stage"]) > 0
    assert s["bytes_sent_per_rank"] == s["bytes_exact_per_rank"]
    assert all(a["dp"] > 0 for a in s["bytes_by_axis"])  # replicas all-reduce gradients
    records, meta = read_timeline(tl)
    assert meta["p"] == 2 and meta["v"] == 2
    b = measured_bubble(records, "interleaved", 2, 2, 2)
    assert b["rebuilt"] == pytest.approx(s["bubble_measured"]["rebuilt"])


def test_run_pp_with_offload_prints_the_verdict_and_the_bubble(
        capsys: pytest.CaptureFixture[str]) -> None:
    from minipar import run

    rc = run.main(["pp", "-n", "2", "--schedule", "gpipe", "--micro-batches", "3",
                   "--offload", "host", "--steps", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "final parameters: equal to the serial run" in out
    assert "bubble (last step): rebuilt from measured costs" in out
    assert "activation offload to host" in out


@pytest.mark.parametrize("target", ["host", "disk"])
def test_a_stage_under_offload_counts_only_what_stays_on_the_device(target: str) -> None:
    """StageMemory's ledger with offload: the bytes kept (anywhere) are no-offload's, the
    device holds one unit's ``saved`` at a time (plus the batch the micro-batches are
    views of), and nothing is left after the backwards; the gradients are the same."""
    import numpy as np

    from minipar.memory import nbytes
    from minipar.nn import Hooks, executor
    from minipar.parallel.common import RunSpec
    from minipar.parallel.pipeline.stage import StageMemory
    from minipar.precision import ModelStates

    spec = RunSpec(layers=4, batch=12, seq=8, d_model=16, heads=2, vocab=10)
    units, params = spec.model().units(), spec.initial_params()
    x = spec.global_batch(0)[0]
    chunk = stage_units(units, [2, 2], 0, 2)[0]  # embedding, block 0, block 1
    mbs = [x[:4], x[4:8], x[8:]]
    largest = max(nbytes(s) for s in executor.forward(chunk, Hooks(params), mbs[0])[1])
    got = {}
    for off in (None, target):
        mem = StageMemory([chunk], None, off)
        states = ModelStates("float64", {n: params[n] for u in chunk for n in u.full_names})
        mem.start_step(states)
        h, r = mem.hooks[0], mem.remat_hooks[0]  # r: the ledger, inside h (an Offload)
        held = [mem.measured(0, lambda b=b, h=h: executor.forward(chunk, h, b)) for b in mbs]
        after_forward = (r.bytes_now, r.device_now)
        for out, kept in reversed(held):
            dy = np.ones_like(out)
            mem.measured(0, lambda h=h, k=kept, dy=dy: executor.backward(chunk, h, k, dy, 1.0))
        got[off] = (after_forward, mem.activation_peak_bytes, (r.bytes_now, r.device_now),
                    states.grads.copy())
        mem.end_step()
    (kept0, dev0), peak0, end0, g0 = got[None]
    (kept1, dev1), peak1, end1, g1 = got[target]
    assert kept1 == kept0 == dev0 == peak0 and end0 == end1 == (0, 0)
    assert dev1 == x.nbytes  # the batch stays (the micro-batches are its views)
    assert peak1 == largest + x.nbytes < peak0 / 3
    np.testing.assert_array_equal(g1, g0)
