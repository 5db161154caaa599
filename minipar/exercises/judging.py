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
    """New array of the right shape and dtype; input untouched; result equals the oracle."""
    checks = []
    bad = [(c, r, rec["contract"]) for c, r, rec in each(cases, records) if rec["contract"]]
    detail = f"{label(bad[0][0])}, rank {bad[0][1]}: {bad[0][2]}" if bad else ""
    checks.append(Check("returns a new array with the input's shape and dtype", not bad, detail))

    bad = [(c, r) for c, r, rec in each(cases, records) if rec["touched"]]
    detail = (
        f"{label(bad[0][0])}, rank {bad[0][1]}: your function wrote into its input x. "
        "Work on a copy (x.copy(), np.array_split(x.copy(), N)): the caller still needs x."
        if bad
        else ""
    )
    checks.append(Check("leaves the input untouched", not bad, detail))

    wrong = [(c, r, rec["mismatch"]) for c, r, rec in each(cases, records) if rec["mismatch"]]
    n_cases = sum(any(rec["mismatch"] for rec in recs) for recs in zip(*records))
    lengths = sorted({c["length"] for c in cases})
    dtypes = sorted({c["dtype"] for c in cases})
    name = (
        f"result equals MPI's {oracle} ({len(cases)} cases: lengths "
        f"{', '.join(map(str, lengths))}; {', '.join(dtypes)})"
    )
    detail = ""
    if wrong:
        c, r, m = wrong[0]
        detail = (
            f"{n_cases} of {len(cases)} cases wrong. First: {label(c)}, rank {r}, "
            f"index {m['index']}: expected {m['expected']!r}, got {m['got']!r} "
            f"({m['wrong']} of {c['length']} elements wrong on this rank)"
        )
        said = [rec["mistake"] for _, _, rec in each(cases, records) if rec.get("mistake")]
        if said:
            detail += "\n" + Counter(said).most_common(1)[0][0]
    checks.append(Check(name, not wrong, detail))
    checks.append(collective_check(cases, records))
    return checks


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
