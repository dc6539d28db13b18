"""Suffix drafting (SuffixDecoding, Oliaro et al., 2024): match the end of the context in a
suffix trie of earlier text and propose the most frequent continuation.

Terms:
    suffix trie: a trie holding every substring of length <= ``max_depth`` of the inserted
        sequences, each node counting how often its substring occurs. Appending a token costs
        O(max_depth): the nodes of the suffixes ending at the last token each grow one child.
    match: the longest tail of the context (at least ``min_match_len`` tokens) present in a
        trie with a continuation.
    confidence: the product, over drafted tokens, of count(child) / sum(counts of children),
        the empirical probability that the whole draft so far is what followed before.
        Drafting stops once it would fall below ``min_confidence``.

Two tries are searched: the request's own (prompt + output so far) and a global one over
the outputs of recently finished requests, bounded to ``max_history_tokens`` (oldest first
out). The longer match wins; a tie goes to the request's own trie. When a walk reaches the
trie's depth limit it re-matches on the context extended by the draft, so a long repetition
is drafted as far as k allows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from specserve.spec_decode.proposer import Proposal, ProposeInput


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


class SuffixTrie:
    """Counted substrings (length <= max_depth) of the sequences appended to it."""

    def __init__(self, max_depth: int) -> None:
        assert max_depth >= 2
        self.max_depth = max_depth
        self.root = _Node()

    def new_cursor(self) -> list[_Node]:
        """State of one sequence being appended: its suffix nodes, shortest first."""
        return []

    def append(self, cursor: list[_Node], token: int) -> list[_Node]:
        """Append ``token`` to the sequence whose state is ``cursor``; returns the new state."""
        grown = []
        for node in [self.root, *cursor[: self.max_depth - 1]]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            grown.append(child)
        return grown

    def extend(self, tokens: Sequence[int]) -> None:
        """Insert one whole sequence."""
        cursor = self.new_cursor()
        for t in tokens:
            cursor = self.append(cursor, t)

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo ``extend(tokens)``: decrement every window's counts, pruning empty nodes."""
        for start in range(len(tokens)):
            node = self.root
            for t in tokens[start : start + self.max_depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]
                    break
                node = child

    def find(self, tail: Sequence[int]) -> _Node | None:
        node: _Node | None = self.root
        for t in tail:
            assert node is not None
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def longest_match(self, context: Sequence[int], min_len: int) -> tuple[int, _Node | None]:
        """Longest tail of ``context`` (>= min_len tokens) whose node has a continuation."""
        for n in range(min(len(context), self.max_depth - 1), min_len - 1, -1):
            node = self.find(context[len(context) - n :])
            if node is not None and node.children:
                return n, node
        return 0, None


@dataclass
class _RequestState:
    trie: SuffixTrie
    tokens: list[int] = field(default_factory=list)  # what has been inserted into `trie`
    cursor: list[_Node] = field(default_factory=list)
    prompt_len: int = 0


class SuffixProposer:
    """SuffixDecoding-style proposer (see the module docstring).

    Args:
        max_depth: longest substring a trie stores.
        min_match_len: shortest context tail accepted as a match.
        min_confidence: drafting stops before the draft's confidence drops below this.
        max_history_tokens: bound on the global trie's tokens (finished requests' outputs).
    """

    def __init__(
        self,
        max_depth: int = 24,
        min_match_len: int = 2,
        min_confidence: float = 0.1,
        max_history_tokens: int = 20_000,
    ) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        if not (1 <= min_match_len < max_depth):
            raise ValueError(f"min_match_len must be in [1, max_depth), got {min_match_len}")
        if not (0.0 <= min_confidence <= 1.0):
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        if max_history_tokens < 0:
            raise ValueError(f"max_history_tokens must be >= 0, got {max_history_tokens}")
        self.max_depth = max_depth
        self.min_match_len = min_match_len
        self.min_confidence = min_confidence
        self.max_history_tokens = max_history_tokens
        self.global_trie = SuffixTrie(max_depth)
        self._history: deque[list[int]] = deque()
        self._history_tokens = 0
        self._requests: dict[str, _RequestState] = {}

    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        return [Proposal(self._propose_one(inp)) for inp in batch]

    def release(self, request_id: str) -> None:
        """Forget the request; its output joins the bounded global history."""
        state = self._requests.pop(request_id, None)
        if state is None or self.max_history_tokens == 0:
            return
        output = state.tokens[state.prompt_len :][-self.max_history_tokens :]
        if len(output) < 2:
            return
        self.global_trie.extend(output)
        self._history.append(output)
        self._history_tokens += len(output)
        while self._history_tokens > self.max_history_tokens:
            old = self._history.popleft()
            self.global_trie.remove(old)
            self._history_tokens -= len(old)

    def _sync(self, inp: ProposeInput) -> _RequestState:
        """Bring the request's trie up to ``inp.token_ids`` (committed tokens only grow;
        anything else, e.g. a recomputed request, rebuilds the trie)."""
        state = self._requests.get(inp.request_id)
        tokens = inp.token_ids
        n = len(state.tokens) if state is not None else 0
        if state is None or len(tokens) < n or tokens[n - 1] != state.tokens[-1]:
            # Tokens committed before the first draft request count as the prompt (they
            # include the first generated token, which then stays out of the global history).
            state = _RequestState(SuffixTrie(self.max_depth), prompt_len=len(tokens) - 1)
            self._requests[inp.request_id] = state
        for t in tokens[len(state.tokens) :]:
            state.cursor = state.trie.append(state.cursor, t)
            state.tokens.append(t)
        return state

    def _match(self, state: _RequestState, context: Sequence[int]) -> _Node | None:
        own_len, own = state.trie.longest_match(context, self.min_match_len)
        glob_len, glob = self.global_trie.longest_match(context, self.min_match_len)
        return glob if glob_len > own_len else own

    def _propose_one(self, inp: ProposeInput) -> list[int]:
        state = self._sync(inp)
        context = list(inp.token_ids)
        draft: list[int] = []
        confidence = 1.0
        node = self._match(state, context)
        while node is not None and len(draft) < inp.num_draft_tokens:
            total = sum(c.count for c in node.children.values())
            token, child = max(node.children.items(), key=lambda kv: kv[1].count)
            confidence *= child.count / total
            if confidence < self.min_confidence:
                break
            draft.append(token)
            context.append(token)
            # At the depth limit (no children) look the extended context up again.
            node = child if child.children else self._match(state, context)
        return draft
