"""Routing as DeepSeek-V3 trains it — маршрутизация как в DeepSeek-V3 — DeepSeek-V3 的路由.

EN shared experts, sigmoid routing, loss-free balancing, dropless, node-limited routing ·
RU общие эксперты, сигмоидная маршрутизация, балансировка без потерь, без отбрасывания,
маршрутизация с ограничением по узлам · ZH 共享专家、sigmoid 路由、无辅助损失均衡、无丢弃、
节点受限路由

The pieces the serial MoE block (:mod:`minipar.nn.moe_steps`) composes with its
Switch/GShard router, each a forward and, where it has one, its backward:

* **scores** (:func:`affinities`): ``softmax`` P = softmax(u·W) (Switch, GShard) or
  ``sigmoid`` s = sigmoid(u·W) (DeepSeek-V3, arXiv 2412.19437, §2.1.2), no bias term;
* **node-limited routing** (:func:`group_mask`, V3 §2.1.2): the E experts in G groups
  (the experts of some ranks); a group's score is the sum of its highest K_r/M
  affinities (the paper's rule; DeepSeek's released ``inference/model.py`` ranks the
  groups by the *biased* scores s + b, top-2 per group), a token's top-k taken within
  its best M groups, so its all-to-all reaches at most M groups;
* **selection** (:func:`choose`): the top-k of s + b (b the loss-free bias, ties to
  the lower index), within the allowed groups;
* **gates** (:func:`gates`): softmax top-1: g = P (Switch); otherwise the chosen
  scores divided by their sum, **without** the bias (the bias steers selection only);
  a sigmoid top-1 gate would be s/s = 1, no gradient for the router (refused);
* **balance losses**: Switch's α·E·Σ f_i·P_i (:func:`switch_loss`, f over first choices)
  and V3's sequence-wise α·Σ f_i·P_i (:func:`sequence_loss`, f_i = E/(K_r·T)·count,
  P_i the mean over a sequence of s' = s/Σs), each with its constant ∂/∂P;
* **auxiliary-loss-free balancing** (:func:`update_bias`, Wang et al. 2024, arXiv
  2408.15664, Algorithm 1): after a step, b_i ← b_i + u·sign(mean load − load_i), the
  loads = top-k assignments per expert over the whole step's batch, sign(0) = 0;
* **dropless** (MegaBlocks, Gale et al. 2022, arXiv 2211.15841): no capacity, each
  expert's buffer as long as its load (:func:`dropless_capacity`);
* **shared experts** (DeepSeekMoE, Dai et al. 2024, arXiv 2401.06066): S MLPs every
  token goes through, y += Σ_j Shared_j(u) (:func:`shared_forward`).
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.nn.mlp import mlp_backward, mlp_forward

__all__ = ["SCORES", "affinities", "affinities_backward", "balance_backward", "balance_losses",
           "choose", "dropless_capacity", "pack", "split_rows", "unpack",
           "gates", "gates_backward", "group_mask", "normalised", "normalised_backward",
           "sequence_loss", "shared_backward", "shared_forward", "switch_loss", "update_bias"]

SCORES = ("softmax", "sigmoid")


def affinities(logits: Any, scoring: str) -> Any:
    """s (N, E) from the router's logits: softmax over the experts, or sigmoid of each."""
    if scoring == "sigmoid":
        return 1.0 / (1.0 + xp.exp(-logits))
    s = logits - logits.max(axis=1, keepdims=True)
    xp.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s


def affinities_backward(s: Any, ds: Any, scoring: str) -> Any:
    """d(logits) from d(s)."""
    if scoring == "sigmoid":
        return ds * s * (1.0 - s)
    return s * (ds - (ds * s).sum(axis=1, keepdims=True))


def normalised(s: Any, scoring: str) -> Any:
    """The scores as a distribution over the experts: P itself, or s' = s / Σ_j s_j."""
    return s if scoring == "softmax" else s / s.sum(axis=1, keepdims=True)


