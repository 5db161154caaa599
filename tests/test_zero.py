"""ZeRO stages 0-3 reproduce the serial run and hold / send what the paper says.

Serial computation reproduced: ``minipar.train.train`` (AdamW on the global
batch), via ``minipar.parallel.common.serial_reference``.  Formulas
(Rajbhandari et al. 2019, arXiv 1910.02054; ``minipar.plan.zero``), mixed
precision, K = 12, per rank: model states (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N,
(2+2+K)Ψ/N; bytes sent per step 2Ψ(N-1)/N (stages 0-2) and 3Ψ(N-1)/N
(stage 3) 16-bit elements, with stage 0 on the ring (``allreduce="ring"``, the
paper's figure); the default ``allreduce="auto"`` makes stage 0 send exactly
``allreduce_bytes_sent(Ψ, itemsize, N, r, "auto")`` (recursive doubling for
these small models) and still equal the serial run.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minipar import launch
from minipar.collectives import choose_allreduce, chunk_counts
from minipar.collectives.auto import ring_threshold
from minipar.collectives.cost import allreduce_bytes_sent, ring_allreduce_bytes_sent
from minipar.parallel.common import RunSpec
from minipar.parallel.zero.engine import ALLREDUCE_CHOICES, check_allreduce, check_stage
from minipar.parallel.zero.measure import (
    allreduce_note,
    exact_bytes_sent,
    formulas,
    prefetch_peak_elements,
)
from minipar.parallel.zero.shard import layout_of, shard_range, unit_table
from minipar.plan.zero import zero_comm_bytes_per_rank, zero_model_state_bytes

SCRIPT = str(Path(__file__).parent / "mpi" / "zero_check.py")
WORLDS = (1, 2, 3, 4)
K = 12
#: tracemalloc sees Python objects too, not only the arrays' data: the engine, its
#: ModelStates and optimizer, ~10 array headers, the communicator's counters (measured
#: 1.8-5.4 KB above the ledger, independent of Ψ); a stray full gradient buffer of
#: stage 2 (2Ψ(N-1)/N >= 52 KB here) or gathered parameters of stage 3 would not fit
OBJECT_BYTES = 8192


@functools.cache
def one_rank() -> object:
    """MPI.COMM_SELF as a grid of one data-parallel rank."""
    from mpi4py import MPI

    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid

    return Grid(TracedComm(MPI.COMM_SELF), dp=1)


@functools.cache
def zero_check(n: int) -> dict:
    """One launch per world size: every stage's parity, memory and bytes."""
    proc = launch.run(n, SCRIPT, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ZERO_CHECK "))
    return json.loads(line[len("ZERO_CHECK "):])


# ------------------------------------------------------------------ in-process
def test_bad_stage_is_a_clear_error() -> None:
    for bad in (-1, 4, 1.5, "2", True):
        with pytest.raises(ValueError, match="ZeRO stage must be an integer from 0 to 3 .0: plain DP"):
            check_stage(bad)


def test_allreduce_choice_is_checked_and_the_launcher_copies_agree() -> None:
    from minipar.parallel.zero.engine import ZeRO
    from minipar.run import zero as run_zero

    assert run_zero.ALLREDUCE_CHOICES == ALLREDUCE_CHOICES
    assert [check_allreduce(a) for a in ALLREDUCE_CHOICES] == list(ALLREDUCE_CHOICES)
    spec = RunSpec()
    for bad in ("mpi", "naive", "", None):
        with pytest.raises(ValueError, match="ZeRO's all-reduce must be one of auto, ring"):
            ZeRO(one_rank(), spec, stage=0, allreduce=bad)
    eng = ZeRO(one_rank(), spec, stage=0)
    assert eng.allreduce == "auto" and eng.grad_allreduce() == "recursive_doubling"
    assert ZeRO(one_rank(), spec, stage=1, allreduce="tree").grad_allreduce() is None


def test_options_are_refused_in_one_line_before_any_message() -> None:
    """strategies.build("zero", ...): an unknown option, a bad stage, offload target or
    remat interval, no grid: ValueError (a grid with other axes and a batch smaller than
    the ranks: tests/mpi/zero_check.py)."""
    from minipar.parallel import strategies

    spec = RunSpec()
    for options, words in (({"stages": 2}, "ZeRO takes no option stages; its options: "),
                           ({"stage": 4}, "ZeRO stage must be an integer from 0 to 3"),
                           ({"offload": "gpu"}, "ZeRO's offload must be one of host, disk"),
                           ({"offload_optimizer": "nvme"}, "offload_optimizer must be one of"),
                           ({"offload_dir": "/tmp"}, "needs offload or offload_optimizer 'disk'"),
                           ({"remat": 9}, "remat must be an integer from 0 to 4")):
        with pytest.raises(ValueError, match=re.escape(words)):
            strategies.build("zero", spec, one_rank(), **options)
    with pytest.raises(ValueError, match="ZeRO needs a grid"):
        strategies.build("zero", spec, None)


def test_exact_bytes_and_the_stage_0_note() -> None:
    """exact_bytes_sent: the ring's (2Ψ - C_r - C_{r+1}) b and (3Ψ - C_r - 2C_{r+1}) b for
    stages 1-3, the all-reduce that ran for stage 0; the note says which and why."""
    psi, n = 7043, 3
    c = chunk_counts(psi, n)
    for r in range(n):
        nxt = c[(r + 1) % n]
        assert exact_bytes_sent(psi, n, r, 1, 2) == (2 * psi - c[r] - nxt) * 2
        assert exact_bytes_sent(psi, n, r, 3, 2) == (3 * psi - c[r] - 2 * nxt) * 2
        assert exact_bytes_sent(psi, n, r, 0, 2, "ring") == ring_allreduce_bytes_sent(psi, 2, n, r)
        assert exact_bytes_sent(psi, n, r, 0, 8) == allreduce_bytes_sent(psi, 8, n, r, "auto")
        assert (exact_bytes_sent(psi, n, r, 2, 2, found_inf=True)
                == exact_bytes_sent(psi, n, r, 2, 2) + allreduce_bytes_sent(1, 8, n, r))
    assert exact_bytes_sent(psi, 1, 0, 0, 8) == exact_bytes_sent(psi, 1, 0, 3, 8) == 0
    edge = int(ring_threshold(2))  # where the committed constants put the ring ahead on 2 ranks
    assert allreduce_note(5000, 2, 8) == (
        f"stage 0's all-reduce: recursive doubling: S = 40,000 B is below {edge:,} B, the size "
        "from which the alpha-beta-gamma model has the ring faster on 2 ranks; the paper's "
        "figure is the ring's: --allreduce ring")
    assert allreduce_note(2 << 20, 4, 4).startswith("stage 0's all-reduce: ring: S = 8,388,608 B")
    assert allreduce_note(2 << 20, 2, 4).endswith(
        "faster on 2 ranks; the paper's figure is the ring's")

    assert "ring (--allreduce ring); the paper's figure is the ring's" in allreduce_note(9, 3, 8,
                                                                                         "ring")
    assert "binomial tree (--allreduce tree)" in allreduce_note(9, 3, 8, "tree")
    assert formulas(psi, n, 0, "float64")["allreduce_note"].startswith("stage 0's all-reduce")
    assert formulas(psi, n, 1, "float64")["allreduce_note"] is None


def test_stage_0_note_when_the_model_never_picks_the_ring(monkeypatch):
    import minipar.collectives.auto as auto

    monkeypatch.setattr(auto, "ring_threshold", lambda n: float("inf"))  # (constants where
    assert allreduce_note(2 << 20, 2, 4) == (                           # γ adds nothing)
        "stage 0's all-reduce: recursive doubling: the alpha-beta-gamma model never has the "
        "ring faster on 2 ranks, S = 8,388,608 B; the paper's figure is the ring's: "
        "--allreduce ring")


def test_shards_follow_array_split_and_refuse_more_ranks_than_parameters() -> None:
    for psi, n in ((10, 3), (7040, 4), (5, 5)):
        ranges = [shard_range(psi, n, r) for r in range(n)]
        assert [hi - lo for lo, hi in ranges] == chunk_counts(psi, n)
        assert ranges[0][0] == 0 and ranges[-1][1] == psi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    with pytest.raises(ValueError, match="4 ranks but only 3 parameters"):
        shard_range(3, 4, 0)


def test_units_tile_the_flat_buffer() -> None:
    cfg = RunSpec(experts=4, top_k=2).config()
    table, layout = unit_table(cfg), layout_of(cfg)
    assert [u.name for u, *_ in table] == ["embed", "block 0", "block 1", "head"]
    assert table[0][1] == 0 and table[-1][2] == layout.size
    assert all(a[2] == b[1] for a, b in itertools.pairwise(table))
    for u, lo, hi, lay in table:
        assert lay.size == hi - lo and list(lay.names) == list(u.names)
        assert layout.span(u.full_names[0])[0] == lo and layout.span(u.full_names[-1])[1] == hi
    assert table[1][0].prefix == "blocks.0." and "moe.router" in table[1][3].names


@pytest.mark.parametrize("precision", ["float64", "mixed", "mixed-fp16"])
def test_one_rank_every_stage_is_the_serial_run_bit_for_bit(precision: str) -> None:
    """On one rank the unit-by-unit forward/backward is GPT.loss_and_grads exactly, in
    every precision (mixed-fp16: loss scaling, skipped overflow steps included)."""
    from minipar.parallel.common import serial_reference
    from minipar.parallel.zero.engine import ZeRO

    spec = RunSpec(steps=2, precision=precision)
    ref = serial_reference(spec)
    for stage in range(4):
        eng = ZeRO(one_rank(), spec, stage=stage)
        losses = [eng.step(spec.batch_at(s)).loss for s in range(spec.steps)]
        assert losses == ref["losses"], stage
        assert eng.layout.flatten(eng.full_params()).tobytes() == ref["params"].tobytes(), stage
        if precision == "mixed-fp16":
            assert eng.states.scaler.scale == ref["states"].scaler.scale
            assert eng.states.scaler.skipped == ref["states"].scaler.skipped


# ------------------------------------------------------------------ N ranks
@pytest.mark.parametrize("n", WORLDS)
def test_parity_with_the_serial_run(n: int) -> None:
    res = zero_check(n)["parity"]
    for stage in "0123":
        r = res[stage]
        assert r["ok"], f"ZeRO-{stage} on {n} ranks differs from serial: {r}"
        assert r["max_param_diff"] < 1e-12 and r["max_loss_diff"] < 1e-12


@pytest.mark.parametrize("n", WORLDS)
def test_prefetching_equals_blocking_with_its_bytes_and_its_memory_formula(n: int) -> None:
    """ZeRO-3 with the next K units' all-gathers posted ahead and the reduce-scatters
    non-blocking: the serial run's result, bit for bit the blocking ZeRO-3's; every rank
    sends the blocking form's bytes (one all-gather fewer without resharding after
    forward); the most it holds gathered (in flight included) is the formula's; nothing
    gathered, in flight or pending after the steps."""
    res = zero_check(n)["prefetch"]
    assert sorted(res) == ["0,False", "1,False", "1,True", "2,False", "2,True", "2,True,remat"]
    for case, r in res.items():
        assert r["ok"] and r["as_blocking"], f"prefetch {case} on {n} ranks: {r}"
        assert r["max_param_diff"] < 1e-12
        if case.endswith("remat"):  # recomputed units gathered again: more than the formula
            assert all(row["bytes_sent_per_step"] > row["bytes_exact_per_step"]
                       for row in r["ranks"]) or n == 1
            assert all((row["inflight"], row["pending"]) == (0, 0) for row in r["ranks"])
            continue
        for row in r["ranks"]:
            assert row["bytes_sent_per_step"] == row["bytes_exact_per_step"], (case, row)
            if case.endswith("True"):
                assert row["bytes_exact_per_step"] == row["blocking_exact"]
            elif n > 1:
                assert row["bytes_exact_per_step"] < row["blocking_exact"]
            assert row["peak_gathered_bytes"] == row["peak_gathered_formula_bytes"], (case, row)
            assert (row["gathered_after_steps"], row["inflight"], row["pending"]) == (0, 0, 0)


def test_the_prefetch_peak_formula() -> None:
    sizes = [5, 10, 10, 3]  # walk: 5 10 10 3 3 10 10 5
    assert prefetch_peak_elements(sizes, 0) == 10  # blocking: the largest unit
    assert prefetch_peak_elements(sizes, 1) == 20
    assert prefetch_peak_elements(sizes, 2) == 25  # 5 10 10, or 10 10 5
    assert prefetch_peak_elements(sizes, 9) == 56  # everything posted at once
    assert prefetch_peak_elements(sizes, 1, reshard=False) == 28 == sum(sizes)


def test_prefetch_is_stage_3s_and_not_negative() -> None:
    from minipar.parallel.zero.engine import ZeRO

    spec = RunSpec()
    with pytest.raises(ValueError, match="prefetch must be an integer >= 0, got -1"):
        ZeRO(one_rank(), spec, stage=3, prefetch=-1)
    for options in ({"prefetch": 1}, {"reshard_after_forward": False}):
        with pytest.raises(ValueError, match="stage 3's .* got stage 2: use stage 3"):
            ZeRO(one_rank(), spec, stage=2, **options)


@pytest.mark.parametrize("n", WORLDS)
def test_parity_on_a_mixture_of_experts(n: int) -> None:
    """4 experts, top-2, tokens dropped at capacity: stages 1-3 run the MoE blocks through
    the same executor (aux loss and daux included) and equal the serial run that routes
    the same groups (each rank's rows: ``serial_reference(spec, N)``)."""
    res = zero_check(n)["moe_parity"]
    assert sorted(res) == ["1", "2", "3"]
    for stage, r in res.items():
        assert r["ok"], f"MoE ZeRO-{stage} on {n} ranks differs from serial: {r}"
        assert r["max_param_diff"] < 1e-12 and r["max_loss_diff"] < 1e-12


@pytest.mark.parametrize("n", WORLDS)
def test_parity_with_grouped_query_attention(n: int) -> None:
    """4 query heads sharing 1 key/value head (--kv-heads 1): plain data parallelism (stage
    0) and stages 1 and 3 equal the serial run of the same model."""
    res = zero_check(n)["gqa_parity"]
    assert sorted(res) == ["0", "1", "3"]
    for stage, r in res.items():
        assert r["ok"], f"GQA ZeRO-{stage} on {n} ranks differs from serial: {r}"
        assert r["max_param_diff"] < 1e-12 and r["max_loss_diff"] < 1e-12


@pytest.mark.parametrize("n", WORLDS)
def test_stage3_frees_the_parameters_it_gathers(n: int) -> None:
    """Stage 3 holds one unit's gathered parameters at a time (the largest unit, 16-bit),
    none after a step; stages 0-2 never gather.  tracemalloc agrees (held_after_steps in
    test_model_state_memory_matches_the_paper): nothing gathered stays allocated."""
    for stage, rows in zero_check(n)["memory"].items():
        for row in rows:
            assert row["gathered_after_steps"] == 0
            biggest = 2 * max(row["unit_sizes"])
            assert row["peak_gathered_bytes"] == (biggest if stage == "3" else 0), stage
            if stage == "3":  # far below gathering the whole model (the sum of all units)
                assert row["peak_gathered_bytes"] < 2 * row["psi"] / 2


def expected_categories(psi: int, n: int, stage: int, c: int) -> dict[str, int]:
    """Bytes by category, exactly: c = this rank's shard (C_r elements)."""
    return {"params": 2 * (c if stage == 3 else psi), "grads": 2 * (c if stage >= 2 else psi),
            "optimizer states": K * (c if stage >= 1 else psi), "activations": 0}


@pytest.mark.parametrize("n", WORLDS)
def test_model_state_memory_matches_the_paper(n: int) -> None:
    """Ledger: exact per category; total and tracemalloc within 2% + constants of the formula.

    Constants: uneven shards (C_r - Ψ/N < 1 element, x 16 bytes) and, for
    tracemalloc, the engine's Python objects (OBJECT_BYTES).  Stage 2's
    gradients are only the shard (a full buffer would be 2Ψ(N-1)/N more)."""
    for stage, rows in zero_check(n)["memory"].items():
        stage = int(stage)
        for r, row in enumerate(rows):
            psi, (lo, hi) = row["psi"], row["shard"]
            formula = zero_model_state_bytes(psi, n, stage, K)
            held = sum(row["ledger"].values())
            where = f"ZeRO-{stage}, rank {r} of {n}, Ψ={psi}"
            assert row["ledger"] == expected_categories(psi, n, stage, hi - lo), where
            assert abs(held - formula) <= 0.02 * formula + 16, where
            assert held <= row["tracemalloc_bytes"] <= held + OBJECT_BYTES, where
            # after a step nothing more is held: no full gradient buffer (stage 2), no
            # gathered parameters (stage 3), no leftover reduce-scatter/all-gather results
            assert held <= row["held_after_steps_bytes"] <= held + OBJECT_BYTES, where
            assert abs(row["tracemalloc_bytes"] - formula) <= 0.02 * formula + 16 + OBJECT_BYTES


@pytest.mark.parametrize("n", WORLDS)
def test_bytes_sent_per_step_match_the_paper(n: int) -> None:
    """16-bit elements: exactly (2Ψ - C_r - C_{r+1})·2 for stages 0-2 and
    (3Ψ - C_r - 2C_{r+1})·2 for stage 3; the paper's 2Ψ(N-1)/N, 3Ψ(N-1)/N x 2
    bytes within the uneven shards' rounding (< 3 elements)."""
    for stage, rows in zero_check(n)["memory"].items():
        stage = int(stage)
        psi = rows[0]["psi"]
        c = [hi - lo for lo, hi in (row["shard"] for row in rows)]
        for r, row in enumerate(rows):
            nxt = c[(r + 1) % n]
            exact = 0 if n == 1 else (3 * psi - c[r] - 2 * nxt if stage == 3
                                      else 2 * psi - c[r] - nxt) * 2
            assert row["bytes_sent_per_step"] == exact == row["bytes_exact_per_step"], (stage, r)
            assert row["grad_allreduce"] == ("ring" if stage == 0 else None)
            paper = zero_comm_bytes_per_rank(psi, n, stage, 2)
            assert abs(row["bytes_sent_per_step"] - paper) < 3 * 2, (stage, r)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_default_auto_stage_0_sends_the_auto_bytes_and_equals_serial(n: int) -> None:
    """ZeRO's default all-reduce is auto: stage 0's Ψ = 7,040 float64 gradients (56 KB)
    go by what the α–β–γ model picks for 56 KB on N ranks, exactly
    allreduce_bytes_sent(Ψ, 8, N, r, "auto") per rank per step: with the committed
    constants recursive doubling on 2 and 4 ranks (2: S each; 4: log2 4 = 2 rounds, 2S)
    and the ring on 3 (from ~52 KB there), and the run equals the serial one."""
    res = zero_check(n)
    assert res["parity"]["0"]["ok"], res["parity"]["0"]
    S = res["auto"][0]["psi"] * res["auto"][0]["itemsize"]
    chosen = choose_allreduce(S, n)
    assert chosen == ("ring" if S >= ring_threshold(n) else "recursive_doubling")
    for r, row in enumerate(res["auto"]):
        psi, b = row["psi"], row["itemsize"]
        assert row["grad_allreduce"] == chosen
        assert row["sent"] == row["exact"] == allreduce_bytes_sent(psi, b, n, r, chosen)
    if chosen == "recursive_doubling":  # on 3 ranks rank 1 absorbs the folded rank 0: 2S
        assert [row["sent"] for row in res["auto"]] == {2: [S, S], 3: [S, 2 * S, S],
                                                        4: [2 * S] * 4}[n]


def test_run_verb_end_to_end() -> None:
    """`minipar run zero --stage 3 -n 3 --precision mixed`: summary with formulas."""
    out = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "zero", "--stage", "3",
                          "-n", "3", "--steps", "2", "--json", "--precision", "mixed",
                          "--timeout", "60"],
                         capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout[out.stdout.index("{"):])
    assert s["strategy"] == "zero" and s["stage"] == 3 and s["ranks"] == 3
    assert len(s["losses"]) == len(s["serial_losses"]) == 2
    # mixed precision: bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%) and
    # the ranks sum 16-bit gradients in another order than the serial run, so the
    # losses agree to bf16 accuracy only; float64 parity (tight) is tested above
    np.testing.assert_allclose(s["losses"], s["serial_losses"], rtol=2e-2)
    assert s["verdict"]["status"] == "not comparable" and "16-bit" in s["verdict"]["reason"]
    assert s["parity_expected"] is False and out.returncode == 0
    f = s["model_state_formula"]
    assert f == zero_model_state_bytes(s["psi"], 3, 3, K)
    assert all(abs(b - f) <= 0.02 * f + 16 for b in s["model_state_bytes_per_rank"])
    assert all(abs(b - s["bytes_formula"]) < 6 for b in s["bytes_sent_per_rank"])


