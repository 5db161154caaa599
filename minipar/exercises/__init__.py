"""mpirun exercises: write a collective yourself, get it graded on real MPI ranks.

EN exercises · RU упражнения · ZH 练习

Each exercise is one sub-package with three files:

* ``skeleton.py`` -- what ``minipar exercise start NAME`` copies into your
  folder: the signature, a docstring that teaches the algorithm and the
  numbers the grader checks, and ``raise NotImplementedError`` where your
  code goes;
* ``solution.py`` -- the reference solution (self-contained: it uses only
  point-to-point calls, never :mod:`minipar.collectives`);
* ``grader.py`` -- the cases it runs on every rank (``make_input`` and the
  ``oracle``: MPI's own collective) and ``judge``, which turns the measured
  results and counters of all ranks into ✓/✗ checks; optionally ``parts``
  (each rank's contribution to a sum, to name a wrong sum's pattern) or
  ``diagnose`` (the exercise's own mistakes, in words);
* ``hints.py`` -- ``HINTS``, from a nudge to the detailed steps: ``minipar
  exercise hint NAME`` gives the next one (:mod:`minipar.exercises.hints`),
  so the skeleton need not hand out the whole solution at once.

``minipar exercise check NAME FILE -n N`` runs FILE on N ranks through
:func:`minipar.launch.run` (see :mod:`minipar.exercises.grading`) and grades
both the result and the algorithm, measured by the traced communicator:
bytes and peers per rank, and any call to MPI's own collectives.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Exercise:
    """One exercise: its name, the function the learner writes, a summary."""

    name: str
    function: str
    description: str
    difficulty: str
    #: one rank sends nothing, so a check on it proves nothing about the communication
    #: (a wrong solution passes): every exercise that grades messages needs two
    min_ranks: int = 2
    why_min_ranks: str = ("on one rank nothing is sent, so a wrong solution would pass; "
                          "try -n 4")
    #: the learner writes the communication (so using minipar.collectives is copying the
    #: answer); False where the learner writes data the grader's own code runs (a schedule)
    writes_communication: bool = True
    #: the function the learner writes, where the worker calls another one (a fixed shim at
    #: the end of the learner's file hands it to the grader); empty: ``function`` itself
    writes: str = ""
    #: the ranks ``check`` runs on without ``-n`` (what ``start`` suggests)
    ranks: int = 4
    #: what ``start`` says to fill in, where the learner writes more than one function
    #: (empty: ``learner_function()``)
    fill_in: str = ""

    @property
    def learner_function(self) -> str:
        """The function the learner fills in (what ``start`` and the diagnoses name)."""
        return self.writes or self.function

    @property
    def to_fill_in(self) -> str:
        """What ``start`` tells the learner to write."""
        return self.fill_in or f"{self.learner_function}()"

    @property
    def package(self) -> str:
        return f"minipar.exercises.{self.name}"

    @property
    def skeleton_path(self) -> Path:
        return Path(__file__).resolve().parent / self.name / "skeleton.py"

    @property
    def solution_path(self) -> Path:
        return Path(__file__).resolve().parent / self.name / "solution.py"

    def grader(self) -> ModuleType:
        return importlib.import_module(f"{self.package}.grader")

    def hints(self) -> tuple[str, ...]:
        """The hint levels, first (a nudge) to last (the detailed steps); no MPI imported."""
        return importlib.import_module(f"{self.package}.hints").HINTS


#: name -> exercise, in the order a learner should do them
EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        Exercise(
            "ring_allreduce",
            "ring_allreduce",
            "sum arrays across ranks with a ring: reduce-scatter, then all-gather",
            "★★☆",
        ),
        Exercise(
            "tree_broadcast",
            "tree_broadcast",
            "send root's array to every rank along a binomial tree (log2 N rounds)",
            "★★☆",
        ),
        Exercise(
            "layernorm_backward",
            "layernorm_backward",
            "the layer norm's backward on your rows (notebook 02), dγ and dβ summed over ranks",
            "★☆☆",
        ),
        Exercise(
            "dp_grad_sync",
            "sync_gradients",
            "data parallelism: average the ranks' gradients so every replica equals the serial one",
            "★★☆",
        ),
        Exercise(
            "ps_sync",
            "ps_sync_step",
            "parameter server (sync): workers push gradients to rank 0, it updates, they pull",
            "★☆☆",
            min_ranks=2,
            why_min_ranks="a server and at least one worker",
        ),
        Exercise(
            "zero1_step",
            "zero1_step",
            "ZeRO-1: reduce-scatter the gradients, step your optimizer-state shard, all-gather",
            "★★★",
        ),
        Exercise(
            "tp_mlp",
            "tp_mlp",
            "tensor parallelism: the Megatron MLP, W1 by columns, W2 by rows, one all-reduce each way",
            "★★☆",
        ),
        Exercise(
            "ring_attention_merge",
            "ring_attention",
            "ring attention: merge blockwise (o, lse) partials by online softmax, causal mask",
            "★★☆",
        ),
        Exercise(
            "allgather_mask",
            "mask_step",
            "all-gather context parallelism (Llama 3): the load-balanced causal mask of rank r",
            "★☆☆",
            min_ranks=1,  # arithmetic on each rank: no message to get wrong
            writes_communication=False,
            writes="causal_mask",
        ),
        Exercise(
            "moe_dispatch",
            "moe_dispatch_combine",
            "expert parallelism: all-to-all tokens to their experts' ranks, and back (combine)",
            "★★☆",
        ),
        Exercise(
            "loss_free_balancing",
            "loss_free_step",
            "DeepSeek-V3's routing: top-k by s + b, gates without the bias, the loss-free bias "
            "update from the whole step's loads",
            "★☆☆",
        ),
        Exercise(
            "gpipe_schedule",
            "run_stage",
            "pipeline parallelism: write GPipe's schedule (all forwards, then all backwards)",
            "★☆☆",
            writes_communication=False,
            writes="schedule",
        ),
        Exercise(
            "one_f_one_b",
            "run_stage",
            "pipeline parallelism: write 1F1B (warm-up, one forward one backward, cool-down)",
            "★★☆",
            writes_communication=False,
            writes="schedule",
        ),
        Exercise(
            "zb_h1_schedule",
            "run_stage",
            "zero-bubble pipeline: write ZB-H1 (1F1B with the backward split in B and W, the "
            "W's in the bubble)",
            "★★★",
            writes_communication=False,
            writes="schedule",
        ),
        Exercise(
            "dualpipev_schedule",
            "run_stage",
            "DeepSeek-V3's DualPipe-V: two chunks per rank in a V, overlapped pairs, B and W "
            "split in the cool-down",
            "★★★",
            writes_communication=False,
            writes="schedule",
        ),
        Exercise(
            "remat_budget",
            "remat_step",
            "activation checkpointing: which activations to keep for a memory budget (notebook 09)",
            "★★☆",
            min_ranks=1,  # graded on each rank's own step: no message to get wrong
            writes_communication=False,
            writes="plan",
        ),
        Exercise(
            "grid_groups",
            "run_grid",
            "process grid: your coordinates and one comm.Split communicator per axis (dp pp cp tp)",
            "★★☆",
            writes="grid_groups",
        ),
        Exercise(
            "block_quantize",
            "quant_step",
            "FP8 (E4M3) with a scale per tile: round to nearest even, saturate, keep the tail "
            "tile (DeepSeek-V3's block scaling, notebook 12)",
            "★★☆",
            min_ranks=1,  # arithmetic on each rank: no message to get wrong
            writes_communication=False,
            writes="quantize",
            ranks=1,  # the same arithmetic on every rank: more ranks prove nothing more
            fill_in="to_e4m3(), quantize() and dequantize()",
        ),
    )
}


def get(name: str) -> Exercise:
    """The exercise called ``name``; ValueError listing the known ones otherwise."""
    try:
        return EXERCISES[name]
    except KeyError:
        known = ", ".join(EXERCISES)
        raise ValueError(f"unknown exercise {name!r}; known: {known}") from None


__all__ = ["EXERCISES", "Exercise", "get"]
