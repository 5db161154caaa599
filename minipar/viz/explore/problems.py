"""Worked problems with answers to reveal, each checked by the suite against minipar.plan.

EN worked problems · RU задачи с решениями · ZH 例题与解答

Back-of-the-envelope problems at real sizes (the JAX scaling book teaches this way), a few
per notebook: the question, the working and the answer as a learner would write them, and
the :mod:`minipar.plan` function that gives the same number (``check``; tests/test_explore.py
holds every stated answer to it).  :func:`show` writes them with each answer folded
(HTML ``<details>``, which JupyterLab, nbconvert and static viewers open on a click).
:func:`read_first` is the sentence of a family's ``__init__`` that says which core file to
read and its line count (tests/test_core_budget.py keeps those counts true).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from minipar.plan.activations import activation_bytes_per_layer
from minipar.plan.collectives import all_gather_volume, ring_allreduce_volume
from minipar.plan.layouts import stage_param_count
from minipar.plan.moe import expert_capacity
from minipar.plan.pipeline import bubble_formula
from minipar.plan.presets import load_model
from minipar.plan.tensor import tp_bytes_per_rank_per_layer
from minipar.plan.zero import zero_comm_bytes_per_rank, zero_model_state_bytes


@dataclass(frozen=True)
class Problem:
    question: str
    working: str
    answer: float  # as stated in ``working``, rounded as a person would
    check: Callable[[], float]  # minipar.plan's number
    rel_tol: float = 0.01


def _psi(name: str) -> float:
    return load_model(name).psi


PROBLEMS: dict[str, list[Problem]] = {
    "01": [
        Problem("A ring all-reduce of 1 GB of gradients on 8 GPUs: how many bytes does each "
                "GPU send?", "2(N − 1)/N × S = 2 × 7/8 × 1 GB = 1.75 GB.", 1.75e9,
                lambda: ring_allreduce_volume(1e9, 8)),
        Problem("The same 1 GB on 1,024 GPUs?", "2 × 1023/1024 × 1 GB ≈ 2.0 GB: the ring's "
                "bytes per GPU hardly grow with N (its 2(N − 1) messages do).", 2.0e9,
                lambda: ring_allreduce_volume(1e9, 1024)),
        Problem("An all-gather whose result is 1 GB, on 8 GPUs: bytes each GPU sends?",
                "(N − 1)/N × S = 7/8 GB = 0.875 GB: half an all-reduce.", 0.875e9,
                lambda: all_gather_volume(1e9, 8)),
    ],
    "03": [
        Problem("GPT-3 175B trained with data parallelism on 64 GPUs, bf16 gradients (2 bytes "
                "each), ring all-reduce: bytes each GPU sends per step?",
                "S = 175 B × 2 B = 350 GB; 2 × 63/64 × 350 GB ≈ 689 GB per step — why nobody "
                "trains it with data parallelism alone.", 689e9,
                lambda: ring_allreduce_volume(_psi("gpt3-175b") * 2, 64)),
        Problem("Llama 3 8B on 8 GPUs, the same way: bytes per GPU per step?",
                "S = 8.03 B × 2 B = 16.1 GB; 2 × 7/8 × 16.1 GB ≈ 28.1 GB.", 28.1e9,
                lambda: ring_allreduce_volume(_psi("llama3-8b") * 2, 8)),
    ],
    "04": [
        Problem("Llama 3 70B with ZeRO-3 on 64 GPUs, bf16: how many bytes does each GPU send "
                "per step?", "Two all-gathers of the parameters (forward, backward) and one "
                "reduce-scatter of the gradients: 3 × 63/64 × 70.6 B × 2 B ≈ 417 GB — 1.5× "
                "ZeRO-1's 2 × 63/64 × 141 GB ≈ 278 GB.", 417e9,
                lambda: zero_comm_bytes_per_rank(_psi("llama3-70b"), 64, 3)),
        Problem("Its model states per GPU at ZeRO-1 on 64 GPUs (mixed-precision Adam, "
                "K = 12)?", "4Ψ + KΨ/N = 4 × 70.6 B + 12 × 70.6 B / 64 ≈ 282 GB + 13 GB "
                "≈ 295 GB: far over an 80 GB H100.", 295e9,
                lambda: zero_model_state_bytes(_psi("llama3-70b"), 64, 1)),
        Problem("And at ZeRO-3?", "(2 + 2 + 12)Ψ/N = 16 × 70.6 B / 64 ≈ 17.6 GB.", 17.6e9,
                lambda: zero_model_state_bytes(_psi("llama3-70b"), 64, 3)),
    ],
    "05": [
        Problem("GPT-3 175B (h = 12288, s = 2048), t = 8, b = 1, bf16: bytes one rank sends "
                "per layer, forward and backward?", "4 all-reduces of b·s·h × 2 B = 50.3 MB "
                "each, 2 × 7/8 of it: 4 × 1.75 × 50.3 MB ≈ 352 MB per layer, 96 layers: "
                "34 GB per micro-batch — why t stays inside a node's NVLink.", 352e6,
                lambda: tp_bytes_per_rank_per_layer(1, 2048, 12288, 8)),
        Problem("Its activations per layer at t = 8 without and with sequence parallelism?",
                "Korthikanti's bytes (16-bit), sbh = 2048 × 12288 = 25.2 M: sbh(10 + 24/t + "
                "5as/(ht)) = 25.2 M × 23 ≈ 579 MB without; sbh(34/t + 5as/(ht)) = 25.2 M × "
                "14.25 ≈ 359 MB with SP.", 359e6,
                lambda: activation_bytes_per_layer(2048, 1, 12288, 96, 8, "tp+sp")),
    ],
    "06": [
        Problem("1F1B on p = 8 stages with m = 32 micro-batches: what share of the step is "
                "idle?", "(p − 1)/(m + p − 1) = 7/39 ≈ 0.179.", 0.179,
                lambda: float(bubble_formula("1f1b", 8, 32)["fraction"])),
        Problem("Interleaved with v = 4 chunks per rank, same p and m: the bubble over the "
                "ideal time?", "(1/v)(p − 1)/m = 7/128 ≈ 0.055 (from 7/32 ≈ 0.219), for 4× "
                "the point-to-point messages.", 0.0547,
                lambda: float(bubble_formula("interleaved", 8, 32, 4)["ratio"])),
        Problem("How many micro-batches make 1F1B's bubble under 5 % at p = 8?",
                "7/(m + 7) < 0.05 ⇒ m > 133: m = 134 (GPipe's advice m ≥ 4p = 32 gives 18 %).",
                134, lambda: float(next(m for m in range(1, 1000)
                                        if bubble_formula("1f1b", 8, m)["fraction"] < 0.05))),
    ],
    "08": [
        Problem("4,096 tokens routed top-2 to 8 experts with capacity factor 1.25: how many "
                "assignments can one expert take?", "C = ⌈k·N/E × cf⌉ = ⌈2 × 4096 / 8 × 1.25⌉ "
                "= 1,280.", 1280, lambda: expert_capacity(2 * 4096, 8, 1.25)),
        Problem("At capacity factor 1.0, one expert receives 1,500 assignments: how many are "
                "dropped?", "C = 2 × 4096 / 8 = 1,024; 1,500 − 1,024 = 476 pass the residual "
                "unchanged.", 476, lambda: 1500 - expert_capacity(2 * 4096, 8, 1.0)),
    ],
    "10": [
        Problem("GPT-3 175B (96 layers, h = 12288) on pp = 16 stages and t = 8: how many "
                "parameters does one GPU of a middle stage hold?", "6 layers of 12h² each, "
                "cut 8 ways: 6 × 12 × 12288² / 8 ≈ 1.36 B (the LayerNorms and biases add "
                "0.01 %; the first and last stages add the vocabulary's V·h/t).", 1.36e9,
                lambda: stage_param_count(load_model("gpt3-175b"), 16, 8, 1)),
        Problem("Its model states per GPU with ZeRO-1 over d = 8 (mixed-precision Adam)?",
                "4Ψ + 12Ψ/d = (4 + 1.5) × 1.36 B ≈ 7.5 GB: the layout fits its states with "
                "room for activations — what pp and t bought.", 7.5e9,
                lambda: zero_model_state_bytes(stage_param_count(load_model("gpt3-175b"), 16,
                                                                 8, 1), 8, 1)),
        Problem("The 1F1B bubble over the ideal time at m = 192 micro-batches (B = 1536, "
                "d = 8), and with v = 2 chunks?", "(p − 1)/m = 15/192 ≈ 0.078; interleaved "
                "halves it: 0.039.", 0.039,
                lambda: float(bubble_formula("interleaved", 16, 192, 2)["ratio"])),
    ],
}


def read_first(family: str) -> str:
    """The family's "The technique: read ..." paragraph, from its ``__init__`` docstring."""
    doc = importlib.import_module(f"minipar.parallel.{family}").__doc__ or ""
    start = doc.index("The technique:")
    end = doc.find("\n\n", start)
    return " ".join(doc[start:end if end > 0 else None].split())


def show(notebook: str) -> None:
    """The notebook's problems, each answer folded until clicked."""
    from IPython.display import HTML, display

    items = "".join(f"<li><p>{p.question}</p><details><summary>answer</summary><p>"
                    f"{p.working}</p></details></li>" for p in PROBLEMS[notebook])
    display(HTML(f"<ol>{items}</ol>"))
