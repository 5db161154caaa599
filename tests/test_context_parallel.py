"""Context parallelism: the online-softmax merge, Ulysses and ring attention, ``minipar run cp``.

In-process (float64): merging attention over key blocks equals the full causal
softmax attention, in any block size and merge order, and the blocks'
backward sums to the full backward; the zigzag positions and their causal
work; the byte and activation formulas against the papers' figures in
:mod:`minipar.plan.activations` and against the serial model's ledger; on one
rank (``MPI.COMM_SELF``) tracemalloc's count of what an attention forward keeps
alive, against the ledger and the formula.

Multi-rank: each world size (2, 4) is ONE launch of tests/mpi/cp_check.py,
which checks parity with the serial GPT (outputs, loss, gradients, AdamW steps
by the shared verdict) for Ulysses and ring attention (contiguous and zigzag),
bytes counted against the exact formulas, the activation ledger and tracemalloc,
and bad input.
The command: a bad option is one line and exit 2 before MPI starts; a good run
prints the verdict and its JSON holds the measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import launch_checks, refused_before_mpi

from minipar import run
from minipar.nn.attention import attention_core_backward, attention_core_forward
from minipar.nn.blockwise_attention import (
    attention_block_backward,
    attention_block_forward,
    blockwise_attention,
    merge_attention,
)
from minipar.parallel.common import RunSpec
from minipar.parallel.context_parallel import options as cp_options
from minipar.parallel.context_parallel.layout import Sharding
from minipar.parallel.context_parallel.measure import (
    attention_activation_formula,
    attention_activation_tracemalloc,
    ring_backward_bytes,
    ring_forward_bytes,
    score_elements,
    serial_attention_activation,
    ulysses_bytes_per_rank,
)
from minipar.plan.activations import (
    ring_attention_bytes_per_rank,
    ulysses_alltoall_elements_per_link,
)


def _qkv(b: int = 2, h: int = 3, t: int = 12, dh: int = 4, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((b, h, t, dh)) * 2 for _ in range(4)]


@pytest.mark.parametrize("block", [1, 2, 5, 12, 20])
def test_merging_key_blocks_is_the_full_softmax(block: int) -> None:
    q, k, v, _ = _qkv()
    o_ref, _ = attention_core_forward(q, k, v)
    o, lse = blockwise_attention(q, k, v, block)
    np.testing.assert_allclose(o, o_ref, rtol=1e-13, atol=1e-14)
    s = np.einsum("bhid,bhjd->bhij", q, k) / 2.0  # sqrt(d_h) = 2
    s[..., np.triu_indices(12, 1)[0], np.triu_indices(12, 1)[1]] = -np.inf
    np.testing.assert_allclose(lse, np.logaddexp.reduce(s, axis=-1), rtol=1e-14)


def test_the_merge_is_order_free_and_ignores_empty_blocks() -> None:
    q, k, v, _ = _qkv(t=8, seed=1)
    parts = [attention_block_forward(q, k[:, :, j:j + 2], v[:, :, j:j + 2], 0, j)
             for j in range(0, 8, 2)]
    o_ref, _ = attention_core_forward(q, k, v)
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        o, lse = parts[order[0]]
        for i in order[1:]:
            o, lse = merge_attention(o, lse, *parts[i])
        np.testing.assert_allclose(o, o_ref, rtol=1e-13, atol=1e-14)
    # keys at positions 8, 9 are after every query: lse −inf, o 0, and merging them is a no-op
    o_empty, lse_empty = attention_block_forward(q, k[:, :, :2], v[:, :, :2], 0, 8)
    assert np.all(lse_empty == -np.inf) and np.all(o_empty == 0)
    o, lse = merge_attention(*parts[0], o_empty, lse_empty)
    assert np.array_equal(o, parts[0][0]) and np.array_equal(lse, parts[0][1])
    both, lse_both = merge_attention(o_empty, lse_empty, o_empty, lse_empty)
    assert not np.isnan(both).any() and np.all(lse_both == -np.inf)


def test_a_hand_computed_merge() -> None:
    """One query, keys with scores 0 and log 3 (d_h = 1, q = 1): weights 1/4 and 3/4."""
    q = np.ones((1, 1, 1, 1))
    k = np.array([0.0, np.log(3.0)]).reshape(1, 1, 2, 1)
    v = np.array([4.0, 8.0]).reshape(1, 1, 2, 1)
    oa, la = attention_block_forward(q, k[:, :, :1], v[:, :, :1], 1, 0)
    ob, lb = attention_block_forward(q, k[:, :, 1:], v[:, :, 1:], 1, 1)
    assert (oa.item(), la.item(), ob.item()) == (4.0, 0.0, 8.0)
    o, lse = merge_attention(oa, la, ob, lb)
    assert o.item() == pytest.approx(0.25 * 4 + 0.75 * 8, rel=1e-15)
    assert lse.item() == pytest.approx(np.log(4.0), rel=1e-15)


@pytest.mark.parametrize("qb,kb", [(12, 3), (4, 4), (3, 6)])
def test_block_backward_sums_to_the_full_backward(qb: int, kb: int) -> None:
    q, k, v, do = _qkv(seed=2)
    _, saved = attention_core_forward(q, k, v)
    dq_ref, dk_ref, dv_ref = attention_core_backward(saved, do)
    o, lse = blockwise_attention(q, k, v, kb)
    dq, dk, dv = (np.zeros_like(a) for a in (q, k, v))
    for i in range(0, 12, qb):
        for j in range(0, 12, kb):
            a, b, c = attention_block_backward(q[:, :, i:i + qb], k[:, :, j:j + kb],
                                               v[:, :, j:j + kb], o[:, :, i:i + qb],
                                               lse[:, :, i:i + qb], do[:, :, i:i + qb], i, j)
            dq[:, :, i:i + qb] += a
            dk[:, :, j:j + kb] += b
            dv[:, :, j:j + kb] += c
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_zigzag_positions_and_balanced_causal_work() -> None:
    lay = Sharding(16, 2, zigzag=True)
    assert lay.chunks(0) == [(0, 4), (12, 4)] and lay.chunks(1) == [(4, 4), (8, 4)]
    for P in (1, 2, 3, 4):
        for zz in (False, True):
            s = 2 * P * 3
            lay = Sharding(s, P, zz)
            allpos = np.concatenate([lay.positions(r) for r in range(P)])
            assert sorted(allpos.tolist()) == list(range(s))
            work = [score_elements(lay, r) for r in range(P)]
            if zz:
                assert work == [(2 * P + 1) * 9] * P
            else:
                assert work == [(r + 1) * (s // P) ** 2 for r in range(P)]
    with pytest.raises(ValueError, match=r"sequence length 12 is not divisible by 2·cp = 8"):
        Sharding(12, 4, True)
    with pytest.raises(ValueError, match=r"sequence length 10 is not divisible by cp = 4"):
        Sharding(10, 4, False)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_byte_formulas_match_the_papers(P: int) -> None:
    b, s, d, H = 3, 48, 24, 24
    assert ring_forward_bytes(b, s, d, P, 2) == ring_attention_bytes_per_rank(s, b, d, P, 2)
    assert ring_backward_bytes(b, s, d, P, 2, 4) == (0 if P == 1 else
                                                     2 * (P - 1) * b * s * d // P * 2
                                                     + 2 * P * b * s * d // P * 4)
    per_link = ulysses_alltoall_elements_per_link(b * s, d, P)  # 4Nh/P
    for r in range(P):
        want = per_link * (P - 1) / P * 2
        assert ulysses_bytes_per_rank(b, s, d, H, P, r, 2) == pytest.approx(want)


def test_activation_formulas_against_the_serial_ledger() -> None:
    spec = RunSpec(seq=16, d_model=16, heads=4, batch=3, layers=2)
    tokens, _ = spec.global_batch(0)
    want = attention_activation_formula("serial", 3, 16, 16, 4, 1, 8)
    assert serial_attention_activation(spec, tokens) == [want, want]
    assert want == (3 * 3 * 16 * 16 + 3 * 4 * 16 * 16) * 8
    for P in (2, 4):
        assert attention_activation_formula("ulysses", 3, 16, 16, 4, P, 8) * P == want
        assert attention_activation_formula("ring", 3, 16, 16, 4, P, 8) == (
            4 * 3 * 16 * 16 + 3 * 4 * 16) * 8 // P
    # a long sequence: the ring keeps O(s/P), Ulysses O(s²/P)
    ring = attention_activation_formula("ring", 1, 32768, 4096, 32, 8, 2, 4)
    uly = attention_activation_formula("ulysses", 1, 32768, 4096, 32, 8, 2, 4)
    assert uly / ring > 50
    with pytest.raises(ValueError,
                       match="kind must be one of serial, ulysses, ring, allgather, usp; got 'tp'"):
        attention_activation_formula("tp", 1, 2, 2, 1, 1, 8)


def test_tracemalloc_of_an_attention_forward_on_one_rank() -> None:
    """P = 1: what the core keeps alive is the serial layer's (Ulysses: q, k, v and the s²
    softmax) or q, k, v, o and lse (ring): tracemalloc >= the ledger = the formula, within
    2% at b 2, s 256, d 64, H 4 (the multi-rank cases are in tests/mpi/cp_check.py)."""
    from mpi4py import MPI

    from minipar.comm import TracedComm

    comm = TracedComm(MPI.COMM_SELF)
    dims = (2, 256, 64, 4)
    serial = attention_activation_formula("serial", *dims, 1, 8)
    got = {}
    for kind, zz in (("ulysses", False), ("ring", True), ("ring", False)):
        m = attention_activation_tracemalloc(comm, kind, zz, *dims)
        f = attention_activation_formula(kind, *dims, 1, 8)
        assert m["ledger"] == m["formula"] == f, m
        assert f <= m["tracemalloc"] <= 1.02 * f, (kind, zz, m)
        assert m["peak"] >= m["tracemalloc"]
        got[kind, zz] = m["tracemalloc"]
    assert attention_activation_formula("ulysses", *dims, 1, 8) == serial
    assert got["ring", True] * 4 < got["ulysses", False]  # the s² softmax is not kept
    m = attention_activation_tracemalloc(comm, "ring", True, *dims, dtype="float16")
    assert m["ledger"] == attention_activation_formula("ring", *dims, 1, 2, 4) == (
        (4 * 2 * 256 * 64) * 2 + 2 * 4 * 256 * 4)  # lse in float32
    assert m["ledger"] <= m["tracemalloc"] <= 1.02 * m["ledger"], m


@pytest.mark.parametrize("n", [2, 4])
def test_parity_bytes_and_memory_on_ranks(n: int) -> None:
    fields = launch_checks(n, "cp_check.py", "CP", timeout=240, watchdog_s=60)
    assert int(fields["checks"]) >= 130 * n


BAD = [
    (["cp", "-n", "3", "--seq", "8"], "2·cp = 6"),
    (["cp", "-n", "3", "--seq", "8", "--no-zigzag"], "cp = 3"),
    (["cp", "-n", "4", "--kind", "ulysses", "--heads", "2", "--seq", "8"], "--heads 2"),
    (["cp", "-n", "2", "--kind", "ulysses", "--zigzag"], "--no-zigzag"),
    (["cp", "--kind", "lasso"], "--kind"),
    (["cp", "-n", "2", "--experts", "2"], "--experts 2"),
    (["cp", "-n", "2", "--kind", "allgather", "--seq", "6"], "2·cp = 4"),
    (["cp", "-n", "2", "--kv-heads", "3", "--heads", "4"], "--kv-heads 3"),
    (["cp", "-n", "2", "--kind", "ulysses", "--heads", "6", "--d-model", "24",
      "--kv-heads", "3"], "--kv-heads 3 and cp = 2"),
    (["cp", "-n", "4", "--kind", "usp", "--ulysses", "3", "--ring", "2"], "must equal cp = 4"),
    (["cp", "-n", "8", "--kind", "usp", "--ulysses", "8", "--heads", "4", "--seq", "32"],
     "--heads 4 is not divisible by --ulysses 8"),
    (["cp", "-n", "4", "--kind", "usp", "--ulysses", "2", "--seq", "12"], "2·ring·ulysses = 8"),
    (["cp", "-n", "4", "--kind", "ring", "--ulysses", "2"], "use --kind usp"),
]


@pytest.mark.parametrize("args,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_cp_option_is_one_line_and_exit_2_before_mpi(args: list[str], words: str,
                                                           tmp_path: Path) -> None:
    line = refused_before_mpi(["run", *args], tmp_path).stderr.strip()
    assert line.startswith("minipar run: ") and words in line, line


def test_the_command_runs_both_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    from minipar.run import cp as run_cp

    assert run_cp.KINDS == cp_options.KINDS
    for args in (["--kind", "ulysses", "--heads", "2"],  # ring: per-tensor FP8, amax bytes exact
                 ["--kind", "ring", "--precision", "fp8", "--fp8-scaling", "tensor"],
                 ["--kind", "allgather", "--kv-heads", "1"]):
        rc = run.main(["cp", "-n", "2", "--steps", "2", "--seq", "8", "--json", *args])
        s = json.loads(capsys.readouterr().out)
        assert rc == 0 and s["verdict"]["status"] == "equal", s["verdict"]
        assert s["bytes_sent_per_rank"] == s["bytes_exact_per_rank"]
        assert (s["bytes_by_op_per_rank"][0].get("fp8_amax", 0)
                == (2 * 16 * 4 if "--precision" in args else 0))  # 16 one-FP32 rings a block
        assert s["activation_bytes_per_rank"] == [s["activation_formula"]] * 2
        assert s["activation_formula"] < s["serial_activation_bytes"]
        tm = s["activation_tracemalloc_bytes_per_rank"]
        assert all(a <= m <= a + 4096 for a, m in zip(s["activation_bytes_per_rank"], tm)), tm
        assert all(p >= m for p, m in zip(s["activation_peak_bytes_per_rank"], tm))
        assert s["notes"][3].startswith("the same measured by tracemalloc") and (
            f"{tm[0]:,} (+{tm[0] - s['activation_formula']:,})" in s["notes"][3])
        assert [set(a) for a in s["bytes_by_axis_per_rank"]] == [{"cp"}] * 2
        cp_bytes = ", ".join(f"{a['cp']:,}" for a in s["bytes_by_axis_per_rank"])
        assert s["notes"][-1] == f"bytes sent per rank per step by grid axis: cp {cp_bytes}"
        work = s["notes"][4]  # H = 2 heads, s = 8: the serial causal count is 2·8·9/2 = 72
        assert work.startswith("attention scores computed per rank per batch row"), work
        if s["kind"] != "ulysses":  # zigzag chunks of c = s/2P = 2, diagonal pairs whole
            assert s["score_elements_per_rank"] == [40, 40]
            assert ("together 80 = H·s(s+c)/2 with chunks of c = 2" in work
                    and "the serial layer's causal count H·s(s+1)/2 = 72" in work), work
        else:  # H/P = 1 head each over all s² positions, the masked scores included
            assert s["score_elements_per_rank"] == [64, 64]
            assert "the serial layer's H·s² = 128 (causal: 72)" in work, work
        if s["kind"] == "ulysses":  # the paper's per-link figure, and what a rank sends
            per_rank = s["attention_bytes_per_layer_formula"]["forward"]
            assert f"x (P-1)/P = {per_rank:,} per rank" in s["notes"][1]
    assert s["zigzag"] and s["positions_per_rank"] == [[0, 1, 6, 7], [2, 3, 4, 5]]


@pytest.mark.parametrize("K", [8, 2, 1])
def test_the_planner_counts_every_kind_as_the_code_does(K: int) -> None:
    """minipar.plan's closed forms (cp_bytes_per_layer) = the exact byte counts of the code's
    formulas (themselves checked against the traced counters on 2 and 4 ranks)."""
    from minipar.parallel.context_parallel import measure as m
    from minipar.plan.activations import cp_bytes_per_layer

    b, s, d, H = 2, 64, 32, 8
    dh = d // H
    for c in (2, 4, 8):
        ring = (m.ring_forward_bytes(b, s, d, c, 8, K * dh),
                m.ring_backward_bytes(b, s, d, c, 8, 8, K * dh))
        assert cp_bytes_per_layer("ring", b, s, H, K, dh, c, 1, 8) == ring
        ag = m.allgather_bytes_per_rank(b, s, K * dh, c, 0, 8)
        assert cp_bytes_per_layer("allgather", b, s, H, K, dh, c, 1, 8) == (ag["forward"],
                                                                            ag["backward"])
        uly = m.ulysses_bytes_per_rank(b, s, d, H, c, 0, 8, K)
        assert cp_bytes_per_layer("ulysses", b, s, H, K, dh, c, 1, 8) == (uly, uly)
        for U in (u for u in (2, 4) if u < c):
            parts = m.usp_bytes_per_rank(b, s, d, H, K, U, c // U, 0, 8).values()
            want = tuple(sum(p[w] for p in parts) for w in ("forward", "backward"))
            assert cp_bytes_per_layer("usp", b, s, H, K, dh, c, U, 8) == want


def test_the_planner_takes_usp_with_its_degree() -> None:
    from minipar.plan.presets import load_model, parse_layout

    model = load_model("llama3-8b")
    lay = parse_layout("tp=2,cp=16,cpkind=usp,ulysses=4", model, 128, 8)
    assert (lay.cp_kind, lay.ulysses, lay.c) == ("usp", 4, 16)
    for text, says in (("tp=2,cp=16,cpkind=usp,ulysses=3", "ulysses = 3 must divide"),
                       ("tp=2,cp=16,ulysses=4", "give cpkind=usp")):
        with pytest.raises(ValueError, match=says):
            parse_layout(text, model, 128, 8)
