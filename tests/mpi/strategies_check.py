"""Every strategy through ``strategies.build`` on this world size: the engine interface.

For each case whose grid fills the world: 3 steps against the serial engine (the parity
verdict on losses and ``full_params``), ``full_params`` the same on every rank,
``memory()`` a dict of byte counts, ``traffic()`` equal to what the traced communicator
counted, and ``state_dict`` -> a fresh engine -> ``load_state_dict``: its next step's
loss and the parameters after it equal, to the bit, those of the engine that went on.

``MINIPAR_CASES=first``: only the first case of each strategy that fits the world (the
device stand-in's run, ``MINIPAR_BACKEND=strict``); rank 0 prints ``DIGEST <case>
<sha256>`` of the final parameters, so a run on NumPy and one on the stand-in can be
compared to the bit.  On a device backend, every operation of a step either staged
through host memory exactly the bytes it sent (device->host) and received
(host->device): it moved device arrays (the gradients, the activations); or staged
none: it moved host values (a loss, a count).  Some bytes of every step were staged.

Under CuPy (a real GPU) the engine's arithmetic is not reproducible to the bit: the
embedding's gradient is a scatter-add (``xp.add.at``) that CuPy adds with atomics, in
an order that varies from run to run, as PyTorch's embedding backward does without
deterministic algorithms.  There, "to the bit" becomes "within 1e-12 relative"; the
parity verdict against the serial run is the same everywhere.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar import backend
from minipar.backend import to_host
from minipar.comm import TracedComm
from minipar.comm.topology import Grid, Layout
from minipar.parallel import strategies
from minipar.parallel.common import EMBEDDED, RunSpec
from minipar.parallel.engine import State
from minipar.parallel.parity import compare

N = MPI.COMM_WORLD.Get_size()
c = Checks("STRATEGIES")
#: whether two runs of the same computation agree to the bit (not with CuPy's atomics)
EXACT = backend.name != "cupy"

#: strategy -> cases: (grid sizes, the strategy's options, RunSpec changes); a case runs
#: on the world size its grid's product gives (no sizes: on every world size, each rank
#: alone, as the serial engine does)
CASES: dict[str, list[tuple[dict, dict, dict]]] = {
    "serial": [({}, {}, {}), ({}, {}, {"precision": "mixed"}),
               ({}, {"routing": (2,)}, {"experts": 4, "top_k": 2, "capacity_factor": 1.0})],
    # data parallelism (DDP)
    "dp": [({"dp": 1}, {}, {}), ({"dp": 2}, {"bucket_bytes": 4096, "algorithm": "ring"}, {}),
           ({"dp": 4}, {}, {}), ({"dp": 8}, {"bucket_bytes": 4096, "overlap": False}, {}),
           ({"dp": 4}, {"bucket_bytes": 4096},
            {"experts": 4, "top_k": 2, "capacity_factor": 1.0, "routing": (4,)}),
           ({"dp": 2}, {}, {"precision": "mixed"})],  # round trip, evaluate; no parity
    # the parameter server
    "ps": [({"dp": 2}, {}, {}), ({"dp": 4}, {"servers": 2}, {})],
    # ZeRO 0-3
    "zero": [({"dp": 1}, {"stage": 3}, {}), ({"dp": 2}, {"stage": 0}, {}),
             ({"dp": 2}, {"stage": 2}, {"experts": 4, "top_k": 2, "capacity_factor": 1.0,
                                        "routing": (2,)}),
             ({"dp": 4}, {"stage": 1}, {}),
             ({"dp": 4}, {"stage": 3, "offload_optimizer": "host"}, {}),
             ({"dp": 8}, {"stage": 2}, {})],
    # tensor parallelism
    "tp": [({"tp": 1}, {}, {}), ({"tp": 2}, {}, {}), ({"tp": 4}, {}, {"heads": 4, "vocab": 12}),
           ({"dp": 2, "tp": 2}, {}, {}),
           ({"dp": 2, "tp": 2}, {}, {"experts": 4, "top_k": 2, "capacity_factor": 1.0,
                                     "routing": (2,)}),
           ({"dp": 2, "tp": 4}, {}, {"heads": 4, "vocab": 12})],
    # tensor + sequence parallelism
    "sp": [({"tp": 1}, {}, {}), ({"tp": 2}, {}, {}), ({"tp": 4}, {}, {"heads": 4, "vocab": 12}),
           ({"dp": 2, "tp": 2}, {}, {}), ({"dp": 2, "tp": 4}, {}, {"heads": 4, "vocab": 12})],
    # context parallelism
    "cp": [({"cp": n}, {"kind": "ring", "zigzag": False}, {"seq": 16}) for n in (1, 2, 4, 8)]
    + [({"cp": n}, {"kind": "ulysses"}, {"seq": 16, "heads": max(n, 2)}) for n in (1, 2, 4, 8)]
    + [({"cp": 4}, {"kind": "ring", "zigzag": True}, {"seq": 16})],
    # pipeline parallelism
    "pp": [({"pp": 1}, {"schedule": "gpipe", "micro_batches": 2}, {}),
           ({"pp": 2}, {"schedule": "1f1b", "micro_batches": 3}, {}),
           ({"pp": 2}, {"schedule": "gpipe", "micro_batches": 2},
            {"experts": 2, "routing": (1, 2)}),
           ({"pp": 4}, {"schedule": "interleaved", "micro_batches": 4, "chunks": 2},
            {"layers": 8}),
           ({"dp": 2, "pp": 2}, {"schedule": "1f1b", "micro_batches": 2, "remat": True},
            {"experts": 2, "routing": (2, 2)})],
    # expert parallelism: each data-parallel rank's rows are one routing group, (dp,)
    "ep": [({"dp": 1, "ep": 1}, {}, {"experts": 4}),
           ({"dp": 2, "ep": 2}, {}, {"experts": 4, "routing": (2,)}),
           ({"dp": 4, "ep": 2}, {}, {"experts": 4, "routing": (4,)}),
           ({"dp": 4, "ep": 4}, {}, {"experts": 4, "routing": (4,)}),
           ({"dp": 4, "ep": 2}, {}, {"experts": 4, "top_k": 2, "capacity_factor": 1.0,
                                     "routing": (4,)}),
           ({"dp": 8, "ep": 4}, {}, {"experts": 4, "routing": (8,)})],
    # hybrid
    "hybrid": [({"dp": 2, "pp": 2}, {"micro_batches": 2, "zero": 1}, {"layers": 4}),
               ({"pp": 2, "cp": 2}, {"micro_batches": 2}, {}),
               ({"dp": 2, "pp": 2, "tp": 2}, {"micro_batches": 2}, {"vocab": 8, "batch": 8})],
}
#: every family once more on real text (the embedded corpus, bytes: vocabulary 256)
TEXT = {"text": EMBEDDED, "vocab": 256, "seq": 16}
CASES["dp"].append(({"dp": 2}, {}, TEXT))
CASES["zero"].append(({"dp": 4}, {"stage": 3}, TEXT))
CASES["tp"].append(({"tp": 2}, {}, TEXT))
CASES["cp"].append(({"cp": 2}, {"kind": "ring", "zigzag": True}, TEXT))
CASES["pp"].append(({"pp": 2}, {"schedule": "1f1b", "micro_batches": 2}, TEXT))
CASES["ep"].append(({"dp": 2, "ep": 2}, {}, {**TEXT, "experts": 4, "routing": (2,)}))
CASES["hybrid"].append(({"dp": 2, "pp": 2, "tp": 2}, {"micro_batches": 2},
                        {**TEXT, "batch": 8}))
#: every family once more in FP8 (DeepSeek-V3's block scaling, minipar.nn.fp8) with tiles
#: of 6: d_model 16 = 6 + 6 + a tail of 4, shards of 8 (tp 2) or 4 (cp 2) cut tiles, whose
#: amax the ranks reduce; held to the FP8 tolerance (minipar.parallel.parity)
FP8 = {"precision": "fp8", "fp8_block": 6}
#: per tensor (Micikevicius et al. 2022): each GEMM input's amax all-reduced over the ranks
#: holding its parts: the rows (dp, ZeRO), the tokens (cp), the tp slices and their channels
TENSOR = {"precision": "fp8", "fp8_scaling": "tensor"}
CASES["dp"] += [({"dp": 2}, {}, FP8), ({"dp": 4}, {}, FP8), ({"dp": 2}, {}, TENSOR)]
CASES["zero"].append(({"dp": 2}, {"stage": 3}, TENSOR))
CASES["zero"] += [({"dp": 2}, {"stage": 1}, FP8), ({"dp": 4}, {"stage": 3}, FP8)]
CASES["tp"] += [({"tp": 2}, {}, FP8),
                ({"dp": 2, "tp": 2}, {}, {**FP8, "fp8_block": 8, "experts": 4, "top_k": 2,
                                          "capacity_factor": 1.0, "routing": (2,)})]
CASES["sp"] += [({"tp": 2}, {}, FP8), ({"tp": 4}, {}, {**FP8, "heads": 4, "vocab": 12})]
CASES["cp"] += [({"cp": 2}, {"kind": "ring", "zigzag": True}, {**FP8, "seq": 16}),
                ({"cp": 4}, {"kind": "ulysses"}, {**FP8, "seq": 16, "heads": 4})]
CASES["pp"] += [({"pp": 2}, {"schedule": "1f1b", "micro_batches": 2}, FP8),
                ({"dp": 2, "pp": 2}, {"schedule": "gpipe", "micro_batches": 2}, FP8)]
CASES["ep"] += [({"dp": 2, "ep": 2}, {}, {**FP8, "experts": 4, "routing": (2,)}),
                ({"dp": 4, "ep": 2}, {}, {**FP8, "experts": 4, "routing": (4,)})]
CASES["hybrid"] += [({"dp": 2, "pp": 2}, {"micro_batches": 2, "zero": 1}, {**FP8, "layers": 4}),
                    ({"cp": 2, "tp": 2}, {}, {**FP8, "seq": 16, "heads": 4, "vocab": 8,
                                              "batch": 8})]
CASES["tp"].append(({"tp": 2}, {}, TENSOR))
CASES["sp"].append(({"tp": 2}, {}, TENSOR))
CASES["cp"].append(({"cp": 2}, {"kind": "ring", "zigzag": True}, {**TENSOR, "seq": 16}))
CASES["hybrid"].append(({"cp": 2, "tp": 2}, {}, {**TENSOR, "seq": 16, "heads": 4, "vocab": 8,
                                                 "batch": 8}))  # one pass: pp 1, m 1


def digest(params: dict) -> str:
    h = hashlib.sha256()
    for k, v in params.items():
        h.update(k.encode())
        h.update(np.ascontiguousarray(to_host(v)).tobytes())
    return h.hexdigest()


def close(a: dict, b: dict) -> bool:
    """Every tensor of ``a`` within 1e-12 of ``b``'s, relative to the largest |value|."""
    for k in a:
        x, y = to_host(a[k]).astype(np.float64), to_host(b[k]).astype(np.float64)
        if x.size and np.abs(x - y).max() > 1e-12 * max(np.abs(x).max(), np.abs(y).max()):
            return False
    return True


