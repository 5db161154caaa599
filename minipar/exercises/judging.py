"""Checks every exercise shares: the array contract, the result, no MPI collectives.

EN judging helpers · RU общие проверки · ZH 通用检查

``records[rank][i]`` is what rank ``rank`` measured on ``cases[i]`` (see
:func:`minipar.exercises.worker.run_case`).  Each helper scans cases first,
then ranks, and reports the first offence in a sentence a learner can act on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from minipar.exercises.grading import COLLECTIVES, Check

Records = list[list[dict]]


def each(cases: list[dict], records: Records) -> Iterator[tuple[dict, int, dict]]:
    """(case, rank, record) for every case, then every rank."""
    for i, case in enumerate(cases):
        for rank, recs in enumerate(records):
            yield case, rank, recs[i]


def contract_checks(
    cases: list[dict], records: Records, label: Callable[[dict], str], oracle: str
) -> list[Check]:
    """New array of the right shape and dtype; input untouched; result equals the oracle.

    Counts are of cases, each counted once however many ranks got it wrong.  A
    result of the wrong shape or dtype is a wrong result too, so the result
    check counts every case that fails either way and says how many of each.
    """
    checks = []
    total = len(cases)
    bad = [(c, r, rec["contract"]) for c, r, rec in each(cases, records) if rec["contract"]]
    shape = _wrong_cases(records, "contract")
    detail = (f"{len(shape)} of {total} cases wrong. First: {label(bad[0][0])}, rank {bad[0][1]}: "
              f"{bad[0][2]}" if bad else "")
    checks.append(Check("returns a new array with the input's shape and dtype", not bad, detail,
                        case=label(bad[0][0]) if bad else None))

    bad = [(c, r) for c, r, rec in each(cases, records) if rec["touched"]]
    touched = len(_wrong_cases(records, "touched"))
    detail = (
        f"{touched} of {total} cases wrong. First: {label(bad[0][0])}, "
        f"rank {bad[0][1]}: your function wrote into its input x. "
        "Work on a copy (x.copy(), np.array_split(x.copy(), N)): the caller still needs x."
        if bad
        else ""
    )
    checks.append(Check("leaves the input untouched", not bad, detail,
                        case=label(bad[0][0]) if bad else None))

    wrong = [(c, r, rec["mismatch"]) for c, r, rec in each(cases, records) if rec["mismatch"]]
    values = _wrong_cases(records, "mismatch")
    name = f"result equals MPI's {oracle} ({total} cases: {describe_cases(cases, label)})"
    detail, first = "", None
    if wrong or shape:
        parts = [f"{len(values)} with wrong values"] if values else []
        if shape:
            parts.append(f"{len(shape)} of the wrong shape or dtype, the ✗ above")
        counted = f"{len(values | shape)} of {total} cases wrong"
        detail = counted + (f" ({'; '.join(parts)})" if len(parts) > 1 else "")
    if wrong:
        c, r, m = wrong[0]
        first = label(c)
        detail += (
            f". First: {first}, rank {r}, "
            f"index {m['index']}: expected {m['expected']!r}, got {m['got']!r} "
            f"({m['wrong']} of {c['length']} elements wrong on this rank)"
        )
        said = [rec["mistake"] for _, _, rec in each(cases, records) if rec.get("mistake")]
        if said:
            detail += "\n" + Counter(said).most_common(1)[0][0]
    elif shape:
        first = checks[0].case
        detail += f": every one returned the wrong shape or dtype (first: {first})"
    checks.append(Check(name, not (wrong or shape), detail, case=first))
    checks.append(collective_check(cases, records))
    return checks


def _wrong_cases(records: Records, key: str) -> set[int]:
    """Indices of the cases in which some rank's record has ``key`` set."""
    return {i for i, recs in enumerate(zip(*records)) if any(rec[key] for rec in recs)}


def _words(part: dict) -> str:
    """A variant in words: ``float64 (random values)``, ``root 2``, ``step 1``."""
    rest = dict(part)
    said = []
    if "dtype" in rest:
        dtype, kind = rest.pop("dtype"), rest.pop("values", None)
        said.append(f"{dtype} ({VALUES.get(kind, kind)} values)" if kind else dtype)
    said += [f"{k} {v}" for k, v in rest.items()]
    return ", ".join(said)


#: how a case's ``values`` reads in the header
VALUES = {"ranks": "rank", "random": "random"}


def describe_cases(cases: list[dict], label: Callable[[dict], str]) -> str:
    """The cases as the product they are: every variant listed, so the counts multiply out.

    Each key that varies on its own (every value with every combination of
    the others) is one factor, ``lengths 0, 1, 3``; keys that vary together
    (dtype with the kind of values) are one factor listing each combination,
    e.g. ``7 lengths x 5 variants = 35`` for the ring all-reduce."""
    if not cases:
        return "none"
    keys = [k for k in cases[0] if len({repr(c.get(k)) for c in cases}) > 1]
    combos = {tuple(repr(c.get(k)) for k in keys) for c in cases}
    alone = [k for i, k in enumerate(keys)
             if len({t[i] for t in combos})
             * len({t[:i] + t[i + 1:] for t in combos}) == len(combos)]
    factors = []
    for k in alone:
        seen: list = []
        for c in cases:
            seen += [c[k]] if c[k] not in seen else []
        if all(isinstance(v, (int, float)) for v in seen):
            seen.sort()
        plural = {"length": "lengths", "root": "roots", "step": "steps"}.get(k, k)
        factors.append(f"{plural} {', '.join(map(str, seen))}")
    together = [k for k in keys if k not in alone]
    fixed = {k: v for k, v in cases[0].items() if k not in keys and k != "length"
             and not isinstance(v, list)}
    variants: list[str] = []
    for c in cases:
        part = {k: c[k] for k in together} | {k: v for k, v in fixed.items()
                                                  if k in ("dtype", "values")}
        part = {k: part[k] for k in c if k in part}  # the case's own key order
        words = _words(part) if set(together) <= {"dtype", "values"} else label(c)
        if words not in variants:
            variants.append(words)
    if together and len(variants) > 1:
        factors.append(f"{len(variants)} variants: {'; '.join(variants)}")
    elif variants and variants[0]:
        factors.append(variants[0])
    return " x ".join(factors)


def collective_check(cases: list[dict], records: Records) -> Check:
    """Fail, naming the call, if any rank used MPI's own collectives or uncounted sends."""
    calls: Counter[str] = Counter()
    ranks: dict[str, set[int]] = {}
    for _, rank, rec in each(cases, records):
        for fn, k in rec["calls"].items():
            calls[fn] += k
            ranks.setdefault(fn, set()).add(rank)
    name = "built from point-to-point Send/Recv (no MPI collectives)"
    if not calls:
        return Check(name, True)
    lines = []
    for fn, k in calls.most_common():
        who = ", ".join(map(str, sorted(ranks[fn])))
        if fn in COLLECTIVES:
            why = (
                "is MPI's own collective: the exercise is to build it from "
                "Send/Recv/Sendrecv; MPI's collectives are the grader's oracle, not the answer"
            )
        else:
            why = (
                "moves data the grader cannot count: use the upper-case buffer API "
                "comm.Send / comm.Recv / comm.Sendrecv on numpy arrays"
            )
        lines.append(f"comm.{fn} was called {k} times (ranks {who}): it {why}.")
    return Check(name, False, "\n".join(lines))


def any_calls(records: Records) -> bool:
    return any(rec["calls"] for recs in records for rec in recs)
