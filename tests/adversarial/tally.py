"""The adversarial run's tally: every attack's outcome, printed at the end of the test session
(``conftest.py`` hooks it into pytest's terminal summary, so it shows without ``-s``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

RIGHT = "right answer"
GAP = "known gap"  # see file_attacks.KNOWN_GAPS
WRONG = "WRONG"  # a silent wrong answer, a foreign exception, a signal, deleted data: the test fails


@dataclass(frozen=True)
class Outcome:
    """What one attack (a damage, then one reader) gave: ``RIGHT``, a msgindex error class (or
    ``exit 2``, the CLI's), or ``WRONG`` with why."""

    attack: str
    result: str
    detail: str = ""

    @property
    def wrong(self) -> bool:
        return self.result == WRONG


class Tally:
    """Outcomes collected over the session, summed per result."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def add(self, outcomes: list[Outcome]) -> None:
        self.outcomes.extend(outcomes)

    def lines(self) -> list[str]:
        if not self.outcomes:
            return []
        counts = Counter(outcome.result for outcome in self.outcomes)
        by_group = Counter(outcome.attack.split(" ", 1)[0] for outcome in self.outcomes)
        gaps = counts.pop(GAP, 0)
        lines = [f"adversarial: {len(self.outcomes)} attacks, {counts.pop(RIGHT, 0)} right answers, "
                 f"{sum(n for r, n in counts.items() if r != WRONG)} clear errors, {counts.pop(WRONG, 0)} wrong, "
                 f"{gaps} known gaps (silent misses only msgindex inspect finds, or errors naming another file)"]
        lines.append("  errors by class: " + ", ".join(f"{result} {n}" for result, n in sorted(counts.items())))
        lines.append("  attacks by group: " + ", ".join(f"{group} {n}" for group, n in sorted(by_group.items())))
        lines += [f"  known gap {outcome.attack}: {outcome.detail[:160]!r}" for outcome in self.outcomes
                  if outcome.result == GAP]
        lines += [f"  WRONG {outcome.attack}: {outcome.detail[:300]!r}" for outcome in self.outcomes if outcome.wrong]
        return lines


TALLY = Tally()
