"""minipar.viz.overview: the split table matches the papers' structure and the glossary;
it and the glossary import no command-line module."""

from __future__ import annotations

import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from minipar import glossary
from minipar.viz import overview


def test_every_technique_is_a_glossary_term_and_splits_something() -> None:
    ids = set(glossary.by_id())
    names, rows = overview.split_matrix()
    assert names == list(overview.SPLITS)
    for name, row in zip(names, rows):
        assert overview.SPLITS[name][0] in ids
        assert set(row) <= {0, 1, 2} and 2 in row, name


def test_zero_stages_add_one_partitioned_state_each() -> None:
    """P_os, P_os+g, P_os+g+p (Rajbhandari et al. 2019): each stage splits one more thing."""
    _, rows = overview.split_matrix(["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP"])
    col = {a: i for i, a in enumerate(overview.AXES)}
    split = [{a for a in ("optimizer state", "gradients", "parameters") if r[col[a]] == 2} for r in rows]
    assert split == [set(), {"optimizer state"}, {"optimizer state", "gradients"},
                     {"optimizer state", "gradients", "parameters"}]
    assert all(r[col["batch"]] == 2 for r in rows)


def test_3d_is_dp_plus_tp_plus_pp() -> None:
    _, rows = overview.split_matrix(["DP", "TP", "PP", "3D"])
    by_design = [{i for i, v in enumerate(r) if v == 2} for r in rows]
    assert by_design[3] == by_design[0] | by_design[1] | by_design[2]


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown techniques"):
        overview.split_matrix(["DP", "XP"])


def test_figure_and_where_table() -> None:
    fig = overview.what_splits(["DP", "TP"])
    assert isinstance(fig, Figure) and len(fig.axes[0].get_yticklabels()) == 2
    table = overview.where_table()
    assert all(t.id in table for t in glossary.terms())
    rows = overview.where_terms_live()
    assert {s for r in rows for links in r["links"].values() for _, s in links} <= {"present", "planned", None}


def test_library_side_imports_no_command_line_module() -> None:
    """viz.overview, viz.cards and the glossary read minipar.registry and render with the
    library, never a CLI module (fresh interpreter)."""
    cli = ("minipar.cli", "minipar.bench", "minipar.run")  # minipar.cli: its verbs too
    probe = ("import sys\n"
             "import minipar.glossary as g\n"
             "g.lookup('all-reduce'); g.scan('ring all-reduce')\n"
             "assert not {'numpy', 'mpi4py'} & set(sys.modules), 'the glossary imported NumPy or mpi4py'\n"
             "from minipar.viz import overview\n"
             "rows = overview.where_terms_live(); overview.where_table()\n"
             "from minipar.viz import cards\n"
             "assert 'all-reduce' in cards.cards_text(['all-reduce'])\n"
             "assert any(s == 'present' for r in rows for ls in r['links'].values() for _, s in ls)\n"
             f"print(sorted(m for m in sys.modules if m.startswith({cli!r})))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"command-line modules imported: {proc.stdout.strip()}"