def test_run_verb_float64_parity_and_bad_stage() -> None:
    ok = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "zero", "--stage", "2",
                         "-n", "2", "--steps", "2", "--timeout", "60"],
                        capture_output=True, text=True, timeout=90, check=False)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "equal to the serial run" in ok.stdout and "formula" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "zero", "--stage", "4",
                          "-n", "2", "--timeout", "60"],
                         capture_output=True, text=True, timeout=90, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr  # refused before MPI starts
    assert "--stage" in bad.stderr and "0 to 3" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "zero", "--allreduce",
                          "mpi", "--timeout", "60"],
                         capture_output=True, text=True, timeout=90, check=False)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "--allreduce" in lines[0]
    assert "recursive_doubling" in lines[0] and "Traceback" not in bad.stderr


def test_run_verb_zeropp_json_bit_for_bit_and_its_bytes() -> None:
    """`minipar run zero --stage 3 -n 2 --node 1 --zeropp qwz,hpz,qgz --json` (two nodes of
    one rank: qgZ's cross-node hop alone, hpZ holds whole units): the verdict is bit for bit
    against the serial ZeRO++ arithmetic (``parity`` true), the distance from the
    unquantized serial run is a number, and ``zeropp`` gives each rank's bytes (measured
    = exact, all / inside / across nodes) beside ZeRO-3's and the formulas."""
    out = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "zero", "--stage", "3",
                          "-n", "2", "--node", "1", "--zeropp", "qwz,hpz,qgz", "--prefetch", "1",
                          "--steps", "2", "--json", "--timeout", "60"],
                         capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout[out.stdout.index("{"):])
    assert s["parity"] is True and s["parity_expected"] is True
    assert s["verdict"]["line"].startswith("final parameters: equal to the serial ZeRO++ "
                                           "arithmetic, bit for bit")
    assert s["from_serial"]["max_param_diff"] > 1e-6  # quantization trained another model
    z = s["zeropp"]
    assert z["parts"] == ["qwz", "hpz", "qgz"] and z["node"] == 1 and z["block"] == 256
    assert z["bytes_per_rank"] == z["bytes_exact_per_rank"] == s["bytes_sent_per_rank"]
    assert z["intra_per_rank"] == z["intra_exact_per_rank"] == [0, 0]  # nodes of one rank
    assert z["inter_per_rank"] == z["inter_exact_per_rank"]
    assert all(a < b / 2 for a, b in zip(z["bytes_per_rank"], z["zero3_bytes_exact_per_rank"]))
    assert z["hpz_held_per_rank"] == z["hpz_formula_per_rank"] == [8 * s["psi"]] * 2


