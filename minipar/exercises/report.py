"""The report of ``minipar exercise check``: ✓/✗ lines, a verdict, the ranks' own output.

EN grading report · RU отчёт проверки · ZH 评分报告

A :class:`Report` is a list of :class:`Check` lines (✓ passed, ✗ failed,
– not graded on this many ranks) and the verdict.  It also keeps what each
rank of the learner's code printed (``print()`` and anything else written to
stdout or stderr while their function ran): shown, each line prefixed by its
rank, when a check fails, and always with ``verbose`` (``--verbose``), so a
learner debugging with ``print`` sees their prints.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: most lines of one rank's output a text report shows (the JSON report keeps them all)
OUTPUT_LINES = 12


@dataclass
class Check:
    """One line of the report: ✓ (ok True), ✗ (False) or – (None: not graded here)."""

    name: str
    ok: bool | None
    detail: str = ""

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

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok is not False for c in self.checks)

    @property
    def verdict(self) -> str:
        failed = sum(c.ok is False for c in self.checks)
        skipped = sum(c.ok is None for c in self.checks)
        ranks = f"{self.n} rank" + ("s" if self.n != 1 else "")
        if self.passed:
            note = f" ({skipped} check not graded on {ranks}: see –)" if skipped else ""
            return (
                f"PASS: {self.exercise} is correct and uses the right algorithm on {ranks}.{note}"
            )
        return (
            f"FAIL: {failed} of {len(self.checks)} checks failed on {ranks}; fix the first ✗ first."
        )

    def output_lines(self, limit: int | None = OUTPUT_LINES) -> list[str]:
        """Every rank's printed lines as ``[rank R] line``, rank by rank (last ``limit`` each)."""
        lines = []
        for rank in sorted(self.output):
            mine = self.output[rank].rstrip("\n").splitlines()
            if limit is not None and len(mine) > limit:
                lines.append(f"[rank {rank}] ... ({len(mine) - limit} earlier lines not shown)")
                mine = mine[-limit:]
            lines += [f"[rank {rank}] {ln}" for ln in mine]
        return lines

    def text(self, verbose: bool = False) -> str:
        """The report for a terminal; the ranks' output when a check failed, or ``verbose``."""
        lines = [f"minipar exercise check {self.exercise} {self.file}  ({self.n} ranks)", ""]
        for c in self.checks:
            lines.append(f"  {c.mark} {c.name}")
            lines += [f"      {d}" for d in c.detail.splitlines() if c.detail and c.ok is not True]
            if c.ok is True and c.detail:
                lines.append(f"      {c.detail.splitlines()[0]}")
        if verbose or not self.passed:
            printed = self.output_lines()
            if printed:
                lines += ["", "what your code printed, by rank:", *("  " + ln for ln in printed)]
            elif verbose:
                lines += ["", "your code printed nothing."]
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
