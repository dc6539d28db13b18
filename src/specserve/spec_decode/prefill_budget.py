"""When a draft model reads a new prompt: at once, a chunk a step, or never.

A draft model reads each prompt before its request drafts (``engine/drafting.py``,
``read_prompts``). On a long prompt that pass is dear on a CPU: a 3000-token prompt cost the
0.5B draft about a third of what the 1.5B target's own prefill cost (docs/benchmarks.md).
Speculation repays it only over enough output tokens: each saves at most a plain step's time
less the time per token of a step whose drafts are all accepted. The engine knows the
request's output cap (``max_tokens``, or the context's room) but not where the answer will
stop, so it rents before it buys:

- where even the whole cap cannot repay the pass, the draft never reads the prompt and the
  request decodes plainly (``Request.drafts_off``);
- where the first ``upfront_tokens`` output tokens would repay it (a short prompt), the pass
  runs at once, in the step that produces the first token (what vLLM's draft proposer does);
- otherwise the request decodes plainly while the draft reads its tokens a chunk a step
  (``Request.draft_reading``), each step's chunks costing about ``step_share`` of a plain
  step, and drafts once the lane has caught up. The first token comes when a plain server's
  would; an answer that stops early has paid for the chunks of the steps it ran, not for the
  whole pass; the remaining pass is weighed again each step against the cap that is left.

The pass's cost per token is measured on the passes run (an exponential moving average); the
saving per token comes from the k controller's timed steps. Until the cost is known a first
chunk of ``min_tokens`` runs and is timed; until a plain step is timed the prompt is read in
chunks. Passes of fewer than ``min_tokens`` tokens always run at once. A prompt that begins as
a draft lane's held tokens costs only the rest (``DraftModelProposer.uncached_tokens``), so a
conversation's next turn keeps its drafts. Greedy output is the same whichever way the
prompt is read (speculation never changes it).
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.spec_decode.k_controller import KController


@dataclass
class PrefillBudget:
    """The draft's measured prompt-pass cost, and how much of a pass runs in a step.

    Attributes:
        ema: weight of the newest pass in the moving average.
        min_tokens: passes shorter than this always run at once; the first chunk's size
            while the cost is not known.
        upfront_tokens: a pass the best-case saving of this many output tokens repays runs
            at once.
        step_share: a reading step's chunks cost about this share of a plain step.
        min_chunk: the smallest chunk, and the shortest pass timed (fixed costs dominate
            shorter ones).
        seconds_per_token: the average, None before a pass of ``min_chunk`` or more ran.
    """

    ema: float = 0.3
    min_tokens: int = 64
    upfront_tokens: int = 32
    step_share: float = 1.0
    min_chunk: int = 16
    seconds_per_token: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {self.ema}")
        if not 1 <= self.min_chunk <= self.min_tokens:
            raise ValueError(
                f"need 1 <= min_chunk <= min_tokens, got {self.min_chunk} and {self.min_tokens}"
            )
        if self.upfront_tokens < 0 or self.step_share <= 0:
            raise ValueError(
                f"upfront_tokens must be >= 0 and step_share > 0, got {self.upfront_tokens} "
                f"and {self.step_share}"
            )

    def record(self, num_tokens: int, seconds: float) -> None:
        """A pass of ``num_tokens`` tokens took ``seconds``."""
        if num_tokens < self.min_chunk:
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

    def chunk(self, plain_step_s: float | None) -> int:
        """Tokens a reading step runs: those costing ``step_share`` of a plain step of
        ``plain_step_s`` seconds (at least ``min_chunk``); ``min_tokens`` while either cost is
        unknown."""
        spt = self.seconds_per_token
        if spt is None or plain_step_s is None:
            return self.min_tokens
        return max(self.min_chunk, int(self.step_share * plain_step_s / spt))

    def first_pass(
        self,
        num_tokens: int,
        tokens_left: int,
        saving_per_token: float | None,
        plain_step_s: float | None,
    ) -> int | None:
        """How many of a new prompt's ``num_tokens`` uncached tokens the draft runs in the step
        that produces the request's first token: all of them, a first chunk (the rest in
        later steps), or None, never (``tokens_left`` output tokens saving at most
        ``saving_per_token`` seconds each cannot repay them). See the module docstring."""
        if num_tokens < self.min_tokens:
            return num_tokens
        if self.seconds_per_token is None:
            return self.min_tokens  # timed, so the next steps know the cost
        if saving_per_token is None:
            return min(num_tokens, self.chunk(plain_step_s))
        if not self.pays(num_tokens, tokens_left, saving_per_token):
            return None
        if num_tokens * self.seconds_per_token <= self.upfront_tokens * saving_per_token:
            return num_tokens
        return min(num_tokens, self.chunk(plain_step_s))


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