@pytest.mark.parametrize("allreduce", ["auto", "ring", "tree"])
def test_run_verb_stage_0_reports_what_ran_and_the_paper(allreduce: str) -> None:
    """`minipar run zero --stage 0 -n 3 --allreduce A`: counted bytes = the exact figure of
    what ran, next to the paper's 2Ψ(N-1)/N x 8 (the ring's), and a note that says which."""
    out = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "zero", "--stage", "0",
                          "-n", "3", "--steps", "1", "--json", "--allreduce", allreduce,
                          "--timeout", "60"],
                         capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout[out.stdout.index("{"):])
    psi = s["psi"]
    assert s["verdict"]["status"] == "equal" and s["allreduce"] == allreduce
    ran = choose_allreduce(psi * 8, 3) if allreduce == "auto" else allreduce
    assert s["grad_allreduce"] == ran
    assert s["bytes_sent_per_rank"] == s["bytes_exact_per_rank"] == [
        allreduce_bytes_sent(psi, 8, 3, r, ran) for r in range(3)]
    assert s["bytes_formula"] == zero_comm_bytes_per_rank(psi, 3, 0, 8)
    note = next(x for x in s["notes"] if x.startswith("stage 0's all-reduce"))
    if allreduce == "auto" and ran == "recursive_doubling":
        edge = int(ring_threshold(3))
        assert f"recursive doubling: S = {psi * 8:,} B is below {edge:,} B" in note
        assert note.endswith("the paper's figure is the ring's: --allreduce ring")
    elif allreduce == "auto":
        assert f"ring: S = {psi * 8:,} B is at or above {int(ring_threshold(3)):,} B" in note
        assert note.endswith("the paper's figure is the ring's")
    else:
        assert f"(--allreduce {allreduce})" in note


