"""Exercise: DeepSeek-V3's routing with the auxiliary-loss-free bias (ends notebook 08).

EN loss-free balancing · RU балансировка без вспомогательной потери · ZH 无辅助损失负载均衡

Grade it (2 ranks at least: on one the loads need no message):

    minipar exercise check loss_free_balancing loss_free_balancing.py -n 2

THE SETTING (DeepSeek-V3, arXiv 2412.19437, §2.1.2; Wang et al. 2024, arXiv 2408.15664)
    A mixture of experts with E experts and sigmoid scores s = sigmoid(u·W) (given:
    ``x``, this rank's tokens, shape (tokens, E)).  Each expert has a bias b_i
    (``bias``, the same on every rank) that steers which experts a token takes, and
    nothing else.  The tokens of one training step are spread over the N ranks.

THE GOAL
    loss_free_step(comm, x, bias, top_k, rate) returns pack(order, gates, new_bias):
    * order (tokens, k): each of YOUR tokens' k experts, the k largest s + b, best
      first, ties to the lower index;
    * gates (tokens, k): the chosen s (without the bias) divided by their sum;
    * new_bias (E,): b_i + rate · sign(mean load − load_i), the loads = how many top-k
      choices each expert got over the WHOLE step (every rank's tokens), sign(0) = 0;
      the same on every rank.
    All must equal minipar.nn.moe_routing (choose, gates, update_bias) on all ranks'
    tokens at once.  Leave x and bias untouched.

WHY IT WORKS
    The bias is a controller, not a weight: an overloaded expert's b goes down by u, an
    underloaded one's up, until the choices even out.  It has no gradient, so it must
    not enter the gates (the loss would see every nudge of the controller).  And it
    must see the step's real loads: one rank's tokens are a sample, and ranks that
    update from different samples end with different biases.

WHAT THE GRADER MEASURES
    * The result against the serial routing on all ranks' tokens, several sizes; a
      wrong result is named when it matches a known mistake (the bias added to the
      gates, the choice made without the bias, the loads of one rank only, the sign
      reversed).
    * The traffic: one all-reduce of E loads, 2(N-1) x S bytes over all ranks for
      S = E x 8 bytes.
    * No MPI collectives (comm.Allreduce ...): use allreduce() below.
    Stuck?  minipar exercise hint loss_free_balancing   (level 1, 2, 3)
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import numpy as np


def allreduce(comm, a: np.ndarray) -> np.ndarray:
    """GIVEN: ring all-reduce (sum) of ``a`` over the ranks; a new array, ``a`` untouched."""
    n, r = comm.Get_size(), comm.Get_rank()
    y = a.copy()
    chunks = np.array_split(y.reshape(-1), n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):  # reduce-scatter
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        buf = np.empty_like(recv)
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        recv += buf
    for s in range(n - 1):  # all-gather
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
    return y


def pack(*arrays: np.ndarray) -> np.ndarray:
    """GIVEN: the results as one flat float64 array (the grader compares one array)."""
    return np.concatenate([np.ravel(a).astype(np.float64) for a in arrays])


def loss_free_step(comm, x: np.ndarray, bias: np.ndarray, top_k: int,
                   rate: float) -> np.ndarray:
    """pack(order, gates, new_bias) for this rank's tokens and the whole step's loads."""
    E = x.shape[1]  # x: this rank's tokens' scores s (tokens, E)
    # TODO 1: the top-k experts of each token by s + b (ties: lower index)
    # TODO 2: the gates: the chosen s, normalised (no bias)
    # TODO 3: this rank's loads, summed over the ranks (one allreduce), the new bias
    raise NotImplementedError("TODO: the loss-free routing step")
