"""When a request is finished: EOS / stop ids, stop strings, length limits.

Shared by plain generation, the speculative loop and the engine so that every path stops at
exactly the same token (a speculative step may accept several tokens past a stop; the extra
ones are dropped here).
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class StopDecision:
    """Outcome of checking newly accepted tokens.

    Attributes:
        num_kept: how many of the new tokens are kept (the rest are discarded).
        finish_reason: ``stop`` (EOS, stop id or stop string), ``length`` or None (go on).
    """

    num_kept: int
    finish_reason: str | None


def check_new_tokens(
    new_token_ids: list[int],
    num_generated_before: int,
    params: SamplingParams,
    eos_token_ids: tuple[int, ...],
    max_total_generated: int,
) -> StopDecision:
    """Walk new tokens in order and stop at the first EOS/stop id or the length limit.

    Args:
        new_token_ids: tokens accepted this step, in order.
        num_generated_before: tokens generated before this step.
        params: the request's sampling parameters.
        eos_token_ids: the model's end-of-sequence ids (ignored under ``ignore_eos``).
        max_total_generated: the effective cap (min of max_tokens and the context room).
    Stop ids are kept in the output count like vLLM (the EOS token is counted, not shown).
    Stop strings are handled on text by the detokenizer; see ``find_stop_string``.
    """
    stop_ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        stop_ids.update(eos_token_ids)
    for i, tok in enumerate(new_token_ids):
        n = num_generated_before + i + 1
        if tok in stop_ids and n > params.min_tokens:
            return StopDecision(i + 1, "stop")
        if n >= max_total_generated:
            return StopDecision(i + 1, "length")
    return StopDecision(len(new_token_ids), None)


def find_stop_string(text: str, stop: tuple[str, ...], search_from: int = 0) -> int | None:
    """Index where the earliest stop string starts in ``text`` (searching from
    ``search_from`` minus the longest stop's length), or None."""
    if not stop:
        return None
    start = max(0, search_from - max(len(s) for s in stop) + 1)
    hits = [i for s in stop if (i := text.find(s, start)) != -1]
    return min(hits) if hits else None
