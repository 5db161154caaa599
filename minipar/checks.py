"""Option and size rules, written once — проверки параметров — 参数检查.

Every engine, grid and command refuses a bad value the same way: a ``ValueError``
whose one line names the value as the user spelled it (``--lr``, ``Grid: tp``) and
what is allowed, raised on every rank before any message.  The command line turns
it into ``minipar run: --lr must be > 0, got 0.0`` and exit status 2.

    integer("--steps", 0, least=1)      # ValueError: --steps must be a positive integer, got 0
    real("--lr", 0.0, greater_than=0)   # ValueError: --lr must be > 0, got 0.0
    divides("--heads", 3, "--d-model", 16, "each head takes d_model / heads columns")
    one_of("--optimizer", "adam", ("adamw", "sgd"))
    integer("--zero", 4, 0, 3, why="ZeRO's stages")
    # ValueError: --zero must be an integer from 0 to 3 (ZeRO's stages), got 4

``why`` (``integer``, ``one_of``, ``divides``) carries the reason or the meaning of the
values, for the learner: it is what turns "must be 1 or 2" into "1 (Switch) or 2 (GShard)".

Imports nothing of minipar (layer 0), not even NumPy: ``numbers`` covers NumPy's
integer and floating types too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any


def is_integer(v: Any) -> bool:
    """An integer (Python's or NumPy's), and not a bool."""
    return isinstance(v, Integral) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    """A finite real number (int or float, Python's or NumPy's), and not a bool."""
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(float(v))


def bound(v: int) -> str:
    """A bound as a reader writes it: 1000000000000 -> 1e12."""
    if v >= 10**6 and str(v).rstrip("0") == "1":
        return f"1e{len(str(v)) - 1}"
    return str(v)


def integers(least: int | None = None, most: int | None = None) -> str:
    """What an integer in [least, most] is called in a message: ``a positive integer``,
    ``an integer from 0 to 3``, ``an integer >= 2``, ... (the option types of
    :mod:`minipar.cli.options` say it the same way)."""
    if least == 1 and most is None:
        return "a positive integer"
    if least is not None and most is not None:
        return f"an integer from {bound(least)} to {bound(most)}"
    if least is not None:
        return f"an integer >= {bound(least)}"
    if most is not None:
        return f"an integer <= {bound(most)}"
    return "an integer"


def integer(name: str, v: Any, least: int | None = None, most: int | None = None,
            why: str = "") -> int:
    """``v`` as an int; ValueError unless it is an integer in [least, most] (``why``: a hint
    after what is allowed, e.g. ``integer("--remat", -1, 0, why="0: ceil(sqrt n)")`` says
    ``--remat must be an integer >= 0 (0: ceil(sqrt n)), got -1``)."""
    want = integers(least, most)
    if not is_integer(v) or (least is not None and v < least) or (most is not None and v > most):
        raise ValueError(f"{name} must be {want}{_hint(why)}, got {v!r}")
    return int(v)


def real(name: str, v: Any, greater_than: float | None = None,
         at_least: float | None = None) -> float:
    """``v`` as a float; ValueError unless it is finite and > ``greater_than`` / >= ``at_least``."""
    if greater_than is not None and (not is_real(v) or not v > greater_than):
        raise ValueError(f"{name} must be > {greater_than:g}, got {v!r}")
    if at_least is not None and (not is_real(v) or not v >= at_least):
        raise ValueError(f"{name} must be >= {at_least:g}, got {v!r}")
    if not is_real(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def divides(divisor_name: str, divisor: int, name: str, value: int, why: str = "") -> None:
    """ValueError unless ``divisor`` divides ``value`` (``why``: the reason, for the learner)."""
    if value % divisor:
        raise ValueError(f"{divisor_name} {divisor} does not divide {name} {value}"
                         + (f": {why}" if why else ""))


def one_of(name: str, v: Any, choices: Iterable[Any], why: str = "") -> Any:
    """``v``; ValueError unless it is one of ``choices`` (``why``: what they mean, e.g.
    ``one_of("top_k", 3, (1, 2), why="1: Switch, 2: GShard")`` says
    ``top_k must be one of 1, 2 (1: Switch, 2: GShard); got 3``)."""
    choices = tuple(choices)
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}{_hint(why)}; "
                         f"got {v!r}")
    return v


def _hint(why: str) -> str:
    return f" ({why})" if why else ""


def known(who: str, given: Iterable[str], allowed: Iterable[str], why: str = "") -> None:
    """ValueError unless every name in ``given`` is one of ``allowed``: an engine's or a
    builder's keyword options, e.g. ``known("ZeRO", {"stag"}, ("stage", "offload"))`` says
    ``ZeRO takes no option stag; its options: stage, offload``."""
    allowed = tuple(allowed)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"{who} takes no option {', '.join(unknown)}; its options: "
                         f"{', '.join(allowed) or 'none'}{_hint(why)}")