def test_figures_draw_the_measured_bars_and_the_formulas() -> None:
    """minipar.viz.zero: each bar is the busiest rank's measurement, each tick the formula."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from minipar.viz import zero as vz

    mem = zero_check(2)["memory"]
    results = {2: {int(s): {"psi": rows[0]["psi"], "ranks": rows} for s, rows in mem.items()}}
    table = vz.rows(results)
    assert [r["stage"] for r in table] == [0, 1, 2, 3]
    fig = vz.memory_bars(results)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    heights = [p.get_height() * 1e3 for p in ax.patches]  # stacked: 3 categories per bar
    for i, r in enumerate(table):
        assert sum(heights[3 * i: 3 * i + 3]) == pytest.approx(r["ledger"])
    ticks = [seg[0][1] * 1e3 for coll in ax.collections for seg in coll.get_segments()]
    assert ticks == pytest.approx([r["formula"] for r in table])
    fig2 = vz.traffic_bars(results)
    sent = [p.get_height() * 1e3 for p in fig2.axes[0].patches]
    assert sent == pytest.approx([r["sent"] for r in table])


@pytest.mark.parametrize("n", [2, 4])
def test_another_axis_or_too_few_rows_is_refused_before_any_message(n: int) -> None:
    """ZeRO on a grid that is not dp = N, or on fewer rows than ranks: one line, on every
    rank, before the engine sends a byte."""
    refused = zero_check(n)["refused"]
    assert len(refused) == 2
    assert refused[0].startswith("ZeRO shards over data-parallel ranks only: the grid must "
                                 f"be dp = {n}")
    assert f"{n} data-parallel ranks but the global batch has only {n - 1} rows" in refused[1]
    assert all("\n" not in r for r in refused)


@pytest.mark.parametrize("n", WORLDS)
def test_fp16_overflow_skips_the_step_on_every_rank(n: int) -> None:
    """mixed-fp16: gradients overflow at a large loss scale; every rank skips the step and
    keeps its parameters, also a rank whose own shard is finite (on 4 ranks rank 1's is:
    the ranks agree on found_inf with a one-element all-reduce)."""
    for stage, rows in zero_check(n)["fp16_skip"].items():
        for r, (skipped, local_inf, unchanged) in enumerate(rows):
            assert skipped == 1 and unchanged, f"ZeRO-{stage}, rank {r} of {n} stepped"
        if n == 4:
            assert not all(local_inf for _, local_inf, _ in rows), stage


# ------------------------------------------------------------------ the zero1_step exercise
EX_WRONG = [
    # file, ranks, failing check (substring), message (substrings)
    ("zero_wrong_allreduce.py", 4, "bytes per rank = reduce-scatter + all-gather",
     ["= 2.25 x S", "3(N-1)/N x S: an all-reduce of the gradients"]),
    ("zero_wrong_state.py", 3, "keeps its optimizer-state shard between steps",
     ["step 1 was right, step 2 was not", "in place"]),
    ("zero_wrong_sum.py", 2, "result equals minipar.optim's serial AdamW step",
     ["8 of 8 cases wrong", "expected"]),
]


@pytest.mark.parametrize("n", [w for w in WORLDS if w > 1])  # one rank is refused
def test_zero1_step_reference_solution_passes(n: int) -> None:
    from minipar.exercises import get
    from minipar.exercises.grading import check

    report = check("zero1_step", get("zero1_step").solution_path, n, timeout=90)
    assert report.passed, report.text()
    assert all(c.ok for c in report.checks)
    assert any("bytes per rank" in c.name for c in report.checks)
    assert any("optimizer-state shard" in c.name for c in report.checks)


def test_zero1_step_skeleton_says_where_to_start() -> None:
    from minipar.exercises import get
    from minipar.exercises.grading import check

    report = check("zero1_step", get("zero1_step").skeleton_path, 2, timeout=60)
    (c,) = [c for c in report.checks if c.ok is False]
    assert c.detail.startswith("not implemented yet: start with the reduce-scatter")
    assert "skeleton.py:" in c.detail


@pytest.mark.parametrize("file, n, check_name, words", EX_WRONG, ids=[w[0] for w in EX_WRONG])
def test_zero1_step_wrong_solutions_are_caught(file: str, n: int, check_name: str,
                                               words: list[str]) -> None:
    from minipar.exercises.grading import check

    report = check("zero1_step", Path(__file__).parent / "mpi" / file, n, timeout=60)
    assert not report.passed
    failed = [c for c in report.checks if c.ok is False]
    hit = [c for c in failed if check_name in c.name]
    assert hit, report.text()
    for w in words:
        assert w in hit[0].detail, report.text()


# ------------------------------------------------------------------ ZeRO++
@pytest.mark.parametrize("n", WORLDS)
def test_zeropp_equals_its_serial_arithmetic_bit_for_bit(n: int) -> None:
    """Every ZeRO++ part alone, all three, all three with prefetch 2, all three with prefetch 1
    and remat (the first step's walk planned fetch by fetch, a recomputed unit fetched once
    more): the final parameters
    and every loss have the bits of the serial run that quantizes the same blocks of the
    same N shards and adds in the same order; the unquantized serial run is some distance
    away (quantization changes the training; a number, not a verdict); nothing left in
    flight."""
    res = zero_check(n)["zeropp"]
    assert sorted(res) == ["hpz", "qgz", "qwz", "qwz+hpz+qgz", "qwz+hpz+qgz,prefetch 1,remat 1",
                           "qwz+hpz+qgz,prefetch 2"]
    for case, r in res.items():
        assert r["bitwise"], (n, case, r)
        assert all(row["idle"] == [0, 0] for row in r["ranks"])
        if "qwz" in case or "qgz" in case and n > 1:  # (one rank: qgZ's hops send nothing)
            assert r["from_serial"] > 1e-6, (case, r["from_serial"])
        else:
            assert r["from_serial"] < 1e-12, (case, r["from_serial"])


@pytest.mark.parametrize("n", WORLDS)
def test_zeropp_bytes_equal_the_formulas_inside_and_across_nodes(n: int) -> None:
    """Bytes each rank sends per step, counted (all; to its own node; to other nodes by
    each peer's host) equal zeropp_exact_bytes, and ZeRO++ sends fewer than ZeRO-3."""
    for case, r in zero_check(n)["zeropp"].items():
        for row in r["ranks"]:
            ex = row["exact_split"]
            assert row["sent"] == row["exact"] == ex["total"], (n, case, row)
            assert (row["intra"], row["inter"]) == (ex["intra"], ex["inter"]), (n, case, row)
            if n > 1 and case != "hpz":
                assert ex["total"] < row["zero3"]["total"]
            if n == 4 and "qwz+hpz+qgz" in case:  # two nodes: the traffic across is cut
                assert ex["inter"] < row["zero3"]["inter"] / 4 or row["zero3"]["inter"] == 0


@pytest.mark.parametrize("n", WORLDS)
def test_hpz_holds_its_secondary_partition(n: int) -> None:
    """hpZ keeps every unit's slice of the node partition from its forward to its backward:
    at most Ψ/K elements (C'_k, array_split rule) x b bytes per rank, exactly."""
    for case, r in zero_check(n)["zeropp"].items():
        for row in r["ranks"]:
            want = row["secondary_formula"] if "hpz" in case else 0
            assert row["secondary"] == want, (n, case, row)


def test_zeropp_formulas_against_the_exact_figures() -> None:
    """The paper's volumes (zeropp_formula_bytes) equal the exact per-unit sums where every
    unit splits evenly and its blocks are whole; in the run's dtype (float64: b = 8)."""
    from minipar.parallel.zero.measure import zeropp_exact_bytes, zeropp_formula_bytes

    spans = [(0, 4096), (4096, 8192)]
    for n, k in ((4, 2), (2, 1), (2, 2), (4, 4), (4, 1)):
        for parts in ((), ("qwz",), ("hpz",), ("qgz",), ("qwz", "hpz", "qgz")):
            f = zeropp_formula_bytes(8192, n, k, parts, 64, 8)
            ex = [zeropp_exact_bytes(spans, n, k, r, parts, 64, 8)["total"] for r in range(n)]
            assert all(e == f["total"] for e in ex), (n, k, parts, f, ex)
    z3 = zeropp_formula_bytes(8192, 4, 2, (), 64, 8)
    zpp = zeropp_formula_bytes(8192, 4, 2, ("qwz", "hpz", "qgz"), 64, 8)
    assert z3["total"] == 3 * 8192 * 3 / 4 * 8  # ZeRO-3's 3Ψ(N-1)/N x b
    assert zpp["inter"] == 8192 * 3 / 4 * (1 + 8 / 64) + 8192 / 4 * (0.5 + 8 / 64)


def test_zeropp_options_are_refused_in_one_line() -> None:
    from minipar.parallel.zero.engine import PARTS, ZEROPP_BLOCK, ZeRO
    from minipar.run import zero as run_zero

    assert (run_zero.ZEROPP_PARTS, run_zero.ZEROPP_BLOCK) == (PARTS, ZEROPP_BLOCK)
    spec = RunSpec()
    for options, words in (({"stage": 2, "zeropp": "qwz"}, "ZeRO-3's"),
                           ({"stage": 3, "zeropp": "qwz,fast"}, "qwz, hpz, qgz"),
                           ({"stage": 3, "zeropp": "qwz", "zeropp_block": 0}, "--zeropp-block"),
                           ({"stage": 3, "zeropp": "hpz", "reshard_after_forward": False},
                            "--no-reshard-after-forward")):
        with pytest.raises(ValueError, match=words):
            ZeRO(one_rank(), spec, **options)


def test_zeropp_parts_twice_or_empty_and_nodes_that_do_nothing_are_said() -> None:
    """``--zeropp qwz,qwz`` and ``qwz,``: one line naming the option; one node of every
    rank, or nodes of one rank: the summary says what hpZ/qgZ then do."""
    from minipar.run import zero as run_zero

    for text in ("qwz,qwz", "qwz,", ",hpz"):
        with pytest.raises(ValueError, match="--zeropp") as e:
            run_zero.zeropp_parts(text)
        assert len(str(e.value).splitlines()) == 1
    assert run_zero.zeropp_parts(" qgz , qwz") == ("qwz", "qgz")
    assert "set --node 2" in run_zero.zeropp_node_note(("hpz",), 4, 4, "ranks")
    assert "-n 4 --node 2" in run_zero.zeropp_node_note(("qgz",), 2, 2, "ranks")
    assert "whole replica" in run_zero.zeropp_node_note(("qwz", "hpz"), 4, 1, "ranks")
    assert run_zero.zeropp_node_note(("qwz",), 4, 4, "ranks") is None
    assert run_zero.zeropp_node_note(("hpz",), 4, 2, "ranks") is None
