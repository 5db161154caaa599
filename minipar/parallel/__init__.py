"""Parallel training strategies, one file per technique.

Each module reproduces the serial model (:mod:`minipar.nn`) exactly on any
world size it supports, and its tests say which serial computation it
reproduces.  A strategy that ``minipar run`` can start exposes
``run_worker(options: dict) -> dict | None`` (see :mod:`minipar.run`).
"""
