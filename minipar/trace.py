"""Recorded timelines as Chrome trace events, the JSON that Perfetto and chrome://tracing open.

EN trace (timeline) · RU трасса (временная диаграмма) · ZH 追踪（时间线）

minipar records two kinds of timelines:

* a pipeline step — :class:`~minipar.parallel.pipeline.simulate.Record`
  ``(stage, what, micro_batch, chunk, start, end)``, from the simulator or
  the MPI executor (GPipe, Huang et al. 2018, arXiv 1811.06965; 1F1B,
  Narayanan et al. 2021, arXiv 2104.04473);
* a DDP step — per rank ``{"rank", "compute": [(piece, t0, t1)], "comm":
  [(bucket, t0, t1)]}`` (:mod:`minipar.parallel.data_parallel.measure`; Li et al. 2020,
  arXiv 2006.15704).

Both become the *trace event format* (Google, "Trace Event Format", the
format of chrome://tracing, Perfetto UI and ``torch.profiler``'s
``export_chrome_trace``): one JSON object ``{"traceEvents": [...]}`` whose
events are "complete" events ::

    {"name": "F3", "cat": "forward", "ph": "X", "ts": 12.0, "dur": 4.0,
     "pid": 0, "tid": 1, "args": {"micro_batch": 3, "chunk": 0}}

``ts`` (start) and ``dur`` in **microseconds**; ``pid`` a process (one
pipeline, or one DDP rank), ``tid`` a row inside it (a pipeline stage; a DDP
rank's compute or bucket lane), each named by a metadata event (``"ph": "M"``,
``process_name`` / ``thread_name``).  ``seconds`` says how many seconds one
time unit of the input is: 1 for measured timelines (perf_counter seconds),
e.g. 1e-3 to show a simulated timeline's unit costs as milliseconds.

Imports only the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: what a pipeline record's ``what`` is called in the trace (compute first, then messages)
LETTER = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}  # B, W: zero bubble


def _us(t: float, seconds: float) -> float:
    return round(float(t) * seconds * 1e6, 3)  # ns resolution: the JSON stays short


def _meta(kind: str, pid: int, name: str, tid: int | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _check_seconds(seconds: float) -> float:
    if not float(seconds) > 0:
        raise ValueError(f"seconds per time unit must be > 0, got {seconds!r}")
    return float(seconds)


def pipeline_events(timeline: Sequence[Sequence[Any]], seconds: float = 1.0, pid: int = 0,
                    name: str = "pipeline") -> list[dict[str, Any]]:
    """Trace events of a pipeline timeline: one row (``tid``) per stage; forwards ``F3``,
    backwards ``B3`` (``f3``/``b3`` on odd chunks), messages ``send_act 3`` and so on,
    the optimizer step ``optimizer``; ``cat`` is the record's ``what``."""
    seconds = _check_seconds(seconds)
    events = [_meta("process_name", pid, name)]
    if not timeline:
        return events
    t0 = min(r[4] for r in timeline)
    for s in sorted({r[0] for r in timeline}):
        events.append(_meta("thread_name", pid, f"stage {s}", tid=s))
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": s,
                       "args": {"sort_index": s}})
    for stage, what, mb, chunk, start, end in (tuple(r) for r in timeline):
        if end < start:
            raise ValueError(f"stage {stage} {what} micro-batch {mb} ends ({end}) before it "
                             f"starts ({start})")
        if what in LETTER:
            letter = LETTER[what] if not (chunk or 0) % 2 else LETTER[what].lower()
            label = f"{letter}{mb}"
        else:
            label = what if mb is None else f"{what} {mb}"
        events.append({"name": label, "cat": what, "ph": "X", "ts": _us(start - t0, seconds),
                       "dur": _us(end - start, seconds), "pid": pid, "tid": stage,
                       "args": {"micro_batch": mb, "chunk": chunk}})
    return events


def ddp_events(timelines: Sequence[Mapping[str, Any]], seconds: float = 1.0,
               name: str = "DDP", comm_lane: str = "bucket all-reduce",
               comm_label: str = "bucket {}") -> list[dict[str, Any]]:
    """Trace events of DDP step timelines (one per rank): ``pid`` = rank, ``tid`` 0 the
    backward pieces and the optimizer, ``tid`` 1 the bucket all-reduces (``comm_lane``,
    each labelled ``comm_label.format(piece)``: ZeRO-3's gathers and scatters too)."""
    seconds = _check_seconds(seconds)
    events: list[dict[str, Any]] = []
    starts = [t0 for tl in timelines for key in ("compute", "comm") for _, t0, _ in tl[key]]
    origin = min(starts, default=0.0)
    for i, tl in enumerate(timelines):
        rank = tl.get("rank", i)
        events += [_meta("process_name", rank, f"{name} rank {rank}"),
                   _meta("thread_name", rank, "compute", tid=0),
                   _meta("thread_name", rank, comm_lane, tid=1)]
        for lane, key in ((0, "compute"), (1, "comm")):
            for piece, t0, t1 in tl[key]:
                label = str(piece) if key == "compute" else comm_label.format(piece)
                events.append({"name": label, "cat": key, "ph": "X",
                               "ts": _us(t0 - origin, seconds), "dur": _us(t1 - t0, seconds),
                               "pid": rank, "tid": lane, "args": {key: piece}})
    return events


def chrome_trace(events: Sequence[Mapping[str, Any]], **metadata: Any) -> dict[str, Any]:
    """The trace file's object: ``{"traceEvents": events, "displayTimeUnit": "ms", ...}``;
    extra keyword arguments go into ``otherData`` (shown by Perfetto as metadata)."""
    out: dict[str, Any] = {"traceEvents": list(events), "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = {k: v for k, v in metadata.items()}
    return out


def write(path: str | Path, events: Sequence[Mapping[str, Any]], **metadata: Any) -> Path:
    """Write :func:`chrome_trace` as JSON to ``path`` (its folder must exist); return it."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(events, **metadata)) + "\n")
    return path


def problems(trace: Mapping[str, Any]) -> list[str]:
    """What makes ``trace`` unreadable as a trace-event file ([] when it is well formed):
    a ``traceEvents`` list; complete events with a name, numeric ``ts`` >= 0 and
    ``dur`` >= 0 (µs), integer ``pid`` and ``tid``, a dict ``args``; metadata events
    naming a process or thread."""
    events = trace.get("traceEvents") if isinstance(trace, Mapping) else None
    if not isinstance(events, list):
        return ["no 'traceEvents' list"]
    out = []
    for i, ev in enumerate(events):
        ph = ev.get("ph") if isinstance(ev, Mapping) else None
        if ph == "M":
            if ev.get("name") not in ("process_name", "thread_name", "process_sort_index",
                                      "thread_sort_index") or not isinstance(ev.get("args"), dict):
                out.append(f"event {i}: a metadata event needs a known name and args: {ev}")
        elif ph == "X":
            num = all(isinstance(ev.get(k), (int, float)) and not isinstance(ev.get(k), bool)
                      and ev[k] >= 0 for k in ("ts", "dur"))
            ids = all(isinstance(ev.get(k), int) for k in ("pid", "tid"))
            if not (isinstance(ev.get("name"), str) and num and ids
                    and isinstance(ev.get("args", {}), dict)):
                out.append(f"event {i}: a complete event needs name, ts >= 0, dur >= 0 (µs), "
                           f"integer pid and tid, dict args: {ev}")
        else:
            out.append(f"event {i}: phase {ph!r} is neither 'X' (complete) nor 'M' (metadata)")
    return out


__all__ = ["chrome_trace", "ddp_events", "pipeline_events", "problems", "write"]
