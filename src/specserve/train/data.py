"""What a draft head trains on: conversations and the replies the target gives to them.

Self-distillation, as EAGLE-3 trains: the head learns to predict *the target's* tokens. By
default every training conversation ends with a user turn and the target generates the reply
at temperature 0 (``generate.py``). A conversation may instead come with its reply **given**
(a dataset's own replies, or text): the whole conversation is then read in one teacher-forced
prefill, and each position is labelled with the token the target itself would write next
there (its argmax), not the text's own next token. Sources:

- **A user's JSONL** (``--data``), one object per line: ``{"prompt": str}``, OpenAI chat
  ``{"messages": [{"role", "content"}, ...]}`` or ShareGPT ``{"conversations": [{"from",
  "value"}, ...]}`` (the formats ``speculators`` and SpecForge read). A conversation is cut
  after its last user turn; any assistant reply after it is dropped and regenerated, or with
  ``--replies given`` kept as the given reply (then every conversation needs one).
- **The built-in set** (``--num-prompts``): prompts made from the Python standard library's
  own sources, a corpus present wherever Python runs. Each picks a function, class or
  docstring of a stdlib module and asks for one of the kinds of output the benchmark suites
  measure (repeating and counting, JSON and tables, reports, code, explanation and prose),
  with its own content. The target writes the replies.
- **Built-in given replies** (``--text-prompts``): the standard library's documentation
  topics (``pydoc_data``, the prose of the language reference) and its functions' sources,
  each as the reply to a question asking for it.

The benchmark suites' prompts themselves are never used: they are what the trained head is
measured on.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TrainingDataError(ValueError):
    """Training data that cannot be used (the message names the file, line and problem)."""


@dataclass(frozen=True)
class Conversation:
    """One training item: the messages before the reply the target writes.

    Attributes:
        id: stable id (``<source>-<n>``), used to resume generation.
        messages: chat messages, the last one from the user.
        reply: the given reply (read teacher-forced), or None: the target writes it.
    """

    id: str
    messages: tuple[tuple[str, str], ...]
    reply: str | None = None

    def as_chat(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def with_reply(self) -> list[dict[str, str]]:
        """The messages and the given reply, as one chat."""
        assert self.reply is not None
        return [*self.as_chat(), {"role": "assistant", "content": self.reply}]


_ROLES = {
    "human": "user", "user": "user", "system": "system",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
}  # fmt: skip


def _messages(obj: dict[str, Any], where: str) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The turns up to the last user turn, and the first assistant reply after it (or None)."""
    if isinstance(obj.get("prompt"), str):
        if not obj["prompt"].strip():
            raise TrainingDataError(f"{where}: empty prompt")
        return (("user", obj["prompt"]),), None
    turns = obj.get("messages", obj.get("conversations"))
    if not isinstance(turns, list) or not turns:
        raise TrainingDataError(
            f"{where}: need 'prompt' (a string), 'messages' or 'conversations' (a list)"
        )
    out: list[tuple[str, str]] = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise TrainingDataError(f"{where}: turn {j} is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role not in _ROLES or not isinstance(content, str):
            raise TrainingDataError(
                f"{where}: turn {j} needs a role (user/assistant/system or human/gpt) and "
                "string content"
            )
        out.append((_ROLES[role], content))
    last_user = max((j for j, (role, _) in enumerate(out) if role == "user"), default=-1)
    if last_user < 0:
        raise TrainingDataError(f"{where}: no user turn to reply to")
    reply = next((c for role, c in out[last_user + 1 :] if role == "assistant"), None)
    return tuple(out[: last_user + 1]), reply


def load_jsonl(path: Path, given_replies: bool = False) -> list[Conversation]:
    """The conversations of a training JSONL file (format in the module docstring); with
    ``given_replies``, each keeps the assistant reply after its last user turn.

    Raises:
        TrainingDataError: unreadable file, a line that is not a JSON object of a known
            shape, no conversation at all, or (``given_replies``) a conversation without a
            non-empty reply after its last user turn.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainingDataError(f"{path}: cannot read training data ({exc})") from exc
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrainingDataError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise TrainingDataError(f"{where}: not a JSON object")
        cid = obj.get("id")
        cid = str(cid) if cid is not None else f"line-{n}"
        messages, reply = _messages(obj, where)
        if given_replies and not (reply or "").strip():
            raise TrainingDataError(
                f"{where}: no assistant reply after the last user turn (--replies given "
                "reads each conversation's reply as given)"
            )
        items.append(Conversation(cid, messages, reply if given_replies else None))
    if not items:
        raise TrainingDataError(f"{path}: no training conversations (the file is empty)")
    ids = [c.id for c in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TrainingDataError(f"{path}: id {dup!r} appears more than once")
    return items


# --- the built-in set -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snippet:
    module: str
    name: str
    source: str
    doc: str


def _stdlib_snippets(max_lines: int = 16) -> Iterator[_Snippet]:
    """Functions and classes of the standard library's top-level modules, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("_") or path.name.startswith("test"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            end = node.end_lineno or node.lineno
            if not 4 <= end - node.lineno + 1 <= max_lines:
                continue
            source = "\n".join(lines[node.lineno - 1 : end])
            doc = (ast.get_docstring(node) or "").strip().split("\n\n")[0]
            yield _Snippet(path.stem, node.name, source, " ".join(doc.split()))


def _prompt(kind: str, s: _Snippet, rng: random.Random) -> str:
    code = f"```python\n{s.source}\n```"
    what = s.doc or f"the {s.name} definition of Python's {s.module} module"
    n = rng.randint(5, 14)
    a = rng.randint(1, 60)
    if kind == "repeat":
        line = (s.doc or f"{s.module}.{s.name}")[:80]
        return f"Repeat the following line {n} times, one per line: {line}"
    if kind == "counting":
        step = rng.choice([1, 2, 3, 5, 10])
        return (
            f"List the numbers from {a} to {a + step * (n + 10)} in steps of {step}, "
            f"each followed by the word '{s.name}', one per line."
        )
    if kind == "json":
        return (
            f'Describe this Python code as a JSON object with the keys "name", "kind", '
            f'"parameters" (a list of objects with "name" and "default") and '
            f'"summary". Output only the JSON.\n\n{code}'
        )
    if kind == "table":
        return (
            f"Make a markdown table of the statements in this code with the columns Line, "
            f"Statement and Purpose.\n\n{code}"
        )
    if kind == "report":
        return (
            f"Write a short code review report for `{s.module}.{s.name}` with the sections "
            f"Summary, Risks, Suggestions and Verdict.\n\n{code}"
        )
    if kind == "code":
        return rng.choice(
            [
                f"Add type hints and a docstring to this code and return the whole code.\n\n{code}",
                f"Write pytest unit tests for this code.\n\n{code}",
                f"Rewrite this code to be simpler and explain nothing; output only code.\n\n{code}",
                f"Translate this Python code to JavaScript.\n\n{code}",
            ]
        )
    if kind == "explain":
        return f"Explain step by step what this code does.\n\n{code}"
    return rng.choice(
        [
            f"Write a short story in which a programmer discovers {what}",
            f"Write a paragraph for beginners about why a library would offer this: {what}",
            f"Describe, as an essay of two paragraphs, a day in the life of the Python module "
            f"`{s.module}`.",
        ]
    )


KINDS = ("repeat", "counting", "json", "table", "report", "code", "explain", "prose")


def builtin_conversations(n: int, seed: int = 0) -> list[Conversation]:
    """``n`` prompts from the standard library's sources (see the module docstring), the
    kinds in turn, deterministic for a given ``seed`` and Python version.

    Raises:
        TrainingDataError: ``n`` < 1, or the standard library's sources are not found.
    """
    if n < 1:
        raise TrainingDataError(f"need at least one training prompt, got {n}")
    snippets = list(_stdlib_snippets())
    if not snippets:
        raise TrainingDataError("the Python standard library's sources were not found")
    rng = random.Random(seed)
    rng.shuffle(snippets)
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        s = snippets[i % len(snippets)]
        out.append(Conversation(f"stdlib-{i}", (("user", _prompt(kind, s, rng)),)))
    return out


def corpus_text(max_chars: int = 2_000_000) -> str:
    """Standard-library source text (for the draft vocabulary's token counts)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "\n".join(parts)[:max_chars]


# --- built-in given replies ---------------------------------------------------------------------


def _doc_topics(max_chars: int) -> Iterator[tuple[str, str]]:
    """(title, passage) of the standard library's documentation topics (``pydoc_data``, the
    language reference's prose), each topic cut at paragraph ends into passages of at most
    ``max_chars`` characters, in a fixed order."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions leave the documentation data out
        return
    for name in sorted(topics):
        text = topics[name].strip()
        title = text.splitlines()[0].strip() if text else name
        passage = ""
        for para in text.split("\n\n"):
            if passage and len(passage) + len(para) + 2 > max_chars:
                yield title, passage
                passage = ""
            passage = f"{passage}\n\n{para}" if passage else para[:max_chars]
        if passage.strip():
            yield title, passage


def builtin_text_conversations(n: int, seed: int = 0, max_chars: int = 1500) -> list[Conversation]:
    """``n`` conversations with given replies (see the module docstring): documentation
    passages and function sources in turn, deterministic for a given ``seed`` and Python
    version.

    Raises:
        TrainingDataError: ``n`` < 1, or the standard library's texts are not found.
    """
    if n < 1:
        raise TrainingDataError(f"need at least one given-reply conversation, got {n}")
    passages = list(_doc_topics(max_chars))
    snippets = list(_stdlib_snippets(max_lines=40))
    if not passages and not snippets:
        raise TrainingDataError("the Python standard library's texts were not found")
    rng = random.Random(seed)
    rng.shuffle(passages)
    rng.shuffle(snippets)
    sources = [s for s in (passages, snippets) if s]
    out = []
    for i in range(n):
        kind = sources[i % len(sources)]
        item = kind[(i // len(sources)) % len(kind)]
        if isinstance(item, _Snippet):
            what = item.doc or f"the {item.name} definition of Python's {item.module} module"
            prompt = f"Write `{item.name}` of Python's `{item.module}` module: {what}"
            reply = f"```python\n{item.source}\n```"
        else:
            title, reply = item
            prompt = f"Explain this part of the Python language reference: {title}"
        out.append(Conversation(f"text-{i}", (("user", prompt),), reply))
    return out
