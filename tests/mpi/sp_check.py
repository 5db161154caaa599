"""Activation memory of one block on each rank, measured, for tests/test_sequence_parallel.py.

``launch.run(t, this file)``: every rank measures block 0 of a 16-bit GPT
(:func:`minipar.parallel.tensor_parallel.measure.activation_bytes_per_block`) under TP and
TP+SP; rank 0 prints one ``SP-ACT {json}`` line with every rank's figures.
"""

from __future__ import annotations

import json

from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.nn import GPTConfig
from minipar.parallel.tensor_parallel.measure import activation_bytes_per_block

comm = TracedComm(MPI.COMM_WORLD)
cfg = GPTConfig(vocab_size=16, block_size=128, n_layer=1, n_head=8, d_model=128,
                dtype="bfloat16")
out = {m: activation_bytes_per_block(comm, cfg, 2, m) for m in ("tp", "tp+sp")}
everyone = comm.comm.gather(out, root=0)
if comm.rank == 0:
    print("SP-ACT " + json.dumps(everyone), flush=True)
