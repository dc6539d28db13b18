"""Decayed per-position counts behind the k controller's estimates (``k_controller.py``).

Both keep, per draft position, a decayed count of chances and of successes, and give a
shrunk rate: (successes + weight * prior) / (chances + weight). Positions past the last one
seen take its counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceCounts:
    """Decayed counts, per draft position i, of drafts that reached i (every earlier one
    accepted) and of those accepted there."""

    accepted: list[float] = field(default_factory=list)  # decayed count per position
    reached: list[float] = field(default_factory=list)  # decayed drafts reaching position

    def observe(self, num_drafted: int, num_accepted: int, decay: float) -> None:
        self.accepted[:] = [a * decay for a in self.accepted]
        self.reached[:] = [r * decay for r in self.reached]
        n = min(num_drafted, num_accepted + 1)  # positions whose outcome we saw
        while len(self.reached) < n:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for i in range(n):
            self.reached[i] += 1.0
            if i < num_accepted:
                self.accepted[i] += 1.0

    def rate(self, pos: int, prior: float, weight: float) -> float:
        """Shrunk estimate of a_pos; unseen positions take the last seen one's counts."""
        if not self.reached:
            return prior
        i = min(pos, len(self.reached) - 1)
        return (self.accepted[i] + weight * prior) / (self.reached[i] + weight)


@dataclass
class ContinuationCounts:
    """Decayed counts, per draft position j >= 1, of steps whose proposer could have drafted
    past j - 1 (asked for more, returned at least j) and of those where it did."""

    chances: list[float] = field(default_factory=list)  # index j - 1
    continued: list[float] = field(default_factory=list)

    def observe(self, num_asked: int, num_drafted: int, decay: float) -> None:
        self.chances[:] = [c * decay for c in self.chances]
        self.continued[:] = [c * decay for c in self.continued]
        n = min(num_drafted, num_asked - 1)  # positions j = 1 .. n had the chance
        while len(self.chances) < n:
            self.chances.append(0.0)
            self.continued.append(0.0)
        for j in range(1, n + 1):
            self.chances[j - 1] += 1.0
            if num_drafted > j:
                self.continued[j - 1] += 1.0

    def rate(self, pos: int, prior: float, weight: float) -> float:
        """Shrunk estimate of c_pos (pos >= 1); positions past the last seen take its counts."""
        if not self.chances:
            return prior
        i = min(pos, len(self.chances)) - 1
        return (self.continued[i] + weight * prior) / (self.chances[i] + weight)


@dataclass
class ConfidenceCounts:
    """For a proposer with a confidence stop (it ends a draft after its first unsure token):
    decayed counts of drafted tokens whose class is known and of the confident ones among
    them, and per class, of tokens whose verdict was seen and of those accepted.

    Classes of a step that drafted d of k asked: d < k means the stop ended it, so tokens
    1 .. d - 1 were confident and token d unsure; d = k means tokens 1 .. k - 1 were
    confident and token k's class is unknown (counted as confident for acceptance, not
    counted for the confident fraction).
    """

    known: float = 0.0
    confident: float = 0.0
    seen: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    accepted: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})

    def observe(self, num_asked: int, num_drafted: int, num_accepted: int, decay: float) -> None:
        self.known *= decay
        self.confident *= decay
        for c in (True, False):
            self.seen[c] *= decay
            self.accepted[c] *= decay
        stopped = num_drafted < num_asked
        self.known += num_drafted if stopped else num_drafted - 1
        self.confident += num_drafted - 1
        for pos in range(min(num_accepted + 1, num_drafted)):  # verdicts seen
            confident = not (stopped and pos == num_drafted - 1)
            self.seen[confident] += 1.0
            if pos < num_accepted:
                self.accepted[confident] += 1.0

    def confident_rate(self, prior: float, weight: float) -> float:
        return (self.confident + weight * prior) / (self.known + weight)

    def acceptance(self, confident: bool, prior: float, weight: float) -> float:
        return (self.accepted[confident] + weight * prior) / (self.seen[confident] + weight)
