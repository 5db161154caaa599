"""Where a walk's activations are — где лежат активации — 激活所在位置: bytes by place.

EN activation bytes by place (device, host, disk) · RU байты активаций по месту
(устройство, хост, диск) · ZH 按位置统计的激活字节（设备、主机、磁盘）

The measurement behind the formula :mod:`minipar.parallel.offload.activations`
states and tests/test_offload.py checks: with ``device₀`` the activation bytes a
plain walk holds after forward and ``M`` the bytes an offload moved out,

    device = device₀ − M,    host (or disk) = M,

read off the executor's ``kept`` list (:func:`kept_by_place`): each buffer once
(:func:`minipar.memory.bytes_by_place`, an offloaded buffer's handle counted in its
place), a remat segment's checkpoint once for all its units.
"""

from __future__ import annotations

from typing import Any

from minipar.memory import bytes_by_place
from minipar.parallel.remat import Segment, Whole

__all__ = ["kept_by_place"]


def kept_by_place(kept: list[Any]) -> dict[str, int]:
    """Activation bytes of an executor's ``kept`` list by place (device, host, disk),
    each buffer once; Checkpointing's segments (their checkpoint) and kept-whole units
    are looked into."""
    trees, seen = [], set()
    for k in kept:
        if isinstance(k, Segment):
            if id(k) not in seen:
                seen.add(id(k))
                trees.append(k.x)
        elif isinstance(k, Whole):
            trees.append(k.kept)
        else:
            trees.append(k)
    return bytes_by_place(trees)
