"""Sizes as people read them: decimal bytes with a unit, parameter counts in words.

EN human-readable sizes · RU размеры в удобочитаемом виде · ZH 人类可读的大小

Pure text formatting of numbers, shared by the planner's messages
(:mod:`minipar.plan.search`) and the ``minipar plan`` tables
(:mod:`minipar.cli.plan_render`, :mod:`minipar.cli.plan_layouts`).  Decimal
units (kB = 10³ … PB = 10¹⁵); past 1000 PB or 1000 T, e-notation
(``1.60e+31 B``, ``1.00e+30``) replaces digit strings 30 characters long.
"""

from __future__ import annotations


def human_bytes(nbytes: float) -> str:
    """Decimal bytes with a unit: 15.0 GB, 960 GB, 2.00 TB; 1.60e+31 B past 1000 PB."""
    if nbytes >= 1e18:
        return f"{nbytes:.2e} B"
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:#.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{nbytes:.0f} B"


def human_count(n: float) -> str:
    """A parameter count in words: 7.50 B, 1.00 T, 124 M; 1.00e+30 past 1000 T."""
    if n >= 1e15:
        return f"{n:.2e}"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:#.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f}"
