"""Layouts of n GPUs for one model: the space, the memory per GPU, the search.

EN parallel layout search (3D/4D) · RU поиск раскладки параллелизма (3D/4D) ·
ZH 并行布局搜索（3D/4D）

A layout (Narayanan et al. 2021, "PTD-P", arXiv 2104.04473) is n = d·t·p·c
GPUs — d data-parallel replicas, t tensor-parallel ranks (Shoeybi et al. 2019,
arXiv 1909.08053; with sequence parallelism, Korthikanti et al. 2022, arXiv
2205.05198), p pipeline stages (1F1B), c context-parallel ranks (ring
attention, arXiv 2310.01889) — plus a ZeRO stage over the d·c replicas of
each shard (arXiv 1910.02054), a recomputation mode (none, selective, full)
and a micro-batch size b, so m = B/(d·b) micro-batches make the global batch
B, and a *placement*: ``tp-inner`` puts ranks of one tensor group next to each
other (tp, cp, dp, pp from the fastest-varying index, Megatron's order: TP in
a server, pipeline across), ``pp-inner`` the reverse (the opposite advice).

**The space** (:func:`layout_space`, exhaustive): every (d, t, p, c) with
d·t·p·c = n, t | heads, t | d_ff, p | layers, c | s, d | B; every micro-batch
size b | B/d up to ``max_b``; ZeRO 0–3 (0 alone when d·c = 1); remat none,
selective, full; both placements (one when t = p = c = 1).

**Memory per GPU** (:func:`layout_memory`), the larger of the first and the
last stage (the embedding and the head; middle stages hold less):

- model states: ZeRO over N = d·c of the stage's parameters (16 bytes each
  in mixed-precision Adam), :func:`~minipar.plan.zero.zero_model_state_breakdown`;
  for a GPT of known shape the stage's parameters are counted exactly as
  minipar and Megatron split them (:func:`stage_param_count`), else Ψ/(p·t);
- activations: min(p, m) micro-batches in flight on stage 0 under 1F1B
  (:func:`~minipar.plan.pipeline.peak_microbatches_in_flight`) × L/p layers ×
  Korthikanti's bytes per layer (:func:`~minipar.plan.activations.activation_bytes_per_layer`,
  sequence parallel when t > 1) for b sequences of s/c tokens — the attention
  scores of a context-parallel rank cover its s/c queries against all s keys
  (Ulysses: a/c heads × s², the same bytes); minipar's ring attention
  (``cp_kind="ring"``, formula "minipar") keeps no scores, only the log-sum-exp,
  b·a·(s/c) elements (its o is the output projection's input, already counted;
  :mod:`minipar.parallel.context_parallel.measure`) — plus, under full recomputation,
  one layer recomputed whole during backward.
  Embedding, output-layer and workspace buffers are not counted.

A layout fits when that total is at most the GPU's memory.  Step time and
ranking: :mod:`minipar.plan.step_time`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

from minipar.plan._check import count, positive
from minipar.plan.activations import activation_bytes_per_layer, minipar_activation_formula
from minipar.plan.model import gpt_param_count
from minipar.plan.pipeline import peak_microbatches_in_flight
from minipar.plan.zero import K_ADAM, zero_model_state_breakdown

REMATS = ("none", "selective", "full")
PLACEMENTS = ("tp-inner", "pp-inner")
ZERO_STAGES = (0, 1, 2, 3)
#: the score-free version of each mode: what selective recomputation keeps
_NO_SCORES = {"none": "tp+sp+selective", "tp": "tp+selective", "tp+sp": "tp+sp+selective",
              "tp+selective": "tp+selective", "tp+sp+selective": "tp+sp+selective",
              "full": "full"}


@dataclass(frozen=True)
class ModelSpec:
    """A transformer: L layers of width h with a heads, d_ff, vocabulary V, sequence s, Ψ.

    ``structured``: Ψ is minipar's GPT of these sizes (untied head), so the
    parameters per stage are counted exactly; else Ψ is split evenly.
    """

    n_layer: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    psi: float
    d_ff: int
    n_ctx: int
    structured: bool
    kv_heads: int = 0
    gated: bool = False
    family: str = "gpt"
    name: str = ""

    @property
    def groups(self) -> int:
        """Key/value heads g (grouped-query attention; = heads for multi-head attention)."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def gpt_model(n_layer: int, d_model: int, vocab: int, n_ctx: int, heads: int,
              seq: int | None = None, d_ff: int | None = None) -> ModelSpec:
    """minipar's GPT (``--gpt L,D,V,T``): Ψ counted by :func:`~minipar.plan.model.gpt_param_count`."""
    L, d, V, T, a = (count(k, v) for k, v in (("n_layer", n_layer), ("d_model", d_model),
                                              ("vocab", vocab), ("n_ctx", n_ctx), ("heads", heads)))
    if d % a:
        raise ValueError(f"heads {a} must divide d_model {d}")
    f = 4 * d if d_ff is None else count("d_ff", d_ff)
    s = T if seq is None else count("seq", seq)
    return ModelSpec(L, d, a, s, V, float(gpt_param_count(L, d, V, T, f)), f, T, True)


