"""Whether a draft model's pass over a new prompt can pay for itself.

A draft model reads each prompt before its request drafts (``engine/drafting.py``,
``prefill_drafts``), in the step that produces the request's first token. On a long prompt
that pass is dear on a CPU: a 3000-token prompt cost the 0.5B draft about a third of what the
1.5B target's own prefill cost, all of it added to the time to the first token
(docs/benchmarks.md). Speculation repays it only over enough output tokens: each saves at most
a plain step's time less the time per token of a step whose drafts are all accepted. So where
a request's output cap (``max_tokens``, or the context's room) cannot repay the pass even
then, the request decodes plainly and the draft never reads its prompt: its first token comes
when a plain server's would, and its last no later. Greedy output is the same either way
(speculation never changes it). The cap is all the engine knows of an answer's length
before it starts: an answer that stops well short of it leaves a pass that was run unpaid.

The pass's cost per token is measured on the passes run (an exponential moving average);
the saving per token comes from the k controller's timed steps. Until both are known, and for
passes of fewer than ``min_tokens`` tokens, every prompt is read (what the engine did
before). A prompt that begins as a draft lane's held tokens costs only the rest
(``DraftModelProposer.uncached_tokens``), so a conversation's next turn keeps its drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.spec_decode.k_controller import KController


@dataclass
class PrefillBudget:
    """The draft's measured prompt-pass cost, and the test a pass must meet.

    Attributes:
        ema: weight of the newest pass in the moving average.
        min_tokens: passes shorter than this always run and are not timed (fixed costs
            dominate them).
        seconds_per_token: the average, None before a pass of ``min_tokens`` or more ran.
    """

    ema: float = 0.3
    min_tokens: int = 64
    seconds_per_token: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {self.ema}")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {self.min_tokens}")

    def record(self, num_tokens: int, seconds: float) -> None:
        """A pass of ``num_tokens`` tokens took ``seconds``."""
        if num_tokens < self.min_tokens:
            return
        sample = seconds / num_tokens
        old = self.seconds_per_token
        self.seconds_per_token = sample if old is None else old + self.ema * (sample - old)

    def pays(self, num_tokens: int, tokens_left: int, saving_per_token: float | None) -> bool:
        """Whether a pass of ``num_tokens`` can be repaid by ``tokens_left`` output tokens
        saving ``saving_per_token`` seconds each (None: not known yet, so it runs)."""
        if num_tokens < self.min_tokens or self.seconds_per_token is None:
            return True
        if saving_per_token is None:
            return True
        return num_tokens * self.seconds_per_token <= tokens_left * saving_per_token


def saving_per_token(controller: KController, batch_size: int = 1) -> float | None:
    """The most one output token can save against plain decoding at ``batch_size``, by the
    controller's timed costs: a plain step's time less the least time per token of a step
    whose k drafts (within the explored k) are all accepted, ``(k draft forwards + a k + 1
    token verify) / (k + 1)``; 0 when even that is no faster. None before a plain step of that
    batch size was timed. The best case, not the expected one: a request is left undrafted
    only where no outcome of its drafts could repay the pass, so acceptance estimates drawn
    from other requests (prose before a structured one) never decide it."""
    if not controller.plain_cost_measured(batch_size):
        return None
    plain = controller.verify_cost(1, batch_size)
    fastest = min(
        (
            (k * controller.draft_cost(1, batch_size) + controller.verify_cost(k + 1, batch_size))
            / (k + 1)
            for k in range(1, controller.explored_k(batch_size) + 1)
        ),
        default=plain,
    )
    return max(0.0, plain - fastest)
