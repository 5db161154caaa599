"""The glossary data: schema, three languages, seeds quoted verbatim, links honest, docs fresh."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from minipar import glossary as g
from minipar.cli import glossary as glossary_cli
from minipar.glossary import links as glinks

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "glossary"
FILES = sorted(p for p in DATA.glob("*.toml") if not p.name.startswith("_"))
TOP_KEYS = {"id", "abbrev", "related", "papers", "en", "ru", "zh", "seeds", "links"}
LANG_KEYS = {"name", "aliases", "definition"}
LINK_KEYS = {"code", "modules", "notebooks", "commands", "exercises"}
SCRIPT = {"ru": re.compile(r"[А-Яа-яЁё]"), "zh": re.compile(r"[\u4e00-\u9fff]"), "en": re.compile(r"[A-Za-z]")}
SHARED_SEEDS = Path("/work/shared/seeds")


def test_at_least_35_terms_and_loader_sees_every_file() -> None:
    assert len(FILES) >= 35
    assert g.data_dir() == DATA  # in a checkout the data comes from glossary/
    assert [t.id for t in g.terms()] == sorted(p.stem for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_schema(path: Path) -> None:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert set(data) <= TOP_KEYS, f"unknown keys {set(data) - TOP_KEYS}"
    assert data["id"] == path.stem and re.fullmatch(r"[0-9a-z]+(-[0-9a-z]+)*", data["id"])
    for lang in g.LANGS:
        entry = data[lang]
        assert set(entry) <= LANG_KEYS and {"name", "definition"} <= set(entry)
        assert entry["name"].strip() and len(entry["definition"].strip()) >= 40
        assert all(isinstance(a, str) and a.strip() for a in entry.get("aliases", []))
        # the name or an alias is written in that language's script; the definition always is
        assert any(SCRIPT[lang].search(n) for n in [entry["name"], *entry.get("aliases", [])])
        assert SCRIPT[lang].search(entry["definition"])
    assert all(isinstance(a, str) and a for a in data.get("abbrev", []))
    assert data.get("papers"), "cite at least one paper"
    assert all(re.search(r"(19|20)\d\d", p) for p in data["papers"]), "a paper needs its year"
    assert set(data.get("links", {})) <= LINK_KEYS
    for seed in data.get("seeds", []):
        assert set(seed) <= {"file", "quote", "correction"} and seed["quote"].strip()


def test_names_are_unambiguous_after_normalisation() -> None:
    owner: dict[str, str] = {}
    clashes = []
    for t in g.terms():
        for name in set(t.all_names()):
            k = g.key(name)
            assert k, f"{t.id}: name {name!r} normalises to nothing"
            if owner.setdefault(k, t.id) != t.id:
                clashes.append((name, owner[k], t.id))
    assert not clashes, f"names shared by two terms: {clashes}"


def test_related_terms_exist() -> None:
    ids = {t.id for t in g.terms()}
    for t in g.terms():
        assert t.related, f"{t.id}: no related terms"
        assert set(t.related) <= ids - {t.id}, f"{t.id}: unknown related {set(t.related) - ids}"


def test_seed_quotes_are_verbatim_and_seed_copies_match() -> None:
    seeds = {p.name: p.read_text(encoding="utf-8") for p in (DATA / "_seeds").glob("*.txt")}
    assert set(seeds) == {"000_1e5fa01697d9c096.txt", "004_9ffc8ddddd5da86d.txt"}
    if SHARED_SEEDS.is_dir():  # the copies shipped here are the project's seeds, byte for byte
        for name, text in seeds.items():
            assert (SHARED_SEEDS / name).read_text(encoding="utf-8") == text
    quoted = 0
    for t in g.terms():
        for s in t.seeds:
            assert s["quote"] in seeds[s["file"]], f"{t.id}: quote not verbatim in {s['file']}"
            quoted += 1
    assert quoted >= 30


def _correction(term_id: str, quote_part: str) -> str:
    t = g.by_id()[term_id]
    return " ".join(s.get("correction", "") for s in t.seeds if quote_part in s["quote"])


@pytest.mark.parametrize("term_id, quote_part, must_say", [
    ("mixture-of-experts", "плотных", "sparse"),
    ("expert-parallelism", "плотных", "sparse"),
    ("activation-checkpointing", "сохранении активаций", "recomputes"),
    ("sharded-data-parallelism", "сегментацией", "шардирование"),
    ("sharded-data-parallelism", "сегментацией", "ZeRO-3"),
    ("zero", "веса модели разделяются", "Only ZeRO-3"),
    ("megatron-lm", "Архитектура", "framework"),
    ("ring-all-reduce", "百度", "Patarasuk & Yuan (2009)"),
])
def test_known_seed_mistakes_are_corrected(term_id: str, quote_part: str, must_say: str) -> None:
    assert must_say in _correction(term_id, quote_part)


@pytest.mark.parametrize("abbrev, term_id", [
    ("DP", "data-parallelism"), ("DDP", "distributed-data-parallel"), ("PS", "parameter-server"),
    ("TP", "tensor-parallelism"), ("PP", "pipeline-parallelism"), ("SP", "sequence-parallelism"),
    ("CP", "context-parallelism"), ("EP", "expert-parallelism"), ("MoE", "mixture-of-experts"),
    ("ZeRO-1", "zero-1"), ("ZeRO-2", "zero-2"), ("ZeRO-3", "zero-3"), ("FSDP", "fsdp"),
    ("remat", "activation-checkpointing"), ("1F1B", "1f1b"), ("3D", "3d-parallelism"),
])
def test_abbreviations(abbrev: str, term_id: str) -> None:
    assert abbrev in g.by_id()[term_id].abbrev
    assert g.lookup(abbrev)[0].id == term_id


def test_references_are_covered() -> None:
    """Every concept of /work/shared/REFERENCES.md has a term."""
    needed = {
        "ring-all-reduce", "reduce-scatter", "all-gather", "parameter-server", "bus-bandwidth",
        "horovod", "zero", "zero-1", "zero-2", "zero-3", "offloading", "mixed-precision",
        "optimizer-state", "tensor-parallelism", "f-g-operators", "column-parallelism",
        "row-parallelism", "sequence-parallelism", "activation-memory", "selective-recomputation",
        "deepspeed-ulysses", "ring-attention", "gpipe", "pipeline-bubble", "1f1b",
        "interleaved-pipeline", "activation-checkpointing", "mixture-of-experts", "expert-capacity",
        "load-balancing", "router", "all-to-all", "expert-parallelism", "3d-parallelism",
        "hybrid-parallelism", "gradient-synchronization", "megatron-lm", "deepspeed",
    }
    assert needed <= set(g.by_id())


LINK_FORMS = {
    "code": re.compile(r"minipar(/[a-z_][a-z0-9_]*)+\.py"),
    "modules": re.compile(r"minipar(\.[a-z_][a-z0-9_]*)+"),
    "notebooks": re.compile(r"\d\d_[a-z0-9_]+\.ipynb"),
    "exercises": re.compile(r"[a-z][a-z0-9_]*"),
    "commands": re.compile(r"minipar [a-z]+( [^\s]+)*"),
}


def _planned(kind: str, target: str) -> bool:
    if kind == "commands":
        words = target.split()
        if words[1] == "run" and len(words) > 2 and not words[2].startswith("-"):
            return words[2] in g.PLANNED["strategies"]  # `minipar run X`: X must be a planned strategy
        return words[1] in g.PLANNED["verbs"]
    return target in g.PLANNED[kind]


def test_links_are_well_formed_and_present_or_planned() -> None:
    """A link exists now or is planned by the architecture; a present link really resolves.

    Green in whatever order the other modules land: landing a planned module
    turns its links from "planned" to "present", and present ones must import.
    """
    seen = {k: set() for k in LINK_FORMS}
    for t in g.terms():
        assert any(t.links.get(k) for k in ("modules", "notebooks")), f"{t.id}: no module or notebook"
        for kind, targets in t.links.items():
            for target in targets:
                assert LINK_FORMS[kind].fullmatch(target), f"{t.id}: malformed {kind} link {target!r}"
                status = g.link_status(kind, target)
                assert status == "present" or _planned(kind, target), f"{t.id}: {target!r} is neither"
                seen[kind].add((target, status))
    for target, status in seen["modules"]:
        if status == "present":
            assert importlib.util.find_spec(target) is not None, target
    for target, status in seen["notebooks"]:
        assert (status == "present") == (ROOT / "notebooks" / target).is_file()
    for target, status in seen["exercises"]:
        if status == "present":
            assert (ROOT / "minipar" / "exercises" / target).exists()
    for target, status in seen["code"]:  # a technique's core: always a file that exists now
        assert status == "present" and (ROOT / target).is_file(), target
    assert ("minipar.launch", "present") in seen["modules"]  # landed with the skeleton


def test_planned_names_are_well_formed() -> None:
    for kind in ("modules", "notebooks", "exercises"):
        for target in g.PLANNED[kind]:
            assert LINK_FORMS[kind].fullmatch(target), target


def test_link_status_is_computed_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "minipar"
    (pkg / "parallel").mkdir(parents=True)
    (pkg / "exercises" / "zero1_step").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setattr(glinks, "PKG_DIR", pkg)
    assert glossary_cli.link_status is g.link_status  # the CLI re-exports the library's
    assert g.link_status("modules", "minipar.parallel.zero") == "planned"
    (pkg / "parallel" / "zero.py").write_text("")
    assert g.link_status("modules", "minipar.parallel.zero") == "present"
    assert g.link_status("exercises", "zero1_step") == "present"
    assert g.link_status("exercises", "dp_grad_sync") == "planned"
    assert g.link_status("notebooks", "04_zero.ipynb") == "planned"
    (tmp_path / "notebooks" / "04_zero.ipynb").write_text("{}")
    assert g.link_status("notebooks", "04_zero.ipynb") == "present"
    assert g.link_status("commands", "minipar run dp -n 4") == "planned"  # no verb modules
    (pkg / "run").mkdir()
    (pkg / "run" / "__init__.py").write_text("")
    assert g.link_status("commands", "minipar run --help") == "present"  # the verb alone
    assert g.link_status("commands", "minipar run dp -n 4") == "planned"  # not the strategy
    (pkg / "run" / "dp.py").write_text("")
    assert g.link_status("commands", "minipar run dp -n 4") == "present"
    # a strategy flips by itself when it lands: a registry row and its module
    (pkg / "run" / "hybrid.py").write_text("")
    monkeypatch.setattr(glinks, "STRATEGIES", {k: v for k, v in glinks.STRATEGIES.items() if k != "hybrid"})
    assert g.link_status("commands", "minipar run hybrid -n 8") == "planned"
    monkeypatch.setattr(glinks, "STRATEGIES", {**glinks.STRATEGIES, "hybrid": ("minipar.run.hybrid", "3D")})
    assert g.link_status("commands", "minipar run hybrid -n 8") == "present"
    assert g.link_status("commands", "minipar bench zero") == "planned"
    (pkg / "bench").mkdir()
    (pkg / "bench" / "__init__.py").write_text("")
    assert g.link_status("commands", "minipar bench zero") == "planned"  # the verb, not the bench
    (pkg / "bench" / "zero.py").write_text("")
    assert g.link_status("commands", "minipar bench zero") == "present"
    with pytest.raises(ValueError, match="unknown link kind"):
        g.link_status("papers", "x")


def test_activation_checkpointing_is_not_the_training_checkpoint() -> None:
    """Recomputation (remat) and saving training state are different things with different modules."""
    remat = {m for tid in ("activation-checkpointing", "selective-recomputation")
             for m in g.by_id()[tid].links.get("modules", [])}
    assert "minipar.parallel.remat" in remat
    assert "minipar.parallel.checkpoint" not in remat  # saving state is not recomputing
    assert glinks.module_file("minipar.parallel.checkpoint") is not None  # the engines' one
    assert glinks.module_file("minipar.parallel.sharded_checkpoint") is None  # the old name


def test_docs_glossary_md_is_fresh_and_has_no_status() -> None:
    md = glossary_cli.markdown()
    assert (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8") == md, (
        "docs/glossary.md is stale: run `minipar glossary --export-md docs/glossary.md`")
    assert not re.search(r"\b(planned|present)\b", md, re.IGNORECASE)
    for t in g.terms():
        assert f"## {t.id}" in md and t.names["zh"] in md and t.names["ru"] in md


# ------------------------------------------------------------------ issue 13, items 17-19

NEW_TERMS = ["gradient-accumulation", "loss-scaling", "gradient-clipping", "nccl", "alpha-beta-model",
             "top-k-routing", "zero-plus-plus", "zero-infinity"]


@pytest.mark.parametrize("term_id", NEW_TERMS)
def test_new_terms_have_papers_and_a_present_link(term_id: str) -> None:
    t = g.by_id()[term_id]
    assert t.papers and all(re.search(r"(19|20)\d\d", p) for p in t.papers)
    assert any(g.link_status(k, x) == "present" for k in ("modules", "notebooks") for x in t.links.get(k, []))
    assert all(t.definition[la] for la in g.LANGS)


def test_every_strategy_a_card_runs_is_registered_or_planned() -> None:
    from minipar.registry import STRATEGIES

    assert set(STRATEGIES) <= g.PLANNED["strategies"]
    for t in g.terms():
        for cmd in t.links.get("commands", []):
            words = cmd.split()
            if words[1] == "run" and len(words) > 2 and not words[2].startswith("-"):
                status = g.link_status("commands", cmd)
                assert (status == "present") == (words[2] in STRATEGIES), (t.id, cmd)
                assert words[2] in g.PLANNED["strategies"], (t.id, cmd)


def test_topics_list_existing_terms_and_never_shadow_a_term() -> None:
    ids = set(g.by_id())
    term_keys = {g.key(n) for t in g.terms() for n in t.all_names()}
    seen: dict[str, str] = {}
    assert {t.id for t in g.topics()} >= {"sharding"}
    for topic in g.topics():
        assert topic.title and len(topic.terms) >= 2 and set(topic.terms) <= ids, topic.id
        for name in topic.names:
            k = g.key(name)
            assert k and k not in term_keys, f"topic {topic.id}: {name!r} is a term's name"
            assert seen.setdefault(k, topic.id) == topic.id, f"{name!r} in two topics"


def test_seeds_are_named_by_title_never_by_file_name() -> None:
    files = {s["file"] for t in g.terms() for s in t.seeds}
    assert {g.seed_title(f) for f in files} == {"Russian glossary", "Chinese article"}
    md = glossary_cli.markdown()
    cards = "\n".join(glossary_cli.card(t, width=200) for t in g.terms())
    for f in files:
        assert f not in md and f not in cards and Path(f).stem not in cards
    assert "As written in a Russian AI glossary (errors kept):" in md
    assert "As written in a machine-translated Chinese article (errors kept):\n  «" in cards


def test_pipeline_bubble_card_uses_one_notation() -> None:
    """p stages, m micro-batches (v chunks) everywhere on the card: no K, M left over."""
    for tid in ("pipeline-bubble", "gpipe", "1f1b", "interleaved-pipeline"):
        for la in g.LANGS:
            text = g.by_id()[tid].definition[la]
            assert not re.search(r"(?<![A-Za-z])[KM](?![A-Za-z])", text), (tid, la, text)
    for la in g.LANGS:
        text = g.by_id()["pipeline-bubble"].definition[la]
        assert "(p-1)/m" in text and "(p-1)/(m+p-1)" in text and "(p-1)/(v m)" in text
