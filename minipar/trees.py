"""The one walk over nested ``saved`` — обход вложенных активаций — 遍历嵌套的激活.

A unit's ``saved`` (its activations, for the backward) is a tree: dicts, tuples and
lists whose leaves are arrays (NumPy, CuPy, or an offload handle's view).  Memory
ledgers count its buffers, activation checkpointing drops and rebuilds it, offloading
moves each buffer out and back — all through these three functions:

    arrays(tree)           every array leaf, in order (dict values, list items)
    owner(a)               the array that owns ``a``'s memory (views share their owner's)
    map_arrays(tree, f)    the same tree with every array leaf replaced by ``f(leaf)``

An array is anything with ``nbytes`` and ``dtype`` (duck-typed: this module imports
nothing, not even NumPy).  Views count once: a ledger counts ``owner(a)``, not ``a``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def is_array(a: Any) -> bool:
    """Anything with ``nbytes`` and ``dtype``: a NumPy or CuPy array, an offloaded view."""
    return hasattr(a, "nbytes") and hasattr(a, "dtype")


def owner(a: Any) -> Any:
    """The array that owns ``a``'s memory (``a`` itself if it is no view)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
        a = a.base
    return a


def arrays(tree: Any) -> Iterator[Any]:
    """Every array in a nested dict/list/tuple, depth first, in order."""
    if is_array(tree):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from arrays(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from arrays(v)


def map_arrays(tree: Any, f: Callable[[Any], Any],
               leaf: Callable[[Any], bool] = is_array) -> Any:
    """``tree`` rebuilt with every leaf (``leaf(x)`` true) replaced by ``f(x)``; dicts,
    lists and tuples keep their type, anything else stays as it is."""
    if leaf(tree):
        return f(tree)
    if isinstance(tree, dict):
        return {k: map_arrays(v, f, leaf) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_arrays(v, f, leaf) for v in tree)
    return tree