def per_op(stats) -> dict[str, tuple[int, int, int, int]]:
    """operation -> (bytes sent, received, staged device->host, staged host->device)."""
    return {op: (s.bytes_sent, s.bytes_recv, s.staged_d2h, s.staged_h2d)
            for op, s in stats.ops.items()}


def copy_state(st: State) -> State:
    return State({k: (sh, a.copy()) for k, (sh, a) in st.arrays.items()},
                 dict(st.scalars))


def run(name: str, sizes: dict, options: dict, changes: dict) -> None:
    what = f"{name} {sizes or ''} {options or ''} {changes or ''}".strip()
    spec = RunSpec(**{"steps": 3, **changes})
    world = TracedComm(MPI.COMM_WORLD.Dup(), name="world")
    grid = Grid(world, **sizes) if sizes else None
    stats = world.stats
    eng = strategies.build(name, spec, grid, **options)
    eng.traffic()  # bytes since the last call: from here on
    sent, before = stats.bytes_sent(), per_op(stats)
    losses = [eng.step(spec.batch_at(0)).loss]
    t = eng.traffic()
    c.check(isinstance(t, dict) and sum(t.values()) == stats.bytes_sent() - sent,
            f"{what}: traffic {t} != counted {stats.bytes_sent() - sent}")
    step = {op: tuple(a - b for a, b in zip(v, before.get(op, (0, 0, 0, 0))))
            for op, v in per_op(stats).items()}
    for op, (s, r, d2h, h2d) in step.items():
        c.check((d2h, h2d) in {(s, r), (0, 0)} and (backend.device or d2h + h2d == 0),
                f"{what}: {op} sent, received {s}, {r}; staged each way {d2h}, {h2d}")
    moved = sum(s + r for s, r, _, _ in step.values())
    c.check(not (backend.device and moved) or any(d for _, _, d, _ in step.values()),
            f"{what}: nothing staged on a device backend")
    saved = copy_state(eng.state_dict())
    fresh = strategies.build(name, spec, grid, **options)
    fresh.load_state_dict(saved)
    a, b = eng.step(spec.batch_at(1)), fresh.step(spec.batch_at(1))
    c.check(a.loss == b.loss or not EXACT and abs(a.loss - b.loss) <= 1e-12 * abs(a.loss),
            f"{what}: loss after load_state_dict {b.loss!r} != {a.loss!r}")
    pa, pb = eng.full_params(), fresh.full_params()
    c.check(digest(pa) == digest(pb) or not EXACT and close(pa, pb),
            f"{what}: params after load_state_dict differ")
    losses.append(a.loss)
    losses += [eng.step(spec.batch_at(s)).loss for s in range(2, spec.steps)]
    params = eng.full_params()
    everyone = MPI.COMM_WORLD.allgather(digest(params))
    c.check(len(set(everyone)) == 1 or not EXACT and all(
        close(params, p) for p in MPI.COMM_WORLD.allgather(
            {k: to_host(v) for k, v in params.items()})),
            f"{what}: full_params differ between ranks")
    serial = strategies.build("serial", spec, None,
                              **({"routing": options["routing"]} if "routing" in options else {}))
    ref = [serial.step(spec.batch_at(s)).loss for s in range(spec.steps)]
    sp = serial.full_params()
    c.check(list(params) == list(sp), f"{what}: full_params names/order differ from serial")
    init = spec.initial_params()
    flat = lambda d: np.concatenate([to_host(d[k]).astype(np.float64).ravel() for k in sp])
    if spec.precision in ("float64", "fp8"):  # 16-bit sums round apart; FP8 its own bound
        v = compare(losses, ref, flat(params), flat(sp), flat(init),
                    fp8=spec.precision == "fp8")
        c.check(v.status == "equal", f"{what}: parity {v.status}: {v}")
    ev, ev_ref = eng.evaluate(spec.batch_at(9)), serial.evaluate(spec.batch_at(9))
    c.check(abs(ev - ev_ref) <= 1e-12 * abs(ev_ref) or (spec.precision != "float64"
                                                      and abs(ev - ev_ref) <= 1e-2 * abs(ev_ref)),
            f"{what}: evaluate {ev!r} != serial {ev_ref!r}")
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"DIGEST {name}{sizes}{options}{changes} {digest(params)}", flush=True)
    m = eng.memory()
    c.check(isinstance(m, dict) and m and all(isinstance(x, int) and x >= 0 for x in m.values()),
            f"{what}: memory() {m}")
    for e in (eng, fresh, serial):
        e.close()
    if grid is not None:
        grid.free()
    world.Free()


FIRST = os.environ.get("MINIPAR_CASES", "") == "first"
for name, cases in CASES.items():
    fitting = [case for case in cases  # dp·pp·cp·tp (ep is carved from dp·cp)
               if not case[0] or Layout(**case[0]).world == N]
    for sizes, options, changes in fitting[:1] if FIRST else fitting:
        run(name, sizes, options, changes)
c.summary()