def llama_param_count(n_layer: int, h: int, heads: int, kv_heads: int, d_ff: int, vocab: int,
                      tied: bool = False) -> int:
    """Parameters of a Llama-style decoder (Touvron et al. 2023, arXiv 2302.13971; Dubey et
    al. 2024, arXiv 2407.21783): per layer Q and O h² each, K and V h·g·(h/a) each (grouped-
    query attention, Ainslie et al. 2023, arXiv 2305.13245), SwiGLU 3·h·f (Shazeer 2020,
    arXiv 2002.05202), two RMSNorms 2h, no biases; embedding V·h, final norm h, an untied
    head V·h (none when ``tied``); rotary positions have no parameters."""
    dh = h // heads
    layer = 2 * h * h + 2 * h * kv_heads * dh + 3 * h * d_ff + 2 * h
    return n_layer * layer + vocab * h * (1 if tied else 2) + h


def llama_model(n_layer: int, hidden: int, heads: int, kv_heads: int, d_ff: int, vocab: int,
                seq: int, tied: bool = False, name: str = "") -> ModelSpec:
    """A Llama-style model (GQA, SwiGLU, RMSNorm, rotary), Ψ by :func:`llama_param_count`."""
    L, h, a, g, f, V, s = (count(k, v) for k, v in (
        ("n_layer", n_layer), ("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads),
        ("d_ff", d_ff), ("vocab", vocab), ("seq", seq)))
    if h % a or a % g:
        raise ValueError(f"heads {a} must divide hidden {h} and kv_heads {g} the heads {a}")
    return ModelSpec(L, h, a, s, V, float(llama_param_count(L, h, a, g, f, V, tied)), f, s,
                     True, g, True, "llama", name)


def model_from_params(psi: float, n_layer: int, hidden: int, heads: int, seq: int,
                      vocab: int = 51200) -> ModelSpec:
    """Ψ parameters with a transformer's shape (``--params Ψ --layers --hidden --heads``)."""
    L, h, a, s, V = (count(k, v) for k, v in (("n_layer", n_layer), ("hidden", hidden),
                                              ("heads", heads), ("seq", seq), ("vocab", vocab)))
    if h % a:
        raise ValueError(f"heads {a} must divide hidden {h}")
    return ModelSpec(L, h, a, s, V, positive("psi", psi), 4 * h, s, False)


@dataclass(frozen=True)
class Layout:
    """One point of the space: d·t·p·c GPUs, ZeRO stage, remat, micro-batch size b, m, placement."""

    d: int
    t: int
    p: int
    c: int
    zero: int
    remat: str
    b: int
    m: int
    placement: str = "tp-inner"
    v: int = 1
    sp: bool = True
    overlap: bool = True
    cp_kind: str = "ring"
    flash: bool = False
    #: the pipeline schedule: 1f1b (interleaved when v > 1), or DeepSeek-V3's dualpipe
    #: (p even: two copies of the model, p + 1 stages' activations) or dualpipev (its V:
    #: p ranks hold 2p stages, 2p + 1 half-stage activations)
    schedule: str = "1f1b"
    ulysses: int = 1  # USP (cp_kind "usp"): Ulysses ranks per group, c/ulysses ring groups

    @property
    def n(self) -> int:
        return self.d * self.t * self.p * self.c

    def as_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in _LAYOUT_FIELDS}


_LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


