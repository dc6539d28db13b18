"""Cumulative engine statistics: folds each step's :class:`StepStats` into
:class:`EngineStats` and hands out consistent snapshots."""

from __future__ import annotations

import copy

from specserve.engine.outputs import EngineStats, HistogramCounts, StepStats
from specserve.kv_cache.block_pool import BlockPool


class StatsTracker:
    """Owned by the engine's step thread; :meth:`snapshot` copies, so readers never see a
    half-updated object."""

    def __init__(self, model_name: str, k_max: int) -> None:
        self._stats = EngineStats(
            model_name=model_name,
            k_chosen_hist=HistogramCounts(tuple(float(k) for k in range(k_max + 1))),
        )

    def record_step(self, step: StepStats) -> None:
        s = self._stats
        s.num_steps += 1
        s.num_running, s.num_waiting = step.num_running, step.num_waiting
        s.kv_cache_usage = step.kv_cache_usage
        s.spec.merge(step.spec)
        for k in step.k_chosen:
            s.k_chosen_counts[k] = s.k_chosen_counts.get(k, 0) + 1
            s.k_chosen_hist.observe(k)
        s.num_spec_off_steps += step.num_spec_off
        s.num_prompts_undrafted += step.num_prompts_undrafted
        s.num_prompts_chunked += step.num_prompts_chunked
        s.num_preemptions += step.num_preemptions
        if step.num_draft_tokens or step.draft_s > 0:
            s.draft_s += step.draft_s
            s.draft_time_hist.observe(step.draft_s)
        s.verify_s += step.verify_s
        s.verify_time_hist.observe(step.verify_s)
        s.num_prompt_tokens += step.num_prompt_tokens
        s.num_generation_tokens += step.num_generation_tokens

    def record_finished(self, reason: str) -> None:
        self._stats.num_finished[reason] = self._stats.num_finished.get(reason, 0) + 1

    def record_rejected(self, reason: str) -> None:
        self._stats.num_rejected[reason] = self._stats.num_rejected.get(reason, 0) + 1

    def update_gauges(self, num_running: int, num_waiting: int, pool: BlockPool) -> None:
        s = self._stats
        s.num_running, s.num_waiting = num_running, num_waiting
        s.kv_cache_usage = pool.usage
        s.num_blocks_total = pool.num_usable_blocks
        s.num_blocks_free = pool.num_free_blocks
        s.num_blocks_cached = pool.num_cached_blocks
        s.prefix_cache_queries = pool.num_cache_queries
        s.prefix_cache_hits = pool.num_cache_hits

    def snapshot(self) -> EngineStats:
        return copy.deepcopy(self._stats)
