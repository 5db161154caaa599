"""ZeRO inside a pipeline: stages 1, 2 and 3 over the ranks that hold the same stage shard —
ZeRO в конвейере — 流水线中的 ZeRO.

EN ZeRO with pipeline parallelism · RU ZeRO вместе с конвейерным параллелизмом ·
ZH ZeRO 与流水线并行结合

Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", arXiv 1910.02054, applied to one pipeline stage of the hybrid
grid (:class:`minipar.parallel.hybrid.engine.HybridParallel`): the N = dp·cp ranks that
hold the same tensor shard of the same stage partition its Ψ_p parameters'
model states, after (or, for ZeRO-3, during) the pipeline's m micro-batches.

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
* ZeRO-3: only the 1/N shard of the parameters is held; ZeRO's own hooks
  (:class:`~minipar.parallel.zero.hooks.ZeroHooks` over the stage's units) all-gather
  a unit's parameters before its forward and again before its backward, *for every
  micro-batch*, and drop them after, and reduce-scatter its gradients, added to the
  shard, after each backward: m× ZeRO-3's messages without pipelining (exactly
  m·(3Ψ_p − C_r − 2C_{r+1})·e sent on the axis, C_r the shard sizes; a unit recomputed
  by remat is all-gathered once more per micro-batch).

The mixin below is what :class:`~minipar.parallel.hybrid.engine.HybridParallel` adds to
the pipeline executor for it: the sharded states, the hooks each step runs the
stage's units with, the state a checkpoint saves (ZeRO-2/3: the rank's range of the
stage's flat buffer, cut per tensor: :func:`minipar.parallel.engine.flat_pieces`) and the
evidence (which units remat gathers again, the model states held).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minipar.parallel.engine import Shard, State, flat_pieces, load_pieces, model_states
from minipar.precision import ModelStates


class HybridZero:
    """ZeRO-1/2/3 for :class:`~minipar.parallel.hybrid.engine.HybridParallel` (a mixin: it
    reads the executor's ``states``, ``shard_comm``, ``stage_layout``, ``chunk_units``,
    ``stage_memory`` and ``zero``; it sets ``zero_range``)."""

    def _shard_states(self, spec: Any) -> None:
        """ZeRO-1: the optimizer states of my 1/N slice; ZeRO-2: also the gradients (a
        shard buffer; the full parameters stay); ZeRO-3: everything of my shard only."""
        from minipar.parallel.zero.shard import shard_range

        full, comm = self.states.params, self.shard_comm
        lo, hi = shard_range(self.stage_layout.size, comm.size, comm.rank)
        self.zero_range = (lo, hi)  # my range of the stage's flat buffer
        if self.zero == 1:
            self.states = ModelStates(spec.precision, self.stage_layout.unflatten(full),
                                      spec.optimizer, lo=lo, hi=hi, **spec.opt_kwargs())
            return
        self.states = ModelStates(spec.precision, {"shard": full[lo:hi]}, spec.optimizer,
                                  **spec.opt_kwargs())
        self.full_buf = None
        if self.zero == 2:  # the optimizer writes my slice of the full parameters
            self.full_buf = full.copy()
            self.states.params = self.full_buf[lo:hi]
            return
        from minipar.parallel.zero.hooks import ZeroHooks
        from minipar.parallel.zero.shard import units_table

        units = [u for units in self.chunk_units for u in units]
        self.zero_hooks = ZeroHooks(3, comm, self.stage_layout.size, (lo, hi), self.states,
                                    units_table(units, self.stage_layout),
                                    dtype=self.states.policy.param_dtype, accumulate=True)

    def stage_hooks(self) -> Any:
        """ZeRO-2: views of the full parameters, gradients added to a full buffer made for
        this step; ZeRO-3: ZeRO's all-gathering hooks; else the executor's own."""
        if self.zero == 2:
            from minipar.parallel.pipeline.stage import StageHooks

            lay = self.stage_layout
            self._acc = np.zeros(lay.size, self.full_buf.dtype)
            self.grad_accumulation_bytes = int(self._acc.nbytes)
            return StageHooks(lay.unflatten(self.full_buf), lay.unflatten(self._acc))
        return self.zero_hooks if self.zero == 3 else None

    def unit_spans(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """ZeRO-3's all-gathers: ([lo, hi) of each unit of my stage in its flat buffer,
        those of the units remat recomputes in backward, gathered once more)."""
        from minipar.nn.units import spans as unit_spans

        units = [u for units in self.chunk_units for u in units]
        at = dict(zip((u.name for u in units), unit_spans(units, self.stage_layout)))
        return list(at.values()), [at[u.name] for u in self.recomputed_units()]

    def recomputed_units(self) -> list[Any]:
        """Units whose forward runs again in backward: remat=True recomputes each chunk as
        one segment, remat=k all but the chunk's last segment of k units (pipeline.stage)."""
        remat, out = self.stage_memory.remat, []
        for units in self.chunk_units:
            n = len(units)
            if remat is True:
                out += list(units)
            elif remat:
                k = min(remat, n)
                out += list(units[:(-(-n // k) - 1) * k])
        return out

    def recomputed_blocks(self) -> int:
        """Transformer blocks among :meth:`recomputed_units`."""
        return sum(u.name.startswith("block") for u in self.recomputed_units())

    def model_state_bytes(self) -> dict[str, int]:
        """Params, grads and optimizer states this rank holds between steps (bytes; ZeRO-2's
        full gradient buffer of the step is ``grad_accumulation_bytes``)."""
        out = self.states.bytes_by_category()
        if self.zero == 2:
            out["params"] = int(self.full_buf.nbytes)
        return out

    def zero_state(self, placements: dict[str, Shard]) -> State:
        """ZeRO-2/3's :class:`~minipar.parallel.engine.State`: the states over my range
        [lo, hi) of the stage's flat buffer, one :class:`~minipar.parallel.engine.Shard` per
        tensor it overlaps (``placements``: where each local tensor sits in the serial
        one); ZeRO-2's parameters: the whole full buffer, tensor by tensor (views)."""
        lo, hi = self.zero_range
        lay = self.stage_layout
        mine = model_states(self.states)  # one container "shard": flat arrays over [lo, hi)
        st = State(scalars=dict(mine.scalars))
        if self.zero == 2:
            full = lay.unflatten(self.full_buf)
            for n in lay.names:
                st.arrays[("param", placements[n].name)] = (placements[n], full[n])
        for (kind, _), (_, flat) in mine.arrays.items():
            if kind == "param" and self.zero == 2:
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

    def load_zero_state(self, sources: Iterable[State], placements: dict[str, Shard]) -> None:
        """ZeRO-2/3: fill my range (ZeRO-2: and the full parameters) from the overlapping
        pieces of ``sources`` (any layout's states), then the optimizer's t and the loss
        scale (:func:`minipar.parallel.engine.load_model_states` does the same for one
        container of whole tensors)."""
        sources = list(sources)
        load_pieces(self.zero_state(placements), sources)
        scalars: dict[str, Any] = {}
        for s in sources:
            scalars.update(s.scalars)
        st = self.states
        if "optimizer.t" in scalars:
            st.optimizer.t = int(scalars["optimizer.t"])
        if st.scaler is not None and "scaler.scale" in scalars:
            st.scaler.scale = float(scalars["scaler.scale"])
            st.scaler.good_steps = int(scalars["scaler.good_steps"])
            st.scaler.skipped = int(scalars["scaler.skipped"])
