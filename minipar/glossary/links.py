"""Where a term lives in minipar: links to its code, modules, notebooks, exercises and commands.

EN cross-references · RU перекрёстные ссылки · ZH 交叉引用

A term's ``links`` (glossary data) name the files a learner reads to see the
technique whole (``code``: its core, in reading order, paths from the repository
root, counted by :mod:`minipar.glossary.code_lines`), the modules that implement
it, the notebooks that show it, the exercises that practise it and the commands that
run it.  Whether a link exists is never stored: :func:`link_status` computes
it from the files *now*, so no data file goes stale when a module lands.  A
link must exist now or be in :data:`PLANNED` (``tests/test_glossary_data.py``).

Commands are checked against :mod:`minipar.registry` (verbs and benchmarks as
data), so nothing here imports a command-line module: ``minipar glossary``
cards and :mod:`minipar.viz.overview` both use this.
"""

from __future__ import annotations

from pathlib import Path

from minipar.glossary.code_lines import code_file
from minipar.glossary.data import PKG_DIR
from minipar.registry import BENCHES, STRATEGIES, VERBS

KINDS = ("code", "modules", "notebooks", "exercises", "commands")

#: Link targets the architecture plans but that may not have landed yet.  A link
#: in the data must either exist now or be named here (tests/test_glossary_data.py).
PLANNED: dict[str, frozenset[str]] = {
    # a technique's core files: none planned, every ``code`` link is a file that exists now
    "code": frozenset(),
    "modules": frozenset(
        ["minipar.collectives", "minipar.comm.traced", "minipar.comm.topology",
         "minipar.launch", "minipar.nn", "minipar.nn.moe", "minipar.optim", "minipar.precision",
         "minipar.memory", "minipar.plan"]
        + [f"minipar.parallel.{m}" for m in (
            "mappings", "data_parallel", "data_parallel.parameter_server", "zero",
            "tensor_parallel", "expert_parallel", "pipeline", "remat", "offload", "hybrid")]
    ),
    "notebooks": frozenset([
        "00_overview.ipynb", "01_collectives.ipynb", "02_serial_model.ipynb",
        "03_data_parallel.ipynb", "04_zero.ipynb", "05_tensor_parallel.ipynb",
        "06_pipeline.ipynb", "07_sequence_parallel.ipynb", "08_expert_parallel.ipynb",
        "09_checkpointing_offload.ipynb", "10_hybrid.ipynb"]),
    "exercises": frozenset(["ring_allreduce", "tree_broadcast", "dp_grad_sync", "zero1_step",
                            "moe_dispatch", "tp_mlp", "ring_attention_merge", "gpipe_schedule",
                            "one_f_one_b", "grid_groups"]),
    # `minipar VERB ...`: the verbs the architecture plans (run lands with the strategies)
    "verbs": frozenset(["run", "bench", "plan", "demo", "train", "exercise", "glossary"]),
    # `minipar run STRATEGY ...`: one per technique module of minipar.parallel (docs/ARCHITECTURE.md)
    "strategies": frozenset(["dp", "ps", "zero", "tp", "sp", "cp", "ep", "pp", "hybrid"]),
}


def module_file(name: str) -> Path | None:
    """The source file of module ``minipar.X.Y`` under the package directory, if it exists."""
    rel = Path(*name.split(".")[1:]) if name.startswith("minipar.") else None
    if rel is None:
        return None
    for cand in (PKG_DIR / rel.with_suffix(".py"), PKG_DIR / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def link_status(kind: str, target: str) -> str | None:
    """"present" or "planned" for a link, computed from the files now; None if unknowable.

    A module is present if its file exists under the package directory (it is
    not imported); a notebook if ``notebooks/NAME`` exists in the checkout
    (None in an installed wheel, which ships no notebooks); an exercise if
    ``minipar/exercises/NAME`` exists; a command if its verb's module exists
    and, for ``minipar bench X`` / ``minipar run X``, ``X`` is a row of
    :data:`minipar.registry.BENCHES` / :data:`~minipar.registry.STRATEGIES`
    whose module exists: so ``minipar run tp`` reads "planned" until the
    tensor-parallel strategy lands in the registry, and flips by itself then.
    """
    if kind == "code":
        return "present" if code_file(target) else "planned"
    if kind == "modules":
        return "present" if module_file(target) else "planned"
    if kind == "notebooks":
        nb_dir = PKG_DIR.parent / "notebooks"
        if not nb_dir.is_dir():
            return None
        return "present" if (nb_dir / target).is_file() else "planned"
    if kind == "exercises":
        ex = PKG_DIR / "exercises"
        return "present" if (ex / target).exists() or (ex / f"{target}.py").exists() else "planned"
    if kind == "commands":
        words = target.split()
        if len(words) < 2 or words[0] != "minipar" or words[1] not in VERBS:
            return "planned"
        if not module_file(VERBS[words[1]][0]):
            return "planned"
        table = {"bench": BENCHES, "run": STRATEGIES}.get(words[1])
        if table is not None and len(words) > 2 and not words[2].startswith("-"):
            entry = table.get(words[2])
            return "present" if entry and module_file(entry[0]) else "planned"
        return "present"
    raise ValueError(f"unknown link kind {kind!r}; one of {', '.join(KINDS)}")