def normalised_backward(s: Any, dprobs: Any, scoring: str) -> Any:
    """d(s) from d(:func:`normalised`)."""
    if scoring == "softmax":
        return dprobs
    total = s.sum(axis=1, keepdims=True)
    return (dprobs - (dprobs * s).sum(axis=1, keepdims=True) / total) / total


def group_mask(s: Any, top_k: int, groups: int, per_token: int) -> Any:
    """(N, E) True for the experts of each token's best ``per_token`` (M) of ``groups``
    (G, contiguous blocks of E/G experts); a group's score = the sum of its highest
    max(1, K_r // M) affinities s (unbiased: the paper's rule).  None when M = G."""
    if per_token >= groups:
        return None
    n, e = s.shape
    by_group = s.reshape(n, groups, e // groups)
    best_in = -xp.sort(-by_group, axis=2)[:, :, :max(1, top_k // per_token)]
    score = best_in.sum(axis=2)  # (N, G)
    best = xp.argsort(-score, axis=1, kind="stable")[:, :per_token]  # ties -> lower group
    allowed = xp.zeros((n, groups), dtype=bool)
    xp.put_along_axis(allowed, best, True, axis=1)
    return xp.repeat(allowed, e // groups, axis=1)


def choose(s: Any, top_k: int, bias: Any = None, allowed: Any = None) -> Any:
    """The chosen experts (N, k), best first: the top-k of s + b among ``allowed``."""
    key = s if bias is None else s + bias[None, :]
    if allowed is not None:
        key = xp.where(allowed, key, -xp.inf)
    return xp.argsort(-key, axis=1, kind="stable")[:, :top_k]  # ties -> lower index


def gates(chosen: Any, scoring: str) -> Any:
    """Softmax top-1: g = P (Switch); else g_j = s_j / Σ_chosen s (GShard, V3)."""
    if scoring == "softmax" and chosen.shape[1] == 1:
        return chosen
    return chosen / chosen.sum(axis=1, keepdims=True)


def gates_backward(chosen: Any, g: Any, d_gates: Any, scoring: str) -> Any:
    """d(chosen scores) from d(gates): normalised, ds_i = (dg_i − Σ_j dg_j g_j) / Σ s."""
    if scoring == "softmax" and chosen.shape[1] == 1:
        return d_gates
    total = chosen.sum(axis=1, keepdims=True)
    return (d_gates - (d_gates * g).sum(axis=1, keepdims=True)) / total


def switch_loss(probs: Any, order: Any, coef: float) -> tuple[float, Any]:
    """Switch's α·E·Σ_i f_i·P_i and f (E,), the fraction of first choices (a constant:
    ∂/∂P[n, i] = α·E·f_i / N)."""
    e = probs.shape[1]
    f = (order[:, 0][:, None] == xp.arange(e)[None, :]).astype(probs.dtype).mean(axis=0)
    return float(coef * e * (f * probs.mean(axis=0)).sum()), f


def sequence_loss(probs: Any, order: Any, seq_len: int, coef: float) -> tuple[float, Any]:
    """DeepSeek-V3's sequence-wise balance loss: the mean over the B = N/T sequences of
    α·Σ_i f_i·P_i, f_i = E/(K_r·T)·(the sequence's tokens choosing i), P_i the mean of
    probs over the sequence; and f per token (N, E) (∂/∂probs = α·f / (T·B))."""
    n, e = probs.shape
    b, k = n // seq_len, order.shape[1]
    onehot = (order[:, :, None] == xp.arange(e)[None, None, :]).sum(axis=1)  # (N, E)
    f = onehot.reshape(b, seq_len, e).sum(axis=1).astype(probs.dtype) * (e / (k * seq_len))
    p = probs.reshape(b, seq_len, e).mean(axis=1)
    return float(coef * (f * p).sum(axis=1).mean()), xp.repeat(f, seq_len, axis=0)


def balance_losses(probs: Any, order: Any, aux_coef: float, seq_coef: float,
                   seq_len: int) -> tuple[float, list, Any]:
    """The balance losses asked for (Switch's with ``aux_coef``, V3's sequence-wise with
    ``seq_coef``): their sum, what :func:`balance_backward` needs, and Switch's f (or None)."""
    n, e = probs.shape
    aux, balance, f = 0.0, [], None
    if aux_coef:  # f_i, the scale of ∂aux/∂P: constants (no gradient)
        aux, f = switch_loss(probs, order, aux_coef)
        balance.append((aux_coef, e, n, f[None, :]))
    if seq_coef:
        loss, fs = sequence_loss(probs, order, seq_len, seq_coef)
        aux += loss
        balance.append((seq_coef, 1, n, fs))
    return aux, balance, f


def balance_backward(ds: Any, s: Any, balance: list, daux: float, scoring: str) -> None:
    """Add the balance losses' d(s) (scaled by ``daux``) to ``ds``, in place."""
    if not balance:
        return
    dprobs = ds if scoring == "softmax" else xp.zeros_like(ds)
    for coef, mult, div, f in balance:
        dprobs += (float(daux) * coef * mult / div) * f
    if dprobs is not ds:
        ds += normalised_backward(s, dprobs, scoring)


def update_bias(bias: Any, loads: Any, rate: float) -> Any:
    """b_i ← b_i + u·sign(mean load − load_i) (Algorithm 1; sign(0) = 0)."""
    return bias + rate * xp.sign(loads.mean() - loads)


def dropless_capacity(loads: Any) -> int:
    """Dropless: each expert's buffer holds all its assignments, C = max_i load_i."""
    return max(1, int(loads.max()))


def pack(buffers: Any, rows: Any) -> Any:
    """The first ``rows[i]`` rows of each ``buffers[i]`` (E', C, d), one after the other:
    what a dropless all-to-all sends (only the tokens, no padding)."""
    return xp.concatenate([buffers[i, :int(r)] for i, r in enumerate(rows)])


def unpack(packed: Any, rows: Any, cap: int | None = None) -> Any:
    """:func:`pack`'s inverse: (E', C, d) buffers, C = ``cap`` or the largest ``rows``,
    zero past each expert's rows."""
    out = xp.zeros((len(rows), int(max(rows)) if cap is None else cap, packed.shape[-1]),
                   dtype=packed.dtype)
    at = 0
    for i, r in enumerate(rows):  # a loop over experts, never over tokens
        out[i, :int(r)] = packed[at:at + int(r)]
        at += int(r)
    return out


def split_rows(packed: Any, sizes: Any) -> list:
    """``packed`` cut into consecutive parts of ``sizes`` rows (one per source rank)."""
    at = [0, *xp.cumsum(xp.asarray([int(s) for s in sizes])).tolist()]
    return [packed[a:b] for a, b in zip(at[:-1], at[1:])]


def shared_forward(p: dict[str, Any], h: Any, n_shared: int) -> tuple[Any, list]:
    """Σ_j Shared_j(h) over the ``n_shared`` MLPs ``shared.{j}.*`` (None when S = 0)."""
    y, saved = None, []
    for j in range(n_shared):
        yj, sj = mlp_forward({k: p[f"shared.{j}.{k}"] for k in
                              ("w_in", "b_in", "w_out", "b_out")}, h)
        y = yj if y is None else y + yj
        saved.append(sj)
    return y, saved


def shared_backward(p: dict[str, Any], saved: list, dy: Any) -> tuple[Any, dict[str, Any]]:
    """d(h) and the ``shared.{j}.*`` gradients of :func:`shared_forward`."""
    dh, grads = None, {}
    for j, sj in enumerate(saved):
        q = {k: p[f"shared.{j}.{k}"] for k in ("w_in", "b_in", "w_out", "b_out")}
        dx, g = mlp_backward(q, sj, dy)
        dh = dx if dh is None else dh + dx
        grads.update({f"shared.{j}.{k}": v for k, v in g.items()})
    return dh, grads
