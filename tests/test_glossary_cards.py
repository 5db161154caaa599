"""Glossary cards read right (issue 13): labelled seed quotes, W on the PS card, CJK wrapping."""

from __future__ import annotations

import re

import pytest

from minipar import glossary as g
from minipar.glossary import render

LABELS = {"Russian glossary": "As written in a Russian AI glossary (errors kept)",
          "Chinese article": "As written in a machine-translated Chinese article (errors kept)"}
PAIRS = dict(zip("（(“「【《", "）)”」】》"))


def test_seed_quotes_are_labelled_as_what_they_are_after_the_definitions() -> None:
    """Never "Seed (...)": the label says the text is a machine-translated source, errors kept."""
    files = {s["file"] for t in g.terms() for s in t.seeds}
    assert {g.seed_title(f): g.seed_label(f) for f in files} == LABELS
    assert g.seed_label("unknown.txt") == "As written in the seed document (errors kept)"
    md = render.markdown()
    assert "Seed" not in md and all(f"{label}:\n\n> «" in md for label in LABELS.values())
    for t in g.terms():
        text = render.card(t, width=100, status=False)
        assert "Seed" not in text
        if not t.seeds:
            continue
        first_label = min(text.index(lab) for lab in LABELS.values() if lab in text)
        starts = [render.wrap(t.definition[la], 90)[0][:20] for la in g.LANGS]
        last_definition = max(text.index(x) for x in starts)
        assert last_definition < first_label, t.id  # the clean definitions come first
        for s in t.seeds:  # every quote under its own document's label
            label_at = text.index(g.seed_label(s["file"]) + ":")
            quote_at = text.index("«" + render.wrap(s["quote"], 90, " ")[0][:15])
            assert quote_at > label_at, (t.id, s["quote"])


@pytest.mark.parametrize("term_id, fragment", [
    ("ring-all-reduce", "这依赖于 Ring-AllReduce。"),          # no content on its own
    ("data-parallelism", "Коллективная операция связи"),   # defines all-reduce, not DP
    ("deepspeed", "DeepSpeed（微软开源，"), ("megatron-lm", "Megatron-LM（NVIDIA开源，是"),
    ("expert-parallelism", "专家并行（Expert Parallelism）"), ("micro-batch", "использует микро-батчинг"),
])
def test_fragments_and_misplaced_quotes_are_gone(term_id: str, fragment: str) -> None:
    assert not any(s["quote"] == fragment or fragment in s["quote"] and len(s["quote"]) < 40
                   for s in g.by_id()[term_id].seeds)
    assert any("Коллективная операция связи, существенная для параллелизма данных" in s["quote"]
               for s in g.by_id()["all-reduce"].seeds)


def test_every_seed_quote_is_a_whole_phrase() -> None:
    """A quote cut mid-bracket («支撑 3D 并行 +ZeRO 内存优化）») is a fragment: brackets must balance."""
    for t in g.terms():
        for s in t.seeds:
            stack: list[str] = []
            for c in s["quote"]:
                if c in PAIRS:
                    stack.append(PAIRS[c])
                elif c in PAIRS.values():
                    assert stack and stack.pop() == c, (t.id, s["quote"])
            assert not stack, (t.id, s["quote"])


def test_parameter_server_card_counts_workers_w() -> None:
    """W workers = N ranks - servers; the server moves W x S each way (parameter_server.py)."""
    from minipar.plan.collectives import parameter_server_bytes_at_server

    t = g.by_id()["parameter-server"]
    for la in g.LANGS:
        text = t.definition[la]
        assert "N x S" not in text and "W = N - " in text, la
        assert "W x S" in text and "2(W-1)/W x S" in text, la
    assert parameter_server_bytes_at_server(1000, 3) == 3 * 1000  # S = 1000 bytes, W = 3 workers
    import minipar.parallel.data_parallel.parameter_server as ps

    assert "W = world - servers" in ps.__doc__ and "receives W x S" in ps.__doc__


@pytest.mark.parametrize("width", range(24, 101, 7))
def test_no_line_starts_with_closing_or_ends_with_opening_punctuation(width: int) -> None:
    texts = [x for t in g.terms() for x in (*t.names.values(), *t.definition.values())]
    for text in texts:
        for line in render.wrap(text, width, "  "):
            body = line.strip()
            assert body[0] not in render.CLOSING and body[-1] not in render.OPENING, (width, line)
    assert render.wrap("专家容量（容量因子）", 18) == ["专家容量（容量因", "子）"]  # 「）」 never alone
    assert render.wrap("专家容量（容量因子）", 10) == ["专家容量", "（容量因", "子）"]  # 「（」 never last


def test_list_never_leaves_a_closing_bracket_alone() -> None:
    for width in (60, 80, 100):
        for line in render.table(width=width).splitlines():
            cells = [c for c in re.split(r"\s{2,}", line.strip()) if c]
            assert not any(c[0] in render.CLOSING for c in cells), (width, line)


@pytest.mark.parametrize("width", [40, 60, 80, 100])
def test_family_list_keeps_each_name_on_one_line_when_it_fits(width: int) -> None:
    for topic in g.topics():
        lines = render.topic_list(topic, width=width).splitlines()
        for tid in topic.terms:
            for la in g.LANGS:
                name = g.by_id()[tid].names[la]
                if render.display_width(name) + 2 <= width - 6:  # fits on a line with its " ·"
                    assert any(name in line for line in lines), (width, tid, name)
    zero = render.topic_list(g.topic("sharding"), width=100)
    assert "ZeRO（零冗余优化器）" in zero


def test_fill_names_wraps_only_a_name_wider_than_a_line() -> None:
    assert render.fill_names(["aaaa", "bbbb", "cccc"], 13) == ["aaaa · bbbb ·", "cccc"]
    assert render.fill_names(["a", "x" * 30], 12) == ["a ·", "x" * 30]  # nothing is ever cut
    long = render.fill_names(["ab", "一二三四五六七八九十"], 12)
    assert "".join(long).replace(" ", "") == "ab·一二三四五六七八九十" and all(
        render.display_width(x) <= 12 for x in long)