@lru_cache(maxsize=4096)
def stage_param_count(model: ModelSpec, p: int, t: int, stage: int) -> float:
    """Parameters one tensor rank of pipeline stage ``stage`` holds (elements).

    Per block, as Megatron (and :mod:`minipar.parallel.tensor_parallel.shards`) split it:
    QKV, W_in (with their biases), W_out of attention and MLP divided by t; the
    LayerNorms (4d) and the two row-parallel biases (2d) replicated.  Stage 0
    adds the vocabulary-parallel embedding V·d/t and the positions T·d; the last
    stage adds ln_f (2d) and the vocabulary-parallel head d·V/t.  Unstructured
    models: Ψ/(p·t).
    """
    p, t, L = count("p", p), count("t", t), model.n_layer
    if model.structured is False:
        return model.psi / (p * t)
    d, f, V = model.hidden, model.d_ff, model.vocab
    if model.family == "llama":  # no biases, RMSNorm (d each), GQA, SwiGLU, untied head
        kv = 2 * d * model.groups * model.head_dim
        out = L // p * ((2 * d * d + kv + 3 * d * f) / t + 2 * d)
        return out + (V * d / t if stage == 0 else 0) + (d + d * V / t if stage == p - 1 else 0)
    block = (3 * d * d + 3 * d + d * d + d * f + f + f * d) / t + 4 * d + 2 * d
    out = L // p * block
    if stage == 0:
        out += V * d / t + model.n_ctx * d
    if stage == p - 1:
        out += 2 * d + d * V / t
    return out


#: the pipeline schedules the planner knows (the layout key ``schedule=``)
SCHEDULES = ("1f1b", "dualpipe", "dualpipev")


def schedule_param_count(model: ModelSpec, lay: Layout, stage: int) -> float:
    """Parameters one tensor rank of pipeline rank ``stage`` holds under ``lay.schedule``:
    1F1B its stage's; DualPipe stages s and p − 1 − s (two copies of the model over the
    ranks); DualPipe-V stages s and 2p − 1 − s of 2p (one copy)."""
    p, t = lay.p, lay.t
    if lay.schedule == "dualpipe":
        return stage_param_count(model, p, t, stage) + stage_param_count(model, p, t,
                                                                         p - 1 - stage)
    if lay.schedule == "dualpipev":
        return stage_param_count(model, 2 * p, t, stage) + stage_param_count(
            model, 2 * p, t, 2 * p - 1 - stage)
    return stage_param_count(model, p, t, stage)


#: context parallelism's kinds the planner models (ring, Ulysses, Llama 3's all-gather, USP)
CP_KINDS = ("ring", "ulysses", "allgather", "usp")


def activation_mode(remat: str, t: int, sequence_parallel: bool = True) -> str:
    """Korthikanti's mode for a remat choice: SP with TP (t > 1) unless told otherwise."""
    if remat not in REMATS:
        raise ValueError(f"remat must be one of {', '.join(REMATS)}, got {remat!r}")
    if remat == "full":
        return "full"
    if t == 1:
        return "none" if remat == "none" else "tp+sp+selective"
    base = "tp+sp" if sequence_parallel else "tp"
    return base if remat == "none" else base + "+selective"


def activation_bytes_layer(model: ModelSpec, lay: Layout, itemsize: int = 2,
                           formula: str = "paper", sequence_parallel: bool = True,
                           cp_kind: str = "ulysses") -> float:
    """Bytes one layer keeps per micro-batch on one rank of ``lay``.

    ``formula="paper"``: Korthikanti's 16-bit figures, scaled by itemsize/2;
    ``"minipar"``: minipar's block (no dropout;
    :func:`~minipar.plan.activations.minipar_activation_formula`), remat none only.
    With c > 1 the rank holds s/c tokens and their scores against all s keys; with
    ``cp_kind="ring"`` (formula "minipar") the log-sum-exp instead of any scores.
    """
    return _layer_bytes(model, lay.t, lay.c, lay.b, lay.remat, itemsize, formula,
                        sequence_parallel, cp_kind)


