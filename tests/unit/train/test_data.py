"""Training data for heads: the JSONL formats, their errors, the built-in stdlib prompts and
the draft vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.train.data import (
    KINDS,
    TrainingDataError,
    builtin_conversations,
    builtin_text_conversations,
    corpus_text,
    load_jsonl,
)
from specserve.train.objectives import draft_vocabulary


def write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_the_three_formats_end_with_the_last_user_turn(tmp_path: Path) -> None:
    path = write(tmp_path, [
        {"prompt": "Count to 3."},
        {"id": "chat", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "List 3 colours."},
            {"role": "assistant", "content": "(dropped: the target writes its own)"},
        ]},
        "",
        {"conversations": [{"from": "human", "value": "Name a fruit."},
                           {"from": "gpt", "value": "Apple"}]},
    ])  # fmt: skip
    items = load_jsonl(path)
    assert [c.id for c in items] == ["line-1", "chat", "line-4"]
    assert items[0].as_chat() == [{"role": "user", "content": "Count to 3."}]
    assert [role for role, _ in items[1].messages] == ["system", "user", "assistant", "user"]
    assert items[2].messages == (("user", "Name a fruit."),)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "no training conversations"),
        (["{not json"], "data.jsonl:1: not JSON"),
        ([{"prompt": "ok"}, [1, 2]], "data.jsonl:2: not a JSON object"),
        ([{"text": "x"}], "need 'prompt'"),
        ([{"prompt": "  "}], "empty prompt"),
        ([{"messages": [{"role": "assistant", "content": "x"}]}], "no user turn"),
        ([{"messages": [{"role": "robot", "content": "x"}]}], "turn 0 needs a role"),
        ([{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}], "id '1' appears more than once"),
    ],
)
def test_bad_training_data_is_a_clear_error(
    tmp_path: Path, lines: list[object], message: str
) -> None:
    with pytest.raises(TrainingDataError, match=message):
        load_jsonl(write(tmp_path, lines))


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TrainingDataError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TrainingDataError, match="cannot read"):
        load_jsonl(tmp_path / "bin.jsonl")


def test_builtin_prompts_are_deterministic_and_cover_every_kind() -> None:
    a, b = builtin_conversations(24, seed=1), builtin_conversations(24, seed=1)
    assert a == b and len({c.id for c in a}) == 24
    assert builtin_conversations(24, seed=2) != a
    texts = [c.messages[-1][1] for c in a]
    assert any("Repeat the following line" in t for t in texts)
    assert any("```python" in t for t in texts)
    assert len(KINDS) == 8
    with pytest.raises(TrainingDataError):
        builtin_conversations(0)
    assert "def " in corpus_text(20_000)


def test_given_replies_keep_the_reply_after_the_last_user_turn(tmp_path: Path) -> None:
    def turn(role: str, text: str) -> dict[str, str]:
        return {"from": role, "value": text}

    path = write(tmp_path, [
        {"id": "a", "messages": [{"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello!"}]},
        {"id": "b", "conversations": [turn("human", "Q1"), turn("gpt", "A1"),
                                      turn("human", "Q2"), turn("gpt", "A2")]},
    ])  # fmt: skip
    a, b = load_jsonl(path, given_replies=True)
    assert a.messages == (("user", "Hi"),) and a.reply == "Hello!"
    assert b.messages[-1] == ("user", "Q2") and b.reply == "A2"
    assert b.with_reply()[-1] == {"role": "assistant", "content": "A2"}
    assert all(c.reply is None for c in load_jsonl(path))  # generated: the replies are dropped
    blank = {"conversations": [turn("human", "Q"), turn("gpt", " ")]}
    for bad in ({"prompt": "no reply"}, blank):
        with pytest.raises(TrainingDataError, match=r"data.jsonl:2: no assistant reply"):
            load_jsonl(write(tmp_path, [path.read_text().splitlines()[0], bad]), True)


def test_builtin_given_replies_alternate_documentation_and_code() -> None:
    a = builtin_text_conversations(40, seed=1)
    assert a == builtin_text_conversations(40, seed=1) and len({c.id for c in a}) == 40
    assert builtin_text_conversations(40, seed=2) != a
    assert all(c.reply and c.messages[-1][0] == "user" for c in a)
    assert all(len(c.reply or "") <= 1500 for c in a[::2])  # passages of at most max_chars
    assert all((c.reply or "").startswith("```python\n") for c in a[1::2])
    with pytest.raises(TrainingDataError):
        builtin_text_conversations(0)


def test_draft_vocabulary_takes_the_most_frequent_tokens() -> None:
    vocab = draft_vocabulary(4, 10, primary=[7, 7, 7, 2, 2, 9], secondary=[5, 5, 9, 1])
    assert vocab.tolist() == [2, 5, 7, 9]  # 7, 2, 9 by reply counts, then 5 by corpus counts
    filled = draft_vocabulary(5, 10, primary=[3])
    assert filled.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        draft_vocabulary(11, 10, [])
