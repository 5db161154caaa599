"""The engine — движок обучения — 训练引擎: one shape for every strategy.

Every way of training in minipar — the serial model, data parallelism, the
parameter server, ZeRO 0-3, tensor, sequence, context, pipeline and expert
parallelism, and their hybrid — is an object with the same methods
(:class:`Engine`), so that one training loop (:mod:`minipar.parallel.loop`),
one checkpoint (:mod:`minipar.parallel.checkpoint`), one parity check
and one ``minipar run`` serve them all:

==========================  ===========================================================
``step(batch)``             one optimizer step on the GLOBAL batch (the engine cuts
                            its rows or positions with :mod:`minipar.spans`); returns
                            :class:`StepResult` (the global mean loss, alike on every rank)
``evaluate(batch)``         forward only: the global mean loss (validation)
``state_dict()``            what this rank holds, every array with its :class:`Shard`
``load_state_dict(state)``  reads, for each local shard, the overlapping saved pieces
``full_params()``           collective: the whole model under its serial names, every rank
``memory()``                bytes held by kind (params, grads, optimizer states, ...)
``traffic()``               bytes this rank sent since the last call, by grid axis
``close()``                 frees offload files and communicators
==========================  ===========================================================

**Layout-independent state** (Megatron's ``ShardedTensor``, nanotron's
``SlicesPair``).  A rank's array is a piece of some global tensor of the
serial model.  A :class:`Shard` says which: the serial name
(``blocks.0.attn.w_qkv``), the global shape, and :class:`Piece` s, each a
block of the local array and where it sits in the global tensor.  Two
examples on 2 ranks (d = 4):

    tensor parallelism, w_qkv (4, 12) by column groups: rank 1 holds (4, 6)
        local[:, 0:2] = global[:, 2:4]     (its half of q)
        local[:, 2:4] = global[:, 6:8]     (of k)
        local[:, 4:6] = global[:, 10:12]   (of v)

    ZeRO, flat range [40, 70) of the buffer; w of shape (4, 8) at [32, 64):
        the 24 elements 8..31 of w, a 1-D local array, in C order:
        local[0:8]  = global[1, 0:8]       (row 1 whole)
        local[8:24] = global[2:4, 0:8]     (rows 2-3 whole)

A piece's local block, read in C order, fills its global block in C order
(so a flat range is cut into contiguous row blocks: :func:`flat_pieces`).
``replica`` numbers the copies of the same pieces (data-parallel replicas);
the copy 0 is the one a checkpoint saves.  Loading never asks whether the
saved layout was the same: it reads, for each local piece, the overlapping
pieces of the saved shards (:func:`read_region`) — so any layout can resume
any other.  :func:`model_states` and :func:`load_model_states` do this for
the one container every engine keeps its state in,
:class:`minipar.precision.ModelStates` (flat params, fp32 master weights,
optimizer moments over a flat range).

:class:`SerialEngine` is the oracle of every parity check: one process, the
whole batch, gradient accumulation over the MoE **routing groups** (a
mixture of experts routes each forward call's tokens as one group, so the
serial engine, told the groups a layout makes, routes exactly as it does).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from minipar import checks, spans
from minipar.backend import array_module, to_host
from minipar.nn import executor
from minipar.parallel.expert_bias import ExpertBias
from minipar.precision import ModelStates, get

Array = Any

#: the kinds of arrays a state holds; ``param`` is the model, the others the optimizer's
KINDS = ("param", "master", "exp_avg", "exp_avg_sq", "momentum")


@dataclass(frozen=True)
class Batch:
    """The GLOBAL batch of one step: ``tokens`` and ``targets`` of all B rows.  An
    engine takes its own rows (data parallelism), positions (context parallelism)
    or micro-batches (a pipeline) of it."""

    step: int
    tokens: Array
    targets: Array

    def rows(self, lo: int, hi: int) -> Batch:
        """Rows ``[lo, hi)`` (views)."""
        return Batch(self.step, self.tokens[lo:hi], self.targets[lo:hi])

    @property
    def size(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class StepResult:
    """What one ``step`` returns: the global mean loss, the same on every rank."""

    loss: float
    skipped: bool = False  # 16-bit overflow: the update was skipped, alike on every rank
    records: tuple = ()    # an optional timeline (pipeline instructions, DDP buckets)


@dataclass(frozen=True)
class Piece:
    """One block of a local array and where it sits in the global tensor."""

    local: tuple[slice, ...]    # in the local array
    global_: tuple[slice, ...]  # in the global tensor, same number of elements


@dataclass(frozen=True)
class Shard:
    """Which part of a global tensor a local array is (see the module docstring)."""

    name: str                      # serial name, e.g. "blocks.3.attn.w_qkv"
    global_shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    replica: int = 0               # 0 = the copy that is saved


@dataclass
class State:
    """What one rank holds: ``arrays[(kind, name)] = (Shard, array)`` (arrays are views
    of the engine's own buffers where it can), and ``scalars`` (the step count, the
    optimizer's t and hyperparameters, the loss scale and its counters)."""

    arrays: dict[tuple[str, str], tuple[Shard, Array]] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """Every strategy's shape (the module docstring's table)."""

    def step(self, batch: Batch) -> StepResult: ...
    def evaluate(self, batch: Batch) -> float: ...
    def state_dict(self) -> State: ...
    def load_state_dict(self, state: State | Iterable[State]) -> None: ...
    def full_params(self) -> dict[str, Array]: ...
    def memory(self) -> dict[str, int]: ...
    def traffic(self) -> dict[str, int]: ...
    def close(self) -> None: ...


# -- shards ------------------------------------------------------------------------

def whole(name: str, shape: tuple[int, ...], replica: int = 0) -> Shard:
    """The shard of a rank that holds all of tensor ``name``."""
    full = tuple(slice(0, n) for n in shape)
    return Shard(name, tuple(shape), (Piece(full, full),), replica)


def _cuts(placement: Shard, ndim: int) -> list[list[int]]:
    """Per dimension of the local tensor, the sorted boundaries of its pieces."""
    cuts: list[set[int]] = [set() for _ in range(ndim)]
    for p in placement.pieces:
        for k, s in enumerate(p.local):
            cuts[k].update((s.start, s.stop))
    return [sorted(c) for c in cuts]


def _blocks(a: int, b: int, shape: tuple[int, ...], cuts: list[list[int]]
            ) -> list[tuple[int, int, tuple[slice, ...]]]:
    """Flat range ``[a, b)`` of a C-order tensor of ``shape`` as contiguous rectangular
    blocks ``(lo, hi, slices)``, none crossing a boundary in ``cuts``."""
    if a >= b:
        return []
    if len(shape) == 1:
        edges = [a] + [c for c in cuts[0] if a < c < b] + [b]
        return [(lo, hi, (slice(lo, hi),)) for lo, hi in itertools.pairwise(edges)]
    inner = math.prod(shape[1:])
    inner_cut = any(c not in ([], [0, n]) for c, n in zip(cuts[1:], shape[1:]))
    out: list[tuple[int, int, tuple[slice, ...]]] = []
    r0, r1 = a // inner, -(-b // inner)

    def partial(r: int, lo: int, hi: int) -> None:  # [lo, hi) inside row r
        for blo, bhi, sl in _blocks(lo - r * inner, hi - r * inner, shape[1:], cuts[1:]):
            out.append((blo + r * inner, bhi + r * inner, (slice(r, r + 1),) + sl))

    if inner_cut:  # row by row: each row splits at the inner boundaries
        for r in range(r0, r1):
            partial(r, max(a, r * inner), min(b, (r + 1) * inner))
        return out
    first = -(-a // inner)  # the first whole row
    last = b // inner       # one past the last whole row
    if first >= last:       # no whole row: [a, b) in one row or across two
        for r in range(r0, r1):
            partial(r, max(a, r * inner), min(b, (r + 1) * inner))
        return out
    if a % inner:
        partial(r0, a, first * inner)
    edges = [first] + [c for c in cuts[0] if first < c < last] + [last]
    rest = tuple(slice(0, n) for n in shape[1:])
    for lo, hi in itertools.pairwise(edges):
        out.append((lo * inner, hi * inner, (slice(lo, hi),) + rest))
    if b % inner:
        partial(last, last * inner, b)
    return out


def _to_global(placement: Shard, block: tuple[slice, ...]) -> tuple[slice, ...]:
    """The global slices of a local block that lies inside one piece of ``placement``."""
    for p in placement.pieces:
        if all(pl.start <= s.start and s.stop <= pl.stop for pl, s in zip(p.local, block)):
            return tuple(slice(g.start + s.start - pl.start, g.start + s.stop - pl.start)
                         for pl, g, s in zip(p.local, p.global_, block))
    raise ValueError(f"{placement.name}: local block {block} is in none of its pieces")


def flat_pieces(placement: Shard, local_shape: tuple[int, ...], a: int, b: int
                ) -> tuple[Piece, ...]:
    """Pieces of elements ``[a, b)`` (C order) of a local tensor of ``local_shape`` placed
    by ``placement``, as a 1-D local array of ``b - a`` elements: ZeRO's flat range cut
    per tensor (a scalar tensor, shape ``()``, is one piece of one element)."""
    if not local_shape:
        return (Piece((slice(0, 1),), ()),) if a < b else ()
    out = []
    for lo, hi, block in _blocks(a, b, tuple(local_shape), _cuts(placement, len(local_shape))):
        out.append(Piece((slice(lo - a, hi - a),), _to_global(placement, block)))
    return tuple(out)


def _shape(sl: tuple[slice, ...]) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in sl)


def read_region(sources: Iterable[State], kind: str, name: str,
                region: tuple[slice, ...]) -> np.ndarray:
    """The block ``region`` of global tensor ``name`` (of ``kind``), read from the
    overlapping pieces of ``sources`` (the states of any layout's ranks), on the host.
    ValueError if some element is held by none of them."""
    out: np.ndarray | None = None
    seen = np.zeros(_shape(region), dtype=bool)
    for st in sources:
        hit = st.arrays.get((kind, name))
        if hit is None:
            continue
        shard, arr = hit
        for p in shard.pieces:
            inter = tuple(slice(max(r.start, g.start), min(r.stop, g.stop))
                          for r, g in zip(region, p.global_))
            if any(s.start >= s.stop for s in inter):
                continue
            block = to_host(arr[p.local]).reshape(_shape(p.global_))
            if out is None:
                out = np.empty(_shape(region), dtype=block.dtype)
            src = tuple(slice(s.start - g.start, s.stop - g.start) for s, g in zip(inter, p.global_))
            dst = tuple(slice(s.start - r.start, s.stop - r.start) for s, r in zip(inter, region))
            out[dst] = block[src]
            seen[dst] = True
    if out is None or not seen.all():
        where = ", ".join(f"{s.start}:{s.stop}" for s in region)
        raise ValueError(f"{kind} {name}[{where}]: not all of it is held by the states "
                         "given (a missing rank's file?)")
    return out


def assemble(sources: Iterable[State], kind: str, name: str,
             global_shape: tuple[int, ...]) -> np.ndarray:
    """The whole global tensor ``name`` from the pieces of ``sources``."""
    return read_region(sources, kind, name, tuple(slice(0, n) for n in global_shape))


def load_pieces(target: State, sources: Iterable[State]) -> None:
    """Write into every array of ``target`` (views of an engine's buffers) the overlapping
    pieces of ``sources``: a load that never asks whether the layouts were the same."""
    sources = list(sources)
    for (kind, name), (shard, arr) in target.arrays.items():
        for p in shard.pieces:
            block = read_region(sources, kind, name, p.global_)  # on the host
            block = block.reshape(arr[p.local].shape).astype(arr.dtype, copy=False)
            arr[p.local] = array_module(arr).asarray(block)  # to the device, if arr is there


# -- the one container of model states ----------------------------------------------

def model_states(states: ModelStates, placements: dict[str, Shard] | None = None,
                 replica: int | Callable[[str], int] = 0, moments_replica: int | None = None,
                 prefix: str = "") -> State:
    """The :class:`State` of a :class:`~minipar.precision.ModelStates`.

    ``placements[local name]``: where each local tensor sits in the global one (absent:
    the local tensor IS the global one, named as locally); ``replica``: which copy of
    the parameters this rank's are — one number, or a function of the serial name when
    tensors are copied over different groups (tensor parallelism: a slice's copies are
    the dp ranks, a replicated tensor's every rank; experts: the expert-data-parallel
    ranks); ``moments_replica``: of the master weights and
    moments (ZeRO: 0, each rank holds its own range; default ``replica``); ``prefix``
    names the scalars of one of several containers.  Arrays are views."""
    placements = placements or {}
    copy_of = replica if callable(replica) else (lambda name: replica)
    st = State()
    lay = states.layout
    params = lay.unflatten(states.params)
    kinds = [("master", states.master)] if states.master is not None else []
    opt = states.optimizer
    if getattr(opt, "m", None) is not None:
        kinds += [("exp_avg", opt.m), ("exp_avg_sq", opt.v)]
    elif getattr(opt, "buf", None) is not None:
        kinds += [("momentum", opt.buf)]
    lo, hi = states.lo, states.hi
    for n, shape in zip(lay.names, lay.shapes):
        place = placements.get(n) or whole(n, shape)
        rep = copy_of(place.name)
        mrep = rep if moments_replica is None else moments_replica
        st.arrays[("param", place.name)] = (
            Shard(place.name, place.global_shape, place.pieces, rep), params[n])
        t0, t1 = lay.span(n)
        a, b = max(t0, lo), min(t1, hi)
        if a >= b:
            continue
        pieces = flat_pieces(place, shape, a - t0, b - t0)
        for kind, flat in kinds:
            st.arrays[(kind, place.name)] = (Shard(place.name, place.global_shape, pieces, mrep),
                                             flat[a - lo:b - lo])
    st.scalars.update(optimizer_scalars(states, prefix))
    return st


def optimizer_scalars(states: ModelStates, prefix: str = "") -> dict[str, Any]:
    """The optimizer's step count and hyperparameters and the loss scaler's state."""
    opt = states.optimizer
    out: dict[str, Any] = {f"{prefix}optimizer": type(opt).__name__,
                           f"{prefix}optimizer.t": int(opt.t)}
    for k in ("lr", "b1", "b2", "eps", "weight_decay", "momentum"):
        if hasattr(opt, k):
            out[f"{prefix}optimizer.{k}"] = float(getattr(opt, k))
    if states.scaler is not None:
        for k in ("scale", "good_steps", "skipped"):
            out[f"{prefix}scaler.{k}"] = getattr(states.scaler, k)
    return out


def saved_step(sources: Iterable[State]) -> int:
    """The steps the saved run had taken (scalar ``"step"``; 0 when none is saved)."""
    return max((int(s.scalars["step"]) for s in sources if "step" in s.scalars), default=0)


def load_scalars(states: ModelStates, sources: Iterable[State], prefix: str = "") -> int:
    """The optimizer's t and the loss scaler's state from ``sources`` into ``states``;
    returns :func:`saved_step`."""
    sources = list(sources)
    scalars: dict[str, Any] = {}
    for s in sources:
        scalars.update(s.scalars)
    if f"{prefix}optimizer.t" in scalars:
        states.optimizer.t = int(scalars[f"{prefix}optimizer.t"])
    if states.scaler is not None and f"{prefix}scaler.scale" in scalars:
        states.scaler.scale = float(scalars[f"{prefix}scaler.scale"])
        states.scaler.good_steps = int(scalars[f"{prefix}scaler.good_steps"])
        states.scaler.skipped = int(scalars[f"{prefix}scaler.skipped"])
    return saved_step(sources)


def load_model_states(states: ModelStates, sources: Iterable[State],
                      placements: dict[str, Shard] | None = None, prefix: str = "") -> int:
    """Fill ``states`` (params, master, moments, optimizer t, loss scale) from the
    overlapping pieces of ``sources`` (any layout's states); returns the saved step."""
    sources = list(sources)
    load_pieces(model_states(states, placements, prefix=prefix), sources)
    return load_scalars(states, sources, prefix)


def with_buffers(st: State, arrays: dict[str, Array], replica: int = 0) -> State:
    """``st`` with ``arrays`` (state that is not a parameter: the loss-free expert bias,
    :mod:`minipar.parallel.expert_bias`), each whole, kind ``"buffer"``."""
    for name, arr in arrays.items():
        st.arrays[("buffer", name)] = (whole(name, tuple(arr.shape), replica), arr)
    return st


def load_buffers(arrays: dict[str, Array], sources: Iterable[State]) -> None:
    """``arrays`` (by full name) from the ``"buffer"`` arrays of ``sources``."""
    if arrays:
        load_pieces(with_buffers(State(), arrays), sources)


def memory_of(states: ModelStates) -> dict[str, int]:
    """Model-state bytes this rank holds, by kind (``ModelStates.bytes_by_category``)."""
    return {k: int(v) for k, v in states.bytes_by_category().items()}


def sources_of(state: State | Iterable[State]) -> list[State]:
    """``load_state_dict``'s argument as a list of states (one, or every rank's)."""
    return [state] if isinstance(state, State) else list(state)


# -- the serial engine: the oracle ------------------------------------------------------

def routing_spans(rows: int, routing: tuple[int, ...]) -> list[tuple[int, int]]:
    """Rows ``[lo, hi)`` of each MoE routing group: the batch cut ``routing[0]`` ways by
    the ``numpy.array_split`` rule, each part ``routing[1]`` ways, ... (data-parallel
    ranks, then a rank's micro-batches: ``(dp, m)``).  ``()``: one group."""
    out = [(0, rows)]
    for parts in routing:
        out = [(lo + a, lo + b) for lo, hi in out
               for a, b in (spans.span(hi - lo, parts, i) for i in range(parts))]
    return out


class SerialEngine:
    """One process, the whole global batch: the oracle every strategy must equal.

    ``model``: a GPT or MLP (its ``cfg.dtype`` the precision's parameter dtype);
    ``routing``: the MoE routing groups (:func:`routing_spans`): each group's rows are
    one forward call weighted by its share of the rows, gradients accumulated.  A
    dense model with ``routing=()`` is plain full-batch training."""

    def __init__(self, model: Any, precision: str = "float64", optimizer: str = "adamw",
                 seed: int = 0, routing: tuple[int, ...] = (), **opt_kwargs: Any) -> None:
        pol = get(precision)
        if str(model.cfg.dtype) != pol.model_dtype:
            raise ValueError(f"model dtype {model.cfg.dtype} does not match precision "
                             f"{precision!r} (expects {pol.model_dtype})")
        self.model, self.routing = model, tuple(routing)
        init = type(model)(type(model.cfg)(**{**asdict(model.cfg), "dtype": "float64"})).init(seed)
        self.states = ModelStates(pol, init, optimizer, **opt_kwargs)
        cfg = model.cfg
        self.bias = ExpertBias(cfg, range(cfg.n_layer)) if getattr(cfg, "n_experts", 0) else None
        self.views = {**self.states.param_views(), **(self.bias.views() if self.bias else {})}
        self.steps_done = 0

    def _grads(self, x: Array, y: Array, scale: float, loads: dict[str, Any]
               ) -> tuple[float, dict[str, Array]]:
        """One forward call's loss and gradients (the routing loads added to ``loads``)."""
        if self.bias is None:
            return self.model.loss_and_grads(self.views, x, y, loss_scale=scale)
        self.model._check_targets(x, y)
        hooks = executor.Hooks(self.views)
        loss = executor.loss_and_grads(self.model.units(), hooks, x, y, scale, loads=loads)
        return loss, {k: hooks.grads[k] for k in self.states.layout.names}

    def _loss_and_grads(self, x: Array, y: Array) -> float:
        st = self.states
        loads: dict[str, Any] = {}
        if not self.routing:
            loss, grads = self._grads(x, y, st.loss_scale, loads)
            st.set_grads(grads)
        else:
            rows = len(x)
            groups = routing_spans(rows, self.routing)
            if any(hi <= lo for lo, hi in groups):
                raise ValueError(f"routing groups {self.routing} leave a group with no rows "
                                 f"of a batch of {rows}")
            st.grads[...] = 0
            loss = 0.0
            for lo, hi in groups:
                w = (hi - lo) / rows
                part, grads = self._grads(x[lo:hi], y[lo:hi], w * st.loss_scale, loads)
                st.grads += st.layout.flatten(grads, st.grads.dtype)
                loss += w * part
        if self.bias is not None:
            self.bias.update(loads)  # once, after every micro-batch of the step
        return float(loss)

    def step(self, batch: Batch) -> StepResult:
        loss = self._loss_and_grads(batch.tokens, batch.targets)
        done = self.states.step()
        self.steps_done += 1
        return StepResult(loss, skipped=not done)

    def evaluate(self, batch: Batch) -> float:
        """The loss without a step: each routing group's mean, weighted by its rows."""
        rows = batch.size
        return float(sum((hi - lo) / rows * self.model.loss(self.views, batch.tokens[lo:hi],
                                                            batch.targets[lo:hi])
                         for lo, hi in routing_spans(rows, self.routing)))

    def state_dict(self) -> State:
        st = model_states(self.states)
        st.scalars["step"] = self.steps_done
        return with_buffers(st, self.bias.arrays) if self.bias else st

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        sources = sources_of(state)
        self.steps_done = load_model_states(self.states, sources)
        if self.bias:
            load_buffers(self.bias.arrays, sources)

    def full_params(self) -> dict[str, Array]:
        return {n: v.copy() for n, v in self.states.param_views().items()}

    def memory(self) -> dict[str, int]:
        return memory_of(self.states)

    def traffic(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def build(spec: Any, grid: Any = None, **options: Any) -> SerialEngine:
    """The serial engine of ``spec`` (:mod:`minipar.parallel.strategies`' row "serial"):
    the routing groups are ``spec.routing`` (a layout's MoE groups) unless given."""
    checks.known("the serial engine", options, ("routing",))
    return SerialEngine(spec.model(), spec.precision, spec.optimizer, spec.seed,
                        routing=options.get("routing", getattr(spec, "routing", ())),
                        **spec.opt_kwargs())


class AxisTraffic:
    """An engine's ``traffic()`` on a grid: the bytes this rank sent since the last call on
    each of the grid's communicators (every axis, zeros included) and under ``"world"`` on
    the grid's own communicator (a loss all-reduce, ``found_inf``).  All of a grid's
    communicators share one counter, so the values add up to what it counted."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid
        self.last = self.now()

    def now(self) -> dict[str, int]:
        """Bytes sent so far, by axis and ``"world"``."""
        w = self.grid.world
        return {**self.grid.bytes_by_axis(), "world": w.stats.bytes_sent(comm=w.name)}

    def __call__(self) -> dict[str, int]:
        now = self.now()
        out = {k: v - self.last.get(k, 0) for k, v in now.items()}
        self.last = now
        return out
