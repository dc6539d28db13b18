"""Decayed per-position counts behind the k controller's estimates (``k_controller.py``).

Each keeps decayed counts of chances and of successes and gives a shrunk rate:
(successes + weight * prior) / (chances + weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PrefixCounts:
    """Decayed counts, per position i, of steps that reached i (its outcome was seen) and of
    those that succeeded there. A step reaches a prefix of the positions and succeeds on a
    prefix of those. Two uses in the k controller:

    - acceptance a_i: position i is draft token i; a step that drafted d and had a accepted
      reaches positions < min(d, a + 1) and succeeds at positions < a.
    - continuation c_j: position j - 1 is the chance to draft past token j; a step that asked
      for k and got d reaches positions < min(d, k - 1) and succeeds at positions < d - 1.
    """

    reached: list[float] = field(default_factory=list)
    succeeded: list[float] = field(default_factory=list)

    def observe(self, num_reached: int, num_succeeded: int, decay: float) -> None:
        self.reached[:] = [r * decay for r in self.reached]
        self.succeeded[:] = [s * decay for s in self.succeeded]
        while len(self.reached) < num_reached:
            self.reached.append(0.0)
            self.succeeded.append(0.0)
        for i in range(num_reached):
            self.reached[i] += 1.0
            if i < num_succeeded:
                self.succeeded[i] += 1.0

    def rate(self, pos: int, prior: float, weight: float) -> float:
        """Shrunk estimate at position ``pos``; positions past the last seen take its
        counts."""
        if not self.reached:
            return prior
        i = min(pos, len(self.reached) - 1)
        return (self.succeeded[i] + weight * prior) / (self.reached[i] + weight)


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