@lru_cache(maxsize=4096)
def _layer_bytes(model: ModelSpec, t: int, c: int, b: int, remat: str, itemsize: int,
                 formula: str, sequence_parallel: bool, cp_kind: str = "ulysses") -> float:
    s_loc = model.seq // c
    mode = activation_mode(remat, t, sequence_parallel)
    args = (s_loc, b, model.hidden, model.heads, t)
    if formula == "minipar":
        if remat != "none":
            raise ValueError("minipar's activation formula covers remat 'none' only")
        scores = b * model.heads * s_loc * s_loc * itemsize / t  # the A array
        base = minipar_activation_formula(*args, mode, itemsize)
        if cp_kind not in CP_KINDS:
            raise ValueError(f"cp_kind must be one of {', '.join(CP_KINDS)}, got {cp_kind!r}")
        if c == 1 or cp_kind == "ulysses":
            return base + (c - 1) * scores
        lse = 8 if itemsize == 8 else 4  # the compute dtype
        ring = base - scores + b * model.heads * s_loc * lse / t  # lse for A; o is kept anyway
        if cp_kind == "allgather":  # and the whole sequence's K and V, kept for backward
            kv = max(model.groups // t, 1) * model.head_dim
            ring += 2 * b * model.seq * kv * itemsize
        return ring  # USP: ring attention on s/c gathered positions of H/U heads, the same
    if formula != "paper":
        raise ValueError(f"formula must be 'paper' or 'minipar', got {formula!r}")
    full = activation_bytes_per_layer(*args, mode)
    free = activation_bytes_per_layer(*args, _NO_SCORES[mode])
    return (free + c * (full - free)) * itemsize / 2


def layout_memory(model: ModelSpec, lay: Layout, itemsize: int = 2, K: float = K_ADAM,
                  formula: str = "paper", sequence_parallel: bool = True,
                  cp_kind: str = "ulysses") -> dict[str, float]:
    """Bytes per GPU of ``lay``: ``states``, ``activations`` and ``total`` of the fuller of
    stage 0 and stage p−1; ``stage`` says which; ``params_per_rank`` (elements).

    ``itemsize`` 2 with K = 12 is mixed-precision Adam (2 + 2 + 12 bytes per
    parameter); minipar's float64 runs: itemsize 8, K = 16 (Adam's m and v).
    """
    N = lay.d * lay.c
    sequence_parallel = sequence_parallel and lay.sp
    if lay.flash and lay.remat == "none":  # flash attention keeps no s × s scores
        layer = _layer_bytes(model, lay.t, lay.c, lay.b, "selective", itemsize, formula,
                             sequence_parallel, cp_kind)
    else:
        layer = activation_bytes_layer(model, lay, itemsize, formula, sequence_parallel,
                                       cp_kind)
    per_stage = model.n_layer // lay.p
    best: dict[str, float] = {}
    for stage in sorted({0, lay.p - 1}):
        share = schedule_param_count(model, lay, stage)
        states = zero_model_state_breakdown(share, N, lay.zero, K, itemsize, itemsize)["total"]
        if lay.schedule == "dualpipe":  # the table's PP + 1 stages' activations, every rank
            acts = (lay.p + 1) * per_stage * layer
        elif lay.schedule == "dualpipev":  # 2p + 1 half-stage chunks
            acts = (2 * lay.p + 1) * per_stage / 2 * layer
        elif lay.v > 1 and stage == 0:  # Megatron's interleaved warm-up on stage 0
            chunks = min(lay.m * lay.v, (lay.v - 1) * lay.p + 2 * (lay.p - 1) + 1)
            acts = chunks * per_stage / lay.v * layer
        else:
            flight = peak_microbatches_in_flight(lay.p, lay.m) if stage == 0 else 1
            acts = flight * per_stage * layer
        if lay.remat == "full":  # one layer recomputed whole during its backward (with
            # flash attention that layer too keeps no s × s scores: selective's bytes)
            acts += _layer_bytes(model, lay.t, lay.c, lay.b, "selective" if lay.flash else "none",
                                 itemsize, formula, sequence_parallel, cp_kind)
        if states + acts > best.get("total", -1.0):
            kinds = zero_model_state_breakdown(share, N, lay.zero, K, itemsize, itemsize)
            best = {"states": states, "activations": acts, "total": states + acts,
                    "stage": stage, "params_per_rank": share, "params": kinds["params"],
                    "grads": kinds["grads"], "optimizer": kinds["optimizer"]}
    return best


def check_layout(model: ModelSpec, lay: Layout, n: int | None = None,
                 global_batch: int | None = None) -> None:
    """ValueError, one line naming the numbers, unless ``lay`` is a layout of the space."""
    for k in ("d", "t", "p", "c", "b", "m"):
        count(k, getattr(lay, k))
    if n is not None and lay.n != n:
        raise ValueError(f"d·t·p·c = {lay.d}·{lay.t}·{lay.p}·{lay.c} = {lay.n} does not equal "
                         f"{n} GPUs")
    if model.heads % lay.t or model.d_ff % lay.t:
        raise ValueError(f"t = {lay.t} must divide the {model.heads} heads and d_ff {model.d_ff}")
    if model.n_layer % lay.p:
        raise ValueError(f"p = {lay.p} must divide the {model.n_layer} layers")
    count("v", lay.v)
    if lay.v > 1 and (model.n_layer // lay.p) % lay.v:
        raise ValueError(f"v = {lay.v} must divide the {model.n_layer // lay.p} layers of each "
                         f"of the p = {lay.p} stages")
    if lay.v > 1 and lay.p == 1:
        raise ValueError(f"v = {lay.v} interleaves pipeline stages: it needs p > 1")
    if lay.v > 1 and lay.m % lay.p:
        raise ValueError(f"interleaving (v = {lay.v}) needs the {lay.m} micro-batches to be a "
                         f"multiple of p = {lay.p} (Megatron-LM's rule)")
    if model.groups % lay.t and lay.t % model.groups:  # K < t: each replicated on t/K ranks
        raise ValueError(f"t = {lay.t} must divide the {model.groups} key/value heads or be "
                         "a multiple of them")
    if lay.cp_kind not in ("ring", "allgather", "usp"):
        raise ValueError(f"cp kind must be ring, allgather or usp, got {lay.cp_kind!r}")
    if lay.cp_kind != "usp" and lay.ulysses != 1:
        raise ValueError(f"ulysses = {lay.ulysses} is USP's degree: give cpkind=usp")
    if lay.cp_kind == "usp" and (lay.c % lay.ulysses or (model.heads // lay.t) % lay.ulysses):
        raise ValueError(f"usp: ulysses = {lay.ulysses} must divide c = {lay.c} and the "
                         f"{model.heads // lay.t} heads of a tensor slice")
    if model.seq % lay.c:
        raise ValueError(f"c = {lay.c} must divide the sequence length {model.seq}")
    if global_batch is not None and lay.d * lay.b * lay.m != global_batch:
        raise ValueError(f"d·b·m = {lay.d}·{lay.b}·{lay.m} does not equal the global batch "
                         f"{global_batch}")
    if lay.zero not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {lay.zero!r}")
    if lay.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got "
                         f"{lay.schedule!r}")
    if lay.schedule != "1f1b":
        if lay.v > 1 or lay.p == 1:
            raise ValueError(f"schedule={lay.schedule} needs pp > 1 and no interleaving "
                             f"(vp = 1), got pp = {lay.p}, vp = {lay.v}")
        if lay.schedule == "dualpipe" and (lay.p % 2 or lay.m % 2):
            raise ValueError(f"schedule=dualpipe needs pp and m even (m/2 micro-batches from "
                             f"each end), got pp = {lay.p}, m = {lay.m}")
        if lay.m < 2 * lay.p:
            raise ValueError(f"schedule={lay.schedule} needs m >= 2·pp = {2 * lay.p} "
                             f"micro-batches, got m = {lay.m}")
        if lay.schedule == "dualpipev" and model.n_layer % (2 * lay.p):
            raise ValueError(f"schedule=dualpipev cuts the {model.n_layer} layers into "
                             f"2·pp = {2 * lay.p} stages: they must divide")
    if lay.placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got "
                         f"{lay.placement!r}")
    activation_mode(lay.remat, lay.t)


def _divisors(x: int) -> list[int]:
    return [k for k in range(1, x + 1) if x % k == 0]


def layout_space(model: ModelSpec, n: int, global_batch: int, max_b: int = 8,
                 max_c: int | None = None) -> list[Layout]:
    """Every layout of the space named in the module docstring, in a fixed order.

    ``max_c`` caps the context-parallel size (1: PTD-P's 3D space, no cp).
    """
    n, B, max_b = count("n", n), count("global_batch", global_batch), count("max_b", max_b)
    max_c = n if max_c is None else count("max_c", max_c)
    out = []
    for t in _divisors(n):
        if model.heads % t or model.d_ff % t:
            continue
        for p in _divisors(n // t):
            if model.n_layer % p:
                continue
            for c in _divisors(n // (t * p)):
                d = n // (t * p * c)
                if model.seq % c or B % d or c > max_c:
                    continue
                zeros = ZERO_STAGES if d * c > 1 else (0,)
                places = PLACEMENTS if (t, p, c) != (1, 1, 1) else PLACEMENTS[:1]
                for b in _divisors(B // d):
                    if b > max_b:
                        break
                    m = B // (d * b)
                    out += [Layout(d, t, p, c, z, r, b, m, pl) for z in zeros for r in REMATS
                            for pl in places]
    return out


def zero_max_params(memory_bytes: float, N: int, stage: int, mp: int = 1, K: float = K_ADAM
                    ) -> float:
    """The largest Ψ whose model states fit: mp × memory / (bytes per parameter at ``stage``).

    ZeRO's Table 2 (arXiv 1910.02054): a 32 GB V100, N_d = 64 → 2 B (DP),
    7.6 B (P_os), 14.4 B (P_os+g), 128 B (P_os+g+p), × the model-parallel degree.
    """
    per_param = zero_model_state_breakdown(1.0, N, stage, K)["total"]
    return count("mp", mp) * positive("memory_bytes", memory_bytes) / per_param
