"""A GPU cluster as the layout planner sees it: GPUs per node, memory, links, peak FLOP/s.

EN cluster description · RU описание кластера · ZH 集群描述

Nine numbers describe the machine :mod:`minipar.plan.layouts` plans for:

=========================  ====================================================  ==========
field                      meaning                                               unit
=========================  ====================================================  ==========
``gpus_per_node``          GPUs in one server (the NVLink domain)                count
``memory_gb``              memory of one GPU                                     GB (10⁹ B)
``intra_node_gbps``        bandwidth one GPU sends at inside a node, one way     GB/s
``inter_node_gbps``        bandwidth one GPU sends at to other nodes, one way    GB/s
``peak_tflops``            dense 16-bit tensor-core peak of one GPU              TFLOP/s
``intra_node_latency_us``  α of one message inside a node (default 2)            µs
``inter_node_latency_us``  α of one message between nodes (default 5)            µs
``efficiency``             share of the peak the largest GEMMs reach             0 < e ≤ 1
                           (default: the fitted η of :mod:`~minipar.plan.calibration`)
``hbm_gbps``               memory (HBM) bandwidth of one GPU (default 2039)       GB/s
=========================  ====================================================  ==========

A message of S bytes costs α + S/β (the α-β model; Hockney 1994): NVLink's
inside a node; across nodes the network's α and, for a group with g ranks in
each node, g × ``inter_node_gbps`` (:func:`minipar.plan.step_time.group_bandwidth`).
The presets, with the datasheet figure each number comes from:

- ``dgx-a100`` (also ``a100-80gb``): 8 × A100 SXM4 80GB (NVIDIA A100 datasheet: 80 GB HBM2e,
  2039 GB/s, 312 TFLOP/s dense BF16/FP16 tensor core).  NVLink 3 through NVSwitch:
  12 links × 25 GB/s = 300 GB/s per direction per GPU (the "600 GB/s" of
  the datasheet counts both directions).  Between nodes: 8 × ConnectX-6
  HDR InfiniBand 200 Gb/s per node (DGX A100 datasheet), one per GPU:
  200 Gb/s = 25 GB/s per GPU, 200 GB/s per node.  The cluster of PTD-P
  (Narayanan et al. 2021, arXiv 2104.04473) and Korthikanti et al. 2022.
- ``a100-40gb``: DGX A100 with the 40 GB A100 SXM4 (A100 datasheet: 40 GB HBM2,
  1555 GB/s; the same 312 TFLOP/s, NVLink and HDR links as ``dgx-a100``).
- ``h100``: DGX H100, 8 × H100 SXM5 80GB (H100 datasheet: 80 GB HBM3, 3.35 TB/s,
  989 TFLOP/s dense BF16, 1979 with sparsity).  NVLink 4: 18 links × 25 GB/s = 450 GB/s
  per direction (900 GB/s both).  8 × ConnectX-7 NDR 400 Gb/s = 50 GB/s per
  GPU, 400 GB/s per node.
- ``h200``: DGX H200, 8 × H200 SXM (H200 datasheet: 141 GB HBM3e, 4.8 TB/s, the
  H100's 989 TFLOP/s dense BF16 and NVLink 4), 8 × ConnectX-7 NDR 400 Gb/s.

The latencies (2 µs in a node, 5 µs across) are not datasheet numbers: they
are order-of-magnitude assumptions (NCCL's small-message latency is a few
µs); the GEMM efficiency is the constant fitted on PTD-P's Table 1
(:mod:`minipar.plan.calibration`, docs/plan-calibration.md).  Set any of them
in a cluster file.

Read from a preset name, a JSON file, a flat TOML file (``key = value``
lines, ``#`` comments, an optional ``[cluster]`` header), or ``key=value,...``
text.  A missing, unknown, non-numeric or non-positive field is one
``ValueError`` that names it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from minipar.plan.calibration import CONSTANTS

REQUIRED = ("gpus_per_node", "memory_gb", "intra_node_gbps", "inter_node_gbps", "peak_tflops")
OPTIONAL = {"intra_node_latency_us": 2.0, "inter_node_latency_us": 5.0,
            "efficiency": CONSTANTS["gemm_efficiency"], "hbm_gbps": 2039.0}
FIELDS = REQUIRED + tuple(OPTIONAL)


@dataclass(frozen=True)
class Cluster:
    """One cluster, in SI units: bytes, bytes/s, seconds, FLOP/s (see the module table)."""

    name: str
    gpus_per_node: int
    memory_bytes: float
    intra_bw: float
    inter_bw: float
    peak_flops: float
    intra_alpha: float
    inter_alpha: float
    efficiency: float
    hbm_bw: float = 2039e9

    def bandwidth(self, within_node: bool) -> float:
        """β in bytes/s of a group inside one node (NVLink) or spanning nodes (network)."""
        return self.intra_bw if within_node else self.inter_bw

    def latency(self, within_node: bool) -> float:
        """α in seconds of one message inside a node or between nodes."""
        return self.intra_alpha if within_node else self.inter_alpha

    def as_fields(self) -> dict[str, float | str]:
        """The cluster in the file's units (GB, GB/s, TFLOP/s, µs), for --json and tables."""
        d = asdict(self)
        return {"name": d["name"], "gpus_per_node": self.gpus_per_node,
                "memory_gb": self.memory_bytes / 1e9, "intra_node_gbps": self.intra_bw / 1e9,
                "inter_node_gbps": self.inter_bw / 1e9, "peak_tflops": self.peak_flops / 1e12,
                "intra_node_latency_us": self.intra_alpha * 1e6,
                "inter_node_latency_us": self.inter_alpha * 1e6, "efficiency": self.efficiency,
                "hbm_gbps": self.hbm_bw / 1e9}


