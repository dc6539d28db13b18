"""Prometheus counters of the mock server, named like vLLM's spec-decode counters.

The mock pretends every content chunk is one speculative step that drafted ``spec_k`` tokens,
of which ``tokens_per_chunk − 1`` were accepted (the last token of a step is the bonus token).
"""

from __future__ import annotations

import threading


class MockCounters:
    """Thread-safe counters rendered as Prometheus text."""

    def __init__(self, spec_k: int, total_suffix: bool) -> None:
        self.spec_k = spec_k
        self.suffix = "_total" if total_suffix else ""
        self._lock = threading.Lock()
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * spec_k
        self.num_tokens = 0

    def step(self, num_tokens: int) -> None:
        """Account one streamed chunk of ``num_tokens`` tokens."""
        with self._lock:
            self.num_tokens += num_tokens
            if self.spec_k == 0:
                return
            self.num_drafts += 1
            self.num_draft_tokens += self.spec_k
            accepted = min(num_tokens - 1, self.spec_k)
            self.num_accepted_tokens += accepted
            for pos in range(accepted):
                self.accepted_per_pos[pos] += 1

    def render(self) -> str:
        s = self.suffix
        with self._lock:
            lines = [
                "# TYPE mock:generation_tokens counter",
                f'mock:generation_tokens{s}{{model_name="mock"}} {self.num_tokens}',
            ]
            if self.spec_k:
                lines += [
                    "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
                    "# TYPE vllm:spec_decode_num_drafts counter",
                    f'vllm:spec_decode_num_drafts{s}{{model_name="mock"}} {self.num_drafts}',
                    "# TYPE vllm:spec_decode_num_draft_tokens counter",
                    f'vllm:spec_decode_num_draft_tokens{s}{{model_name="mock"}} '
                    f"{self.num_draft_tokens}",
                    "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                    f'vllm:spec_decode_num_accepted_tokens{s}{{model_name="mock"}} '
                    f"{self.num_accepted_tokens}",
                    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                ]
                lines += [
                    f'vllm:spec_decode_num_accepted_tokens_per_pos{s}{{model_name="mock",'
                    f'position="{pos}"}} {count}'
                    for pos, count in enumerate(self.accepted_per_pos)
                ]
        return "\n".join(lines) + "\n"
