"""``specserve train-draft`` end to end: bad input is a clear error before anything loads;
on SmolLM2 a short run writes a head that serves (output equal to plain decoding) and
records where its time went; a second run resumes from the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.cli import main


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--num-prompts", "0"], "--num-prompts or --text-prompts must be >= 1"),
        (["--text-prompts", "-1"], "must be >= 0"),
        (["--replies", "given"], "give --data"),
        (["--ttt-steps", "9"], "--ttt-steps must be in [1, 8]"),
        (["--output", "x", "--name", "y"], "not both"),
    ],
)
def test_bad_options(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-draft", "--method", "eagle", *args]) == 1
    assert says in capsys.readouterr().err


def test_bad_data_fails_before_the_target_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "ok"}\n{"messages": "nope"}\n')
    argv = ["train-draft", "--method", "eagle", "--model", "no-such-model", "--data", str(data)]
    assert main(argv) == 1
    assert "d.jsonl:2: need 'prompt'" in capsys.readouterr().err
    data.write_text("")
    assert main(argv) == 1
    assert "no training conversations" in capsys.readouterr().err


@pytest.mark.slow
def test_train_serve_and_resume_on_smollm2(smollm2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from specserve.config import EngineConfig, ModelConfig, SpecConfig
    from specserve.engine.builder import build_engine
    from specserve.sampling_params import SamplingParams

    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": p}) for p in [
        "Count from 1 to 20.", "Write hello three times.", "List four colours.",
        "Name the days of the week.", "Say yes.", "Spell 'cat' backwards.",
    ]) + "\n")  # fmt: skip
    out = tmp_path / "head"
    argv = ["train-draft", "--model", "smollm2-135m-instruct", "--method", "medusa",
            "--data", str(data), "--text-prompts", "2",
            "--max-tokens", "24", "--epochs", "1", "--batch-tokens", "16",
            "--checkpoint-every", "2", "--medusa-heads", "2", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    training = json.loads((out / "training.json").read_text())
    assert training["method"] == "medusa" and training["sequences"]["held_out"] == 1
    assert training["sequences"]["train"] == 7  # 6 generated replies, 2 given, 1 held out
    assert "2 passages" in training["data"]
    assert set(training["timings_s"]) == {"load_s", "generate_and_record_s", "train_s"}
    assert training["curve"] and len(training["curve"][-1]["accuracy"]) == 2
    steps = training["train_state"]["steps"]
    # a second run with more epochs resumes from the checkpoint and reuses the generations
    assert main([*argv[:-2], "--epochs", "2", "--resume", "--output", str(out)]) == 0
    again = json.loads((out / "training.json").read_text())
    assert again["train_state"]["steps"] > steps
    assert again["timings_s"]["generate_and_record_s"] == 0.0

    prompt = list(smollm2.tokenizer.encode("Count from 1 to 10:", add_special_tokens=False))
    model = ModelConfig(model="smollm2-135m-instruct", dtype="float32")
    outputs = []
    for spec in (SpecConfig(), SpecConfig(method="medusa", draft_model=str(out))):
        engine = build_engine(EngineConfig(model=model, spec=spec))
        engine.add_request("r", prompt, SamplingParams(max_tokens=16, ignore_eos=True))
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                tokens += o.new_token_ids
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
