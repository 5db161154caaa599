"""The map of the field: what each parallel technique splits across ranks.

EN parallelism overview · RU обзор параллелизма · ZH 并行方式总览

Every technique in minipar splits *something* over N ranks (and keeps the
rest replicated).  :data:`SPLITS` says what, as data; :func:`what_splits`
draws it; :func:`where_terms_live` lists, for every glossary term, the
modules, notebooks and commands that demonstrate it, with whether each exists
*now* (computed from the files by :func:`minipar.glossary.link_status`, as
``minipar glossary`` cards are; no command-line module is imported).

Sources: data parallelism (Dean et al. 2012), ZeRO stages 1-3 (Rajbhandari
et al. 2019, arXiv 1910.02054: P_os, P_os+g, P_os+g+p), tensor parallelism
(Shoeybi et al. 2019, arXiv 1909.08053), pipeline parallelism (Huang et al.
2018, arXiv 1811.06965), sequence parallelism (Korthikanti et al. 2022, arXiv
2205.05198), context parallelism (Liu et al. 2023, arXiv 2310.01889), expert
parallelism (Lepikhin et al. 2020, arXiv 2006.16668), 3D (Narayanan et al.
2021, arXiv 2104.04473).

A cell holds 2 when the technique splits that thing *by design*, 1 when it
is split *as a consequence* (tensor parallelism splits weight matrices, so
their gradients and optimizer state are split too), 0 when every rank holds
all of it.  ``tests/test_glossary_overview.py`` checks the table against the
ZeRO memory formulas' structure and the glossary.
"""

from __future__ import annotations

from collections.abc import Sequence

#: what can be split (columns of the figure)
AXES: tuple[str, ...] = (
    "batch", "layers", "tensors", "sequence", "experts", "optimizer state", "gradients", "parameters",
)

#: technique label -> (glossary id, {axis: 2 by design | 1 as a consequence})
SPLITS: dict[str, tuple[str, dict[str, int]]] = {
    "DP": ("data-parallelism", {"batch": 2}),
    "PS": ("parameter-server", {"batch": 2}),
    "ZeRO-1": ("zero-1", {"batch": 2, "optimizer state": 2}),
    "ZeRO-2": ("zero-2", {"batch": 2, "optimizer state": 2, "gradients": 2}),
    "ZeRO-3 / FSDP": ("zero-3", {"batch": 2, "optimizer state": 2, "gradients": 2, "parameters": 2}),
    "TP": ("tensor-parallelism", {"tensors": 2, "optimizer state": 1, "gradients": 1, "parameters": 1}),
    "SP": ("sequence-parallelism", {"sequence": 2, "tensors": 2, "optimizer state": 1,
                                    "gradients": 1, "parameters": 1}),
    "CP": ("context-parallelism", {"sequence": 2}),
    "PP": ("pipeline-parallelism", {"layers": 2, "optimizer state": 1, "gradients": 1, "parameters": 1}),
    "EP": ("expert-parallelism", {"experts": 2, "batch": 2, "optimizer state": 1, "gradients": 1,
                                  "parameters": 1}),
    "3D": ("3d-parallelism", {"batch": 2, "layers": 2, "tensors": 2, "optimizer state": 1,
                              "gradients": 1, "parameters": 1}),
}


def split_matrix(techniques: Sequence[str] | None = None) -> tuple[list[str], list[list[int]]]:
    """Rows of 0/1/2 over :data:`AXES` for the given techniques (default: all of :data:`SPLITS`)."""
    names = list(techniques) if techniques is not None else list(SPLITS)
    unknown = [t for t in names if t not in SPLITS]
    if unknown:
        raise ValueError(f"unknown techniques {unknown}; known: {', '.join(SPLITS)}")
    for name in names:
        bad = set(SPLITS[name][1]) - set(AXES)
        if bad:
            raise ValueError(f"{name}: unknown axes {sorted(bad)}; axes are {AXES}")
    return names, [[SPLITS[n][1].get(a, 0) for a in AXES] for n in names]


def what_splits(techniques: Sequence[str] | None = None):  # -> matplotlib.figure.Figure
    """A grid figure: one row per technique, one column per thing it can split."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from minipar import glossary

    names, rows = split_matrix(techniques)
    terms = glossary.by_id()
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.8), layout="constrained")
    colours = ["#f2f2f2", "#9ecae1", "#08519c"]
    ax.imshow(rows, cmap=ListedColormap(colours), vmin=0, vmax=2, aspect="auto")
    ax.set_xticks(range(len(AXES)), AXES, rotation=20, ha="right")
    # English names: matplotlib's default font (DejaVu) has no CJK glyphs; the cards carry all three
    labels = [f"{n}: {terms[SPLITS[n][0]].names['en'].split(' (')[0]}" for n in names]
    ax.set_yticks(range(len(names)), labels)
    ax.set_xticks([x - 0.5 for x in range(1, len(AXES))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(names))], minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.set_title("What each technique splits over the ranks (everything else is replicated)")
    ax.legend(handles=[Patch(color=colours[2], label="split by design"),
                       Patch(color=colours[1], label="split as a consequence"),
                       Patch(color=colours[0], label="replicated on every rank")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def where_terms_live() -> list[dict[str, object]]:
    """For every glossary term: its names and links, each link tagged present/planned now."""
    from minipar import glossary

    out = []
    for t in glossary.terms():
        links = {kind: [(x, glossary.link_status(kind, x)) for x in xs] for kind, xs in t.links.items()}
        out.append({"id": t.id, **{lang: t.names[lang] for lang in glossary.LANGS}, "links": links})
    return out


def where_table(width: int = 110) -> str:
    """:func:`where_terms_live` as text: id, modules and notebooks; "*" marks links not landed yet."""
    lines = [f"{'term':<26} {'modules':<52} notebooks", "-" * width]
    def fmt(links: dict, kind: str) -> str:
        return ", ".join(f"{x.removeprefix('minipar.')}{'*' if s == 'planned' else ''}"
                         for x, s in links.get(kind, []))

    for row in where_terms_live():
        links = row["links"]
        lines.append(f"{row['id']:<26} {fmt(links, 'modules'):<52} {fmt(links, 'notebooks')}")
    lines.append("\n* planned: not in this checkout yet (computed now from the files)")
    return "\n".join(lines)
