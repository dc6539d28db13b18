"""Run the quality tasks on two arms: the same items to both, in windows of ``concurrency``
items that one arm answers at once (concurrent requests) before the other arm gets the same
window, the arms in ABBA order over windows (window 0 asks the first arm first, window 1 the
second, ...) so that the two servers never compete for the machine; every answer scored as it
arrives; then pass@1 per arm with its CI and the paired difference."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from specserve.quality.client import Answer, ArmEndpoint, ask
from specserve.quality.config import QualityConfig
from specserve.quality.exact import ExactTask
from specserve.quality.humaneval import HumanEvalTask
from specserve.quality.items import Item, Score, Task
from specserve.quality.results import (
    ArmAnswer,
    ArmScore,
    ItemRecord,
    PairedDelta,
    QualityReport,
    TaskResult,
)
from specserve.quality.sandbox import SandboxLimits, isolation_description
from specserve.quality.stats import PairedCounts, paired_difference_interval, wilson_interval

logger = logging.getLogger(__name__)


def build_tasks(cfg: QualityConfig) -> list[Task]:
    """The configured tasks; raises ``QualityTaskUnavailable`` naming a missing package."""
    tasks: list[Task] = []
    if cfg.humaneval is not None:
        tasks.append(HumanEvalTask(cfg.humaneval))
    if cfg.exact is not None:
        tasks.append(ExactTask(cfg.exact))
    return tasks


def check_quality(cfg: QualityConfig) -> None:
    """Fail before any server starts: a missing package, or namespaces required but refused."""
    build_tasks(cfg)
    if cfg.humaneval is not None:
        isolation_description(_limits(cfg))


def _limits(cfg: QualityConfig) -> SandboxLimits:
    he = cfg.humaneval
    if he is None:
        return SandboxLimits()
    return SandboxLimits(timeout_s=he.timeout_s, memory_mb=he.memory_mb, isolation=he.isolation)


def run_quality(
    cfg: QualityConfig,
    arms: Mapping[str, ArmEndpoint],
    on_status: Callable[[str], None] = logger.info,
) -> QualityReport:
    """Ask both arms every item of every task and score the answers."""
    names = tuple(arms)
    if len(names) != 2:
        raise ValueError(f"the quality check compares two arms, got {list(names)}")
    first, second = names
    start = time.perf_counter()
    tasks = build_tasks(cfg)
    sandbox = isolation_description(_limits(cfg)) if cfg.humaneval is not None else {}
    results = []
    width = cfg.concurrency
    with (
        httpx.Client(timeout=cfg.request_timeout_s) as client,
        ThreadPoolExecutor(max_workers=width, thread_name_prefix="quality") as pool,
    ):
        for task in tasks:
            records = []
            items = task.items
            for w, start in enumerate(range(0, len(items), width)):
                window = items[start : start + width]
                order = (first, second) if w % 2 == 0 else (second, first)
                answers = {arm: _ask_window(pool, client, arms[arm], task, window) for arm in order}
                for j, item in enumerate(window):
                    got = {arm: answers[arm][j] for arm in names}
                    records.append(_record(item, got))
                    verdicts = ", ".join(
                        f"{arm} {'passed' if got[arm].passed else 'failed'}" for arm in names
                    )
                    on_status(
                        f"quality {task.name} {start + j + 1}/{len(items)} {item.item_id}: "
                        f"{verdicts}"
                    )
            results.append(_task_result(task, (first, second), records))
    return QualityReport(
        arm_names=(first, second),
        tasks=results,
        sandbox=sandbox,
        seconds=time.perf_counter() - start,
    )


def _ask_window(
    pool: ThreadPoolExecutor,
    client: httpx.Client,
    arm: ArmEndpoint,
    task: Task,
    window: Sequence[Item],
) -> list[ArmAnswer]:
    """One arm's scored answers to ``window``, its requests in flight together."""
    return list(pool.map(lambda item: _answer(task, item, ask(client, arm, item)), window))


def _answer(task: Task, item: Item, answer: Answer) -> ArmAnswer:
    if answer.error is not None:
        score = Score(False, f"request failed: {answer.error}")
    else:
        score = task.score(item, answer.text)
    return ArmAnswer(
        text=answer.text,
        passed=score.passed,
        detail=score.detail,
        finish_reason=answer.finish_reason,
        completion_tokens=answer.completion_tokens,
        seconds=round(answer.seconds, 4),
        error=answer.error,
    )


def _record(item: Item, answers: dict[str, ArmAnswer]) -> ItemRecord:
    texts = [a.text for a in answers.values()]
    return ItemRecord(
        item_id=item.item_id,
        endpoint=item.endpoint,
        prompt=item.prompt,
        max_tokens=item.max_tokens,
        reference=item.reference,
        answers=answers,
        identical=all(t == texts[0] for t in texts)
        and all(a.error is None for a in answers.values()),
    )


def _task_result(task: Task, names: tuple[str, str], records: list[ItemRecord]) -> TaskResult:
    outcomes = {arm: [r.answers[arm].passed for r in records] for arm in names}
    arms = {}
    for arm, passed in outcomes.items():
        n, k = len(passed), sum(passed)
        arms[arm] = ArmScore(
            passed=k,
            n=n,
            pass_at_1=task.pass_rate(passed),
            ci95=wilson_interval(k, n),
            errors=sum(r.answers[arm].error is not None for r in records),
        )
    counts = PairedCounts.of(outcomes[names[0]], outcomes[names[1]])
    delta, low, high = paired_difference_interval(counts)
    return TaskResult(
        task=task.name,
        description=task.description,
        arms=arms,
        delta=PairedDelta(
            delta=delta,
            ci95=(low, high),
            both=counts.both,
            only_first=counts.only_a,
            only_second=counts.only_b,
            neither=counts.neither,
        ),
        identical=sum(r.identical for r in records),
        records=records,
    )


def write_quality(report: QualityReport, path: Path) -> None:
    """quality.json: the report, every prompt and answer included."""
    path.write_text(report.model_dump_json(indent=1), encoding="utf-8")