_A100 = {"gpus_per_node": 8, "memory_gb": 80, "intra_node_gbps": 300, "inter_node_gbps": 25,
         "peak_tflops": 312, "hbm_gbps": 2039}
_H100 = {"gpus_per_node": 8, "memory_gb": 80, "intra_node_gbps": 450, "inter_node_gbps": 50,
         "peak_tflops": 989, "hbm_gbps": 3350}
PRESETS: dict[str, dict[str, float]] = {
    "dgx-a100": _A100,
    "a100-80gb": _A100,
    "a100-40gb": {**_A100, "memory_gb": 40, "hbm_gbps": 1555},
    "h100": _H100,
    "h200": {**_H100, "memory_gb": 141, "hbm_gbps": 4800},
}


def cluster_from_fields(fields: dict[str, object], name: str = "custom") -> Cluster:
    """A :class:`Cluster` from the file's fields (units of the module table); ValueError naming
    the first missing, unknown, non-numeric or non-positive field."""
    unknown = [k for k in fields if k not in FIELDS]
    if unknown:
        raise ValueError(f"cluster: unknown field {unknown[0]!r}; the fields are "
                         f"{', '.join(FIELDS)}")
    v: dict[str, float] = {}
    for k in (k for k in FIELDS if k in fields or k in OPTIONAL):
        raw = fields.get(k, OPTIONAL.get(k))
        try:
            x = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(raw, bool) or not math.isfinite(x) or x <= 0:
            raise ValueError(f"cluster: field {k!r} must be a number > 0, got {raw!r}")
        v[k] = x
    missing = [k for k in REQUIRED if k not in fields]
    if missing:
        raise ValueError(f"cluster: field {missing[0]!r} is missing (required: "
                         f"{', '.join(REQUIRED)})")
    if v["gpus_per_node"] != int(v["gpus_per_node"]):
        raise ValueError(f"cluster: field 'gpus_per_node' must be a whole number, "
                         f"got {fields['gpus_per_node']!r}")
    if v["efficiency"] > 1:
        raise ValueError(f"cluster: field 'efficiency' is a share of the peak, from 0 to 1, "
                         f"got {fields['efficiency']!r}")
    return Cluster(name=name, gpus_per_node=int(v["gpus_per_node"]),
                   memory_bytes=v["memory_gb"] * 1e9, intra_bw=v["intra_node_gbps"] * 1e9,
                   inter_bw=v["inter_node_gbps"] * 1e9, peak_flops=v["peak_tflops"] * 1e12,
                   intra_alpha=v["intra_node_latency_us"] / 1e6,
                   inter_alpha=v["inter_node_latency_us"] / 1e6, efficiency=v["efficiency"],
                   hbm_bw=v["hbm_gbps"] * 1e9)


def _scalar(text: str) -> object:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'":
        return t[1:-1]
    try:
        return float(t.replace("_", ""))
    except ValueError:
        return t


def parse_flat_toml(text: str) -> dict[str, object]:
    """``key = value`` lines (``#`` comments, an optional ``[cluster]`` header) -> a dict."""
    out: dict[str, object] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line or line == "[cluster]":
            continue
        if "=" not in line:
            raise ValueError(f"cluster file line {n}: expected key = value, got {line!r}")
        k, val = line.split("=", 1)
        out[k.strip()] = _scalar(val)
    return out


def parse_key_values(text: str) -> dict[str, object]:
    """``gpus_per_node=8,memory_gb=80,...`` -> a dict (values not yet checked)."""
    out: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"cluster: expected key=value, got {part!r}")
        k, val = part.split("=", 1)
        out[k.strip()] = _scalar(val)
    return out


def load_cluster(spec: str) -> Cluster:
    """A preset name (:data:`PRESETS`), a ``.json`` / ``.toml`` file, or key=value text."""
    s = str(spec).strip()
    if s.lower() in PRESETS:
        return cluster_from_fields(PRESETS[s.lower()], s.lower())
    path = Path(s)
    if path.suffix.lower() in (".json", ".toml") or path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"cluster: cannot read {s!r} ({e.strerror or e})") from None
        if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            try:
                fields = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"cluster: {s} is not valid JSON ({e.msg}, line {e.lineno})"
                                 ) from None
            if not isinstance(fields, dict):
                raise ValueError(f"cluster: {s} must hold one JSON object of fields")
        else:
            fields = parse_flat_toml(text)
        return cluster_from_fields(fields, path.stem)
    if "=" in s:
        return cluster_from_fields(parse_key_values(s))
    raise ValueError(f"cluster: {s!r} is neither a preset ({', '.join(PRESETS)}), a file that "
                     "exists, nor key=value text such as gpus_per_node=8,memory_gb=80,...")
