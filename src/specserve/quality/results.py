"""What the quality check produced: per task, each arm's pass@1 with its 95 % CI, the paired
difference with its CI, and every request's prompt and answers (``quality.json``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ArmAnswer(BaseModel):
    """One arm's answer to one item."""

    text: str
    passed: bool
    detail: str = Field(description="Why it failed, or 'passed'/'exact match'.")
    finish_reason: str | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0
    error: str | None = Field(default=None, description="The request's error, if it failed.")


class ItemRecord(BaseModel):
    """One item: what was sent (identically to every arm) and what each arm answered."""

    item_id: str
    endpoint: str
    prompt: str
    max_tokens: int
    reference: str
    answers: dict[str, ArmAnswer]
    identical: bool = Field(description="Both arms' texts are equal (greedy exact match).")


class ArmScore(BaseModel):
    passed: int
    n: int
    pass_at_1: float
    ci95: tuple[float, float] = Field(description="Wilson score interval.")
    errors: int = Field(default=0, description="Requests that failed (counted as not passed).")


class PairedDelta(BaseModel):
    """pass@1 of the second arm minus the first's, on the same items."""

    delta: float
    ci95: tuple[float, float] = Field(description="Newcombe's paired interval (method 10).")
    both: int
    only_first: int
    only_second: int
    neither: int


class TaskResult(BaseModel):
    task: str
    description: str
    arms: dict[str, ArmScore]
    delta: PairedDelta
    identical: int = Field(description="Items whose texts are equal between the arms.")
    records: list[ItemRecord]


class QualityReport(BaseModel):
    """The whole check, in arm order (baseline first, so delta = speculative − baseline)."""

    arm_names: tuple[str, str]
    tasks: list[TaskResult]
    sandbox: dict[str, object] = Field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, dict[str, object]]:
        """Per task: each arm's pass@1 and CI, the delta and its CI, and n."""
        out: dict[str, dict[str, object]] = {}
        for t in self.tasks:
            entry: dict[str, object] = {
                arm: {"pass_at_1": s.pass_at_1, "ci95": list(s.ci95)} for arm, s in t.arms.items()
            }
            entry["delta"] = t.delta.delta
            entry["delta_ci95"] = list(t.delta.ci95)
            entry["n"] = len(t.records)
            out[t.task] = entry
        return out

    def lines(self) -> list[str]:
        """One line per task for headline.md and the terminal."""
        first, second = self.arm_names
        out = []
        for t in self.tasks:
            a, b = t.arms[first], t.arms[second]
            lo, hi = t.delta.ci95
            errors = sum(s.errors for s in t.arms.values())
            out.append(
                f"{t.task} (n={len(t.records)}): {first} {_score(a)}, {second} {_score(b)}, "
                f"Δ {t.delta.delta:+.2f} [{lo:+.2f}, {hi:+.2f}]; identical outputs "
                f"{t.identical}/{len(t.records)}" + (f"; {errors} request errors" if errors else "")
            )
        return out

    def markdown(self) -> str:
        first, second = self.arm_names
        head = (
            f"Quality (pass@1 with Wilson 95 % CI; Δ = {second} − {first}, paired Newcombe "
            "95 % CI; details in quality.json):"
        )
        return "\n".join([head, "", *[f"- {ln}" for ln in self.lines()]]) + "\n"


def _score(s: ArmScore) -> str:
    return f"{s.pass_at_1:.2f} [{s.ci95[0]:.2f}, {s.ci95[1]:.2f}] ({s.passed}/{s.n})"
