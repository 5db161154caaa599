"""The report of ``minipar exercise check``: ✓/✗ lines, a verdict, the ranks' own output.

EN grading report · RU отчёт проверки · ZH 评分报告

A :class:`Report` is a list of :class:`Check` lines (✓ passed, ✗ failed,
– not graded on this many ranks) and the verdict.  It also keeps what each
rank of the learner's code printed (``print()`` and anything else written to
stdout or stderr while their function ran), tied to the case it was printed
in: when a check fails, the failing case's lines come first, under that
case's label, each prefixed by its rank, and a line counts what was left out;
``verbose`` (``--verbose``) shows every line; a passing run says in one line
that output was hidden.  So a learner debugging with ``print`` sees the
prints of the case that went wrong.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

#: most lines of one rank's output a text report shows (the JSON report keeps them all)
OUTPUT_LINES = 12
#: starts the line the grading worker writes before a case's first output, then the case's label
CASE_MARK = "\x1e"
#: the "case" of what the learner's file prints while it is imported
IMPORT_CASE = "while importing your file"


def split_cases(text: str) -> list[tuple[str | None, str]]:
    """A rank's output file as (case, line) pairs: the worker's mark lines say the case."""
    case, found = None, []
    for line in text.rstrip("\n").split("\n"):  # not splitlines: it splits at CASE_MARK too
        if line.startswith(CASE_MARK):
            case = line[len(CASE_MARK):]
        else:
            found.append((case, line))
    return found


@dataclass
class Check:
    """One line of the report: ✓ (ok True), ✗ (False) or – (None: not graded here)."""

    name: str
    ok: bool | None
    detail: str = ""
    #: the case the detail is about (the grader's label), so the report can show what the
    #: learner's code printed in that case first
    case: str | None = None

    @property
    def mark(self) -> str:
        return {True: "✓", False: "✗", None: "–"}[self.ok]


@dataclass
class Report:
    """The checks of one grading run, and ``output``: rank -> what that rank printed."""

    exercise: str
    file: str
    n: int
    checks: list[Check] = field(default_factory=list)
    output: dict[int, str] = field(default_factory=dict)
    #: rank -> (case, line) for every line printed: the case is the grader's label
    printed: dict[int, list[tuple[str | None, str]]] = field(default_factory=dict)

    def take_output(self, raw: dict[int, str]) -> None:
        """Keep the worker's output files (rank -> text with case marks) as ``printed``
        and, without the marks, as ``output``."""
        self.printed = {r: split_cases(text) for r, text in sorted(raw.items())}
        self.output = {r: "".join(ln + "\n" for _, ln in pairs)
                       for r, pairs in self.printed.items() if pairs}

    @property
    def failing_case(self) -> str | None:
        """The case the first ✗ is about (None if it names no case)."""
        return next((c.case for c in self.checks if c.ok is False), None)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok is not False for c in self.checks)

    @property
    def verdict(self) -> str:
        failed = sum(c.ok is False for c in self.checks)
        skipped = sum(c.ok is None for c in self.checks)
        ranks = f"{self.n} rank" + ("s" if self.n != 1 else "")
        if self.passed:
            checks = f"{skipped} check{'s' if skipped != 1 else ''}"
            note = f" ({checks} not graded on {ranks}: see –)" if skipped else ""
            return (
                f"PASS: {self.exercise} is correct and uses the right algorithm on {ranks}.{note}"
            )
        return (
            f"FAIL: {failed} of {len(self.checks)} checks failed on {ranks}; fix the first ✗ first."
        )

    def output_lines(self, verbose: bool = False, limit: int = OUTPUT_LINES) -> list[str]:
        """What the ranks printed, in blocks by case (the failing case first), each line
        as ``[rank R] line``.  Without ``verbose``: the failing case's lines (at most
        ``limit`` per rank), or the last ``limit`` lines per rank when the failing case
        printed nothing, and a line counting what was left out."""
        failing = self.failing_case
        pairs = [(case, rank, ln) for rank, found in sorted(self.printed.items())
                 for case, ln in found]
        if not pairs:
            return []
        in_failing = [p for p in pairs if failing is not None and p[0] == failing]
        if verbose:
            shown, left = pairs, ""
        elif in_failing:
            per_rank: Counter[int] = Counter()
            shown = []
            for p in in_failing:
                per_rank[p[1]] += 1
                shown += [p] if per_rank[p[1]] <= limit else []
            left = "lines from other cases" if len(shown) == len(in_failing) else "other lines"
        else:
            shown = [p for r in sorted(self.printed)
                     for p in [q for q in pairs if q[1] == r][-limit:]]
            left = "earlier lines"
        order = list(dict.fromkeys([failing] * bool(in_failing) + [c for c, _, _ in pairs]))
        lines = []
        for case in order:
            block = [(r, ln) for c, r, ln in shown if c == case]
            if not block:
                continue
            mark = " (the failing case)" if case == failing else ""
            lines.append(f"{'in ' + case if case else 'outside any case'}{mark}:")
            lines += [f"  [rank {r}] {ln}" for r, ln in sorted(block, key=lambda b: b[0])]
        hidden = len(pairs) - len(shown)
        if hidden:
            lines.append(f"({hidden} {left} not shown; --verbose shows all)")
        return lines

    def text(self, verbose: bool = False) -> str:
        """The report for a terminal; the ranks' output when a check failed, or ``verbose``."""
        ranks = f"{self.n} rank" + ("s" if self.n != 1 else "")
        lines = [f"minipar exercise check {self.exercise} {self.file}  ({ranks})", ""]
        for c in self.checks:
            lines.append(f"  {c.mark} {c.name}")
            lines += [f"      {d}" for d in c.detail.splitlines() if c.detail and c.ok is not True]
            if c.ok is True and c.detail:
                lines.append(f"      {c.detail.splitlines()[0]}")
        count = sum(map(len, self.printed.values()))
        if verbose or not self.passed:
            printed = self.output_lines(verbose)
            if printed:
                lines += ["", "what your code printed, by case and rank:",
                          *("  " + ln for ln in printed)]
            elif verbose:
                lines += ["", "your code printed nothing."]
        elif count:
            ranks = sum(bool(v) for v in self.printed.values())
            lines += ["", (f"your code printed {count} line{'s' if count != 1 else ''} on {ranks} "
                          f"rank{'s' if ranks != 1 else ''}, hidden because every check passed "
                          "(--verbose shows them).")]
        return "\n".join(lines + ["", self.verdict])

    def as_dict(self) -> dict[str, Any]:
        return {
            "exercise": self.exercise,
            "file": self.file,
            "n": self.n,
            "passed": self.passed,
            "verdict": self.verdict,
            "checks": [asdict(c) | {"mark": c.mark} for c in self.checks],
            "output": {str(r): text for r, text in sorted(self.output.items())},
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False)
