"""The hybrid's gradient sync: all-reduce over dp·cp, dense and expert tensors apart, or ZeRO
1–3 inside a pipeline — синхронизация градиентов гибрида — 混合并行的梯度同步.

EN gradient synchronisation (hybrid; ZeRO with pipeline parallelism) · RU синхронизация
градиентов (гибрид; ZeRO вместе с конвейером) · ZH 梯度同步（混合并行；ZeRO 与流水线并行结合）

After the pipeline's flush the stage's gradients (its tensor shard's, under their serial
names) are summed over the ranks that hold the same shard of the same stage: the N =
dp·cp ranks (one ring all-reduce on ``dp``, or on ``edp`` when cp > 1:
:func:`~minipar.parallel.pipeline.parts.all_reduce` in an
:class:`~minipar.parallel.pipeline.parts.AllReduceSync`); with ep, the dense tensors over
``dp`` and the experts over ``edp``, the ranks holding the same experts
(:func:`expert_reduce`, DeepSpeed-MoE); or ZeRO (:class:`ZeroSync`).

ZeRO (Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", arXiv 1910.02054) on one pipeline stage: the N ranks partition its
Ψ_p parameters' model states, after (or, for ZeRO-3, during) the m micro-batches.

* ZeRO-1: reduce-scatter the accumulated gradients, step 1/N of the stage's optimizer
  states, all-gather the parameters;
* ZeRO-2: the same messages, but the gradients of the m micro-batches accumulate in a
  full Ψ_p buffer that lives only during the step: after the flush it is
  reduce-scattered and dropped, the rank keeps its 1/N shard of the gradients (and of
  the optimizer states), steps it and all-gathers the parameters.  DeepSpeed's ZeRO-2
  instead reduce-scatters every micro-batch's gradients as backward makes them (m
  reduce-scatters, never a full gradient buffer): here one reduce-scatter per step
  (m−1 fewer), at the price of Ψ_p gradient bytes held from the first backward to
  the flush (``grad_accumulation_bytes``);
* ZeRO-3 (``prefetch`` K: the hooks learn the stage's walk in the first step and post the
  all-gathers of the next K fetches of it, the reduce-scatters non-blocking, from the
  second step on; ``reshard=False``, FSDP2's switch: a unit gathered stays gathered until
  its last fetch of the step, one all-gather per unit and step, Ψ_p held gathered): only the 1/N shard of the parameters is held; ZeRO's own hooks
  (:class:`~minipar.parallel.zero.hooks.ZeroHooks` over the stage's units) all-gather
  a unit's parameters before its forward and again before its backward, *for every
  micro-batch*, and drop them after, and reduce-scatter its gradients, added to the
  shard, after each backward: m× ZeRO-3's messages without pipelining (exactly
  m·(3Ψ_p − C_r − 2C_{r+1})·e sent on the axis, C_r the shard sizes; a unit recomputed
  by remat is all-gathered once more per micro-batch).

A checkpoint of ZeRO-2/3 saves the rank's range of the stage's flat buffer, cut per
tensor (:func:`minipar.parallel.engine.flat_pieces`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from minipar.backend import to_device, to_host, xp
from minipar.collectives import all_gather, reduce_scatter
from minipar.nn import executor
from minipar.parallel.common import found_inf
from minipar.parallel.engine import (
    Shard,
    State,
    flat_pieces,
    load_model_states,
    load_pieces,
    load_scalars,
    model_states,
)
from minipar.precision import ModelStates

__all__ = ["OP_EXPERT_GRADS", "OP_GRADS", "OP_ZERO_AG", "OP_ZERO_RS", "ZeroSync",
           "expert_reduce"]

OP_GRADS, OP_EXPERT_GRADS = "hybrid_grad_allreduce", "hybrid_expert_allreduce"
OP_ZERO_RS, OP_ZERO_AG = "hybrid_zero_reduce_scatter", "hybrid_zero_all_gather"


def _learning_hooks(zeropp: bool = False) -> type:
    """ZeRO's hooks that learn a pipeline stage's walk: the fetches of the first step, in
    order (its instruction list: each micro-batch's forward and backward through the
    stage's units, recomputations included), become the plan of every later step, along
    which ``prefetch`` K posts the all-gathers ahead.  FSDP does the same: it records the
    execution order in the first iteration and prefetches along it afterwards.  Without
    resharding after forward (``keep``, the learning step) a unit fetched stays gathered
    until the step ends, as the plan keeps it later; ``peak_gathered_bytes`` is measured
    (:class:`~minipar.parallel.zero.engine.MeteredZeroHooks`; ``zeropp``: ZeRO++'s,
    :class:`~minipar.parallel.zero.engine.MeteredZeroPPHooks`, which plan the first step's
    walk fetch by fetch)."""
    from minipar.parallel.zero.engine import MeteredZeroHooks, MeteredZeroPPHooks

    class LearningZeroHooks(MeteredZeroPPHooks if zeropp else MeteredZeroHooks):  # type: ignore
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.learned: list[str] = []  # the walk of the first step (empty until it ends)
            self.keep = False  # no reshard, no plan yet: every unit fetched stays gathered

        def fetch(self, unit: Any) -> dict[str, Any]:
            if self.keep and unit.name in self.gathered:
                self.walk.append(unit.name)
                return self.table[unit.name][2].unflatten(self.gathered[unit.name])
            return super().fetch(unit)

        def release(self, unit: Any, params: dict[str, Any]) -> None:
            if self.keep:
                return self.progress()
            return super().release(unit, params)

    return LearningZeroHooks


def expert_reduce(grid: Any) -> Callable[[Any, Any], None]:
    """The gradient reduction with ep: the dense tensors (first in the stage's flat buffer)
    over ``dp``, the experts' over ``edp`` (ring all-reduces,
    :func:`minipar.parallel.expert_parallel.engine.sync_grads`)."""
    from minipar.parallel.expert_parallel.engine import is_expert, sync_grads

    def reduce(grads: Any, layout: Any) -> None:
        n_dense = sum(b - a for a, b in (layout.span(n) for n in layout.names
                                         if not is_expert(n)))
        sync_grads(grid, grads, n_dense, "ring", (OP_GRADS, OP_EXPERT_GRADS))

    return reduce


class ZeroSync:
    """ZeRO-``stage`` (1, 2 or 3) over ``comm``, the N = dp·cp ranks that hold the same
    stage shard; ``world`` decides a 16-bit overflow's skip together.  After
    :meth:`build`: ``states`` (my shard's), ``layout`` (the stage's Ψ_p parameters,
    flat), ``zero_range`` (my [lo, hi) of it), ``zero_hooks`` (ZeRO-3's),
    ``grad_accumulation_bytes`` (ZeRO-2's full gradient buffer of the step)."""

    def __init__(self, stage: int, comm: Any, world: Any, prefetch: int = 0,
                 reshard: bool = True, zeropp: dict[str, Any] | None = None) -> None:
        self.stage, self.comm, self.world, self.prefetch = stage, comm, world, prefetch
        self.reshard = reshard
        self.zeropp = zeropp or {}  # ZeRO-3's ZeRO++: its hooks' parts, block, node, cross
        self.full_buf: Any = None  # ZeRO-2: the full parameters
        self.zero_hooks: Any = None
        self.grad_accumulation_bytes = 0
        self._acc: Any = None  # ZeRO-2: the step's full gradient buffer

    def build(self, spec: Any, params: dict[str, Any], units: list[Any]) -> ModelStates:
        """ZeRO-1: the optimizer states of my 1/N slice; ZeRO-2: also the gradients (a
        shard buffer; the full parameters stay); ZeRO-3: everything of my shard only."""
        from minipar.parallel.zero.shard import shard_range

        kw = spec.opt_kwargs()
        whole_stage = ModelStates(spec.precision, params, spec.optimizer, **kw)
        self.layout, full, comm = whole_stage.layout, whole_stage.params, self.comm
        lo, hi = shard_range(self.layout.size, comm.size, comm.rank)
        self.zero_range = (lo, hi)  # my range of the stage's flat buffer
        if self.stage == 1:
            self.states = ModelStates(spec.precision, self.layout.unflatten(full),
                                      spec.optimizer, lo=lo, hi=hi, **kw)
            return self.states
        self.states = ModelStates(spec.precision, {"shard": full[lo:hi]}, spec.optimizer, **kw)
        if self.stage == 2:  # the optimizer writes my slice of the full parameters
            self.full_buf = full.copy()
            self.states.params = self.full_buf[lo:hi]
            return self.states
        from minipar.parallel.zero.shard import units_table

        self.zero_hooks = _learning_hooks(bool(self.zeropp))(
            3, comm, self.layout.size, (lo, hi), self.states, units_table(units, self.layout),
            dtype=self.states.policy.param_dtype, accumulate=True, prefetch=self.prefetch,
            reshard=self.reshard, **self.zeropp)
        return self.states

    def step_hooks(self) -> Any:
        """ZeRO-2: views of the full parameters, gradients added to a full buffer made for
        this step; ZeRO-3: ZeRO's all-gathering hooks; ZeRO-1: the stage's own (None)."""
        if self.stage == 2:
            from minipar.parallel.pipeline.stage import StageHooks

            lay = self.layout
            self._acc = xp.zeros(lay.size, self.full_buf.dtype)
            self.grad_accumulation_bytes = int(self._acc.nbytes)
            return StageHooks(lay.unflatten(self.full_buf), lay.unflatten(self._acc))
        if self.stage == 3 and (self.prefetch or not self.reshard or self.zeropp):
            hooks = self.zero_hooks  # the first step learns the walk, later ones prefetch /
            # keep along it (ZeRO++: a walk planned per step, a unit's first fetch global)
            hooks.plan(hooks.learned or [])
            hooks.walk, hooks.keep = [], not (self.reshard or hooks.learned)
        return self.zero_hooks

    def eval_hooks(self) -> Any:
        """ZeRO-2: views of the full parameters; ZeRO-3: ZeRO's all-gathering hooks."""
        if self.stage == 2:
            return executor.Hooks(self.layout.unflatten(self.full_buf))
        if self.stage == 3:
            self.zero_hooks.plan([])  # a forward-only walk: blocking, not the step's plan
            self.zero_hooks.keep = False
            return self.zero_hooks
        return executor.Hooks(self.states.param_views())

    def step(self) -> bool:
        """Reduce-scatter the gradients (ZeRO-3 did after each unit's backward), step my
        shard, all-gather the parameters (ZeRO-1/2); False when a 16-bit overflow skipped
        the update."""
        st, comm = self.states, self.comm
        if self.stage == 3:  # the reduce-scatters still in flight (prefetch), completed
            hooks = self.zero_hooks
            hooks.finish()
            hooks.learned, hooks.walk = hooks.learned or hooks.walk, []
            hooks.keep = False
            hooks.gathered.clear()  # (kept, without resharding: the walk has ended)
        if self.stage in (1, 2):
            with comm.operation(OP_ZERO_RS):
                if self.stage == 1:
                    st.grads[st.lo:st.hi] = reduce_scatter(comm, st.grads)
                else:
                    st.grads[...] = reduce_scatter(comm, self._acc)
                    self._acc = None  # ZeRO-2 keeps only its shard of the gradients
        done = st.step(found_inf=found_inf(self.world, st))
        if self.stage in (1, 2):
            full = st.params if self.stage == 1 else self.full_buf
            with comm.operation(OP_ZERO_AG):
                full[...] = all_gather(comm, st.params[st.lo:st.hi])
        return done

    def close(self) -> None:
        """Free ZeRO++'s node and cross communicators."""
        for key in ("node", "cross"):
            if self.zeropp.get(key) is not None:
                self.zeropp[key].Free()
                self.zeropp[key] = None

    def gathered_peak(self) -> tuple[int, int]:
        """ZeRO-3: the most bytes held all-gathered at once (measured) and its formula along
        the learnt walk (:func:`~minipar.parallel.zero.measure.walk_peak_elements`)."""
        from minipar.parallel.zero.measure import walk_peak_elements

        hooks = self.zero_hooks
        walk = [(n, hooks.table[n][1] - hooks.table[n][0]) for n in hooks.learned]
        e = self.states.params.itemsize
        return (hooks.peak_gathered_bytes,
                walk_peak_elements(walk, self.prefetch, self.reshard) * e if walk else 0)

    def ranged(self, kind: str) -> bool:
        """Whether I hold only my range of ``kind``: ZeRO-3 every kind, else all but the
        parameters."""
        return self.stage == 3 or kind != "param"

    def state(self, placements: dict[str, Shard]) -> State:
        """ZeRO-1: the states tensor by tensor; ZeRO-2/3: over my range [lo, hi) of the
        stage's flat buffer, one :class:`~minipar.parallel.engine.Shard` per tensor it
        overlaps (``placements``: where each local tensor sits in the serial one); ZeRO-2's
        parameters: the whole full buffer, tensor by tensor (views)."""
        if self.stage == 1:
            return model_states(self.states, placements)
        lo, hi = self.zero_range
        lay = self.layout
        mine = model_states(self.states)  # one container "shard": flat arrays over [lo, hi)
        st = State(scalars=dict(mine.scalars))
        if self.stage == 2:
            full = lay.unflatten(self.full_buf)
            for n in lay.names:
                st.arrays[("param", placements[n].name)] = (placements[n], full[n])
        for (kind, _), (_, flat) in mine.arrays.items():
            if kind == "param" and self.stage == 2:
                continue
            for n, shape in zip(lay.names, lay.shapes):
                t0, t1 = lay.span(n)
                a, b = max(t0, lo), min(t1, hi)
                if a >= b:
                    continue
                place = placements[n]
                pieces = flat_pieces(place, shape, a - t0, b - t0)
                st.arrays[(kind, place.name)] = (Shard(place.name, place.global_shape, pieces),
                                                 flat[a - lo:b - lo])
        return st

    def load(self, sources: Iterable[State], placements: dict[str, Shard]) -> None:
        """Fill my range (ZeRO-2: and the full parameters) from the overlapping pieces of
        ``sources`` (any layout's states), then the optimizer's t and the loss scale
        (:func:`minipar.parallel.engine.load_scalars`)."""
        sources = list(sources)
        if self.stage == 1:
            load_model_states(self.states, sources, placements)
            return
        load_pieces(self.state(placements), sources)
        load_scalars(self.states, sources)

    def stage_params(self) -> dict[str, Any]:
        """My stage's parameters, tensor by tensor (ZeRO-3: my stage's shards all-gathered,
        pickled on the shard communicator's own, not counted)."""
        flat = self.states.params
        if self.stage == 2:
            flat = self.full_buf
        elif self.stage == 3:
            flat = to_device(np.concatenate(self.comm.comm.allgather(to_host(flat))))
        return self.layout.unflatten(flat)

    def model_state_bytes(self) -> dict[str, int]:
        """Params, grads and optimizer states this rank holds between steps (bytes; ZeRO-2's
        full gradient buffer of the step is ``grad_accumulation_bytes``)."""
        out = self.states.bytes_by_category()
        if self.stage == 2:
            out["params"] = int(self.full_buf.nbytes)
        return out
