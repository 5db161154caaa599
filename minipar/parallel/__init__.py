"""Parallel training strategies, one file per technique.

Each module reproduces the serial model (:mod:`minipar.nn`) exactly on any
world size it supports, and its tests say which serial computation it
reproduces.  A technique plugs into the one walk over the model
(:mod:`minipar.nn.executor`) through hooks, never by copying it; whether a
run equals the serial one is decided in one place (:mod:`minipar.parallel.parity`).
What ``minipar run`` needs to start a technique (its options, checks and
measurements) lives beside the command, in :mod:`minipar.run`.
"""
