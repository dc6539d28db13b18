"""Pieces of ``specserve perf``: a missing llama_cpp is reported (not skipped), bytes per
token, quality measures, the prompts, the CLI registration, and the batching benchmark."""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import pytest
import torch

from specserve.cli import build_parser, main
from specserve.commands import perf as perf_command
from specserve.models.quant.quantize import quantize_model
from specserve.perf import arms, engine_batching
from specserve.perf.arms import ArmResult, decode_bytes_per_token
from specserve.perf.report import (
    common_prefix_fraction,
    mean_log_likelihood,
    quality_vs,
)
from specserve.perf.worker_arms import run_llamacpp
from specserve.spec_decode.plain_loop import GenerationResult
from tests.conftest import make_tiny_model


def test_missing_llama_cpp_is_reported(tmp_path: Path) -> None:
    gguf = tmp_path / "model-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    python = sys.executable  # the project venv has no llama_cpp
    arms = run_llamacpp(python, gguf, [[1, 2, 3]], 4, (0,), 1)
    assert len(arms) == 2
    for arm in arms:
        assert arm.error is not None and "llama_cpp" in arm.error


def test_bytes_per_token_counts_weights_not_the_embedding_table() -> None:
    model = make_tiny_model("qwen2", hidden_size=64, intermediate_size=128)  # tied head
    v, h = model.cfg.vocab_size, model.cfg.hidden_size
    fp32 = decode_bytes_per_token(model)
    assert fp32 >= v * h * 4  # the tied table is read as the LM head
    q4 = decode_bytes_per_token(quantize_model(model.to(torch.bfloat16), "int4", 32))
    assert q4 < fp32 / 5


@pytest.mark.parametrize("own_head", [True, False])
def test_llama_cpp_bytes_per_token_skip_an_untied_embedding(tmp_path: Path, own_head: bool) -> None:
    """A step reads every tensor of the file but one row of the token embedding, unless the
    embedding is the LM head too (no ``output.weight``)."""
    import numpy as np
    from gguf import GGUFWriter

    from specserve.perf.worker_arms import gguf_decode_bytes

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((16, 32), dtype=np.float32))
    if own_head:
        w.add_tensor("output.weight", np.zeros((64, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    layer, table = 16 * 32 * 4, 64 * 32 * 4
    assert gguf_decode_bytes(path) == layer + table  # the head, or the table read as the head
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF")
    assert gguf_decode_bytes(fake) is None


def test_unknown_arm_groups_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "--arms", "plain,hybird"]) == 2
    assert "unknown arm group(s) hybird" in capsys.readouterr().err


def test_quality_measures() -> None:
    assert common_prefix_fraction([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert common_prefix_fraction([1, 2], [1, 2]) == 1.0
    ref = ArmResult("specserve bf16 plain", token_ids=[[1, 2, 3], [4, 5]])
    q4 = ArmResult("specserve int4 plain", token_ids=[[1, 2, 7], [4, 5]])
    (q,) = quality_vs({"bf16": ref, "int4": q4}, "bf16")
    assert q.fmt == "int4" and q.exact_match == 0.5
    assert abs(q.prefix_fraction - (2 / 3 + 1) / 2) < 1e-9
    ll = mean_log_likelihood(make_tiny_model("llama"), [5, 6, 7, 8, 9])
    assert ll < 0 and ll == ll


def test_perf_command_is_registered() -> None:
    args = build_parser().parse_args(["perf", "--weights", "int4", "--profile"])
    assert args.weights == "int4" and args.profile and args.context_bucket == 128


def test_perf_flags_are_unchanged() -> None:
    args = build_parser().parse_args(["perf"])
    assert args.func is perf_command.run
    assert (args.target, args.draft) == (
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
    )
    assert (args.weights, args.prompts, args.max_tokens, args.k) == (
        "bf16,int8,int4",
        "palindrome,cat",
        96,
        4,
    )
    assert args.arms == "plain,draft,ngram,fused,transformers,llamacpp"
    assert args.threads is None and not args.compile and not args.profile


def test_the_command_module_is_thin() -> None:
    # commands/perf.py registers and dispatches; the run lives in specserve.perf.main.
    tree = ast.parse(Path(perf_command.__file__).read_text())
    top_level = {
        node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    }
    assert top_level == {"__future__", "argparse", "specserve.perf.options"}
    assert [f.name for f in tree.body if isinstance(f, ast.FunctionDef)] == ["register", "run"]


def test_unknown_prompt_is_refused_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "--prompts", "palindrome,nope", "--weights", "int4"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "palindrome" in err and "fizzbuzz" in err


def test_llamacpp_worker_is_next_to_the_arms() -> None:
    assert (Path(arms.__file__).parent / "llamacpp_worker.py").is_file()


def test_engine_batching_is_its_own_module() -> None:
    # Its result class has a name of its own (not perf.arms.ArmResult) and its prompts come
    # from the registry suite it names.
    assert engine_batching.BatchingArmResult is not ArmResult
    assert not hasattr(engine_batching, "ArmResult")
    assert "python -m specserve.perf.engine_batching" in (engine_batching.__doc__ or "")
    with pytest.raises(SystemExit) as e:
        engine_batching.main(["--help"])
    assert e.value.code == 0


def _result(tokens: list[int], decode_s: float) -> GenerationResult:
    return GenerationResult(tokens, "length", 3, prefill_s=0.01, decode_s=decode_s)


def test_rounds_interleave_the_arms_and_keep_each_arms_median_run() -> None:
    calls: list[tuple[str, int]] = []
    times = {"a": iter([3.0, 1.0, 2.0, 9.0, 8.0, 7.0]), "b": iter([5.0, 4.0, 6.0, 1.0, 2.0, 3.0])}

    def arm(name: str) -> arms.InProcessArm:
        def run(i: int, ids: list[int]) -> GenerationResult:
            calls.append((name, i))
            return _result([i, *ids], next(times[name]))

        return arms.InProcessArm(name, run)

    out = arms.run_interleaved([arm("a"), arm("b")], [[7], [8]], rounds=3)
    # Prompt by prompt, the arms back to back, their order reversed every other round.
    assert calls == [
        ("a", 0), ("b", 0), ("a", 1), ("b", 1),
        ("b", 0), ("a", 0), ("b", 1), ("a", 1),
        ("a", 0), ("b", 0), ("a", 1), ("b", 1),
    ]  # fmt: skip
    # a's prompt 0 took 3, 2, 8 s -> 3; prompt 1: 1, 9, 7 -> 7. b's: 5, 6, 2 -> 5; 4, 1, 3 -> 3.
    assert [x.name for x in out] == ["a", "b"]
    assert out[0].decode_s == [3.0, 7.0] and out[1].decode_s == [5.0, 3.0]
    assert out[0].token_ids == [[0, 7], [1, 8]]
    # Within each round a's prompt 0 ran 5/3, 6/2, 2/8 times b's speed; adjacent rounds
    # (opposite orders) give sqrt(5/3 * 3) and sqrt(3 * 1/4): their median is their mean.
    expected = (math.sqrt(5.0) + math.sqrt(0.75)) / 2
    assert arms.paired_ratio(out[0], out[1], 0) == pytest.approx(expected)
    assert arms.paired_ratio(out[0], ArmResult("no rounds"), 0) is None
    with pytest.raises(ValueError, match="rounds"):
        arms.run_interleaved([arm("a")], [[7]], rounds=0)


def test_paired_ratio_cancels_a_host_that_speeds_up_over_each_round() -> None:
    """Two arms of equal speed on a host 20 % faster for whichever runs second, and faster
    from round to round: adjacent rounds ran the pair in opposite orders, so their mean
    ratio is 1; the median of the single rounds' ratios (5 rounds: three with a first)
    would say 1.2."""
    calls: list[str] = []
    clock = iter(range(100))

    def arm(name: str) -> arms.InProcessArm:
        def run(i: int, ids: list[int]) -> GenerationResult:
            calls.append(name)
            speed = 1.2 ** next(clock)  # every decode 20 % faster than the one before
            return _result([i, *ids, 0], 1.0 / speed)

        return arms.InProcessArm(name, run)

    out = arms.run_interleaved([arm("b"), arm("a")], [[7]], rounds=5)
    assert calls[:4] == ["b", "a", "a", "b"]
    a_speeds, b_speeds = out[1].round_tok_per_s[0], out[0].round_tok_per_s[0]
    single = [x / y for x, y in zip(a_speeds, b_speeds, strict=True)]
    assert sorted(single) == pytest.approx([1 / 1.2] * 2 + [1.2] * 3)
    assert arms.paired_ratio(out[1], out[0], 0) == pytest.approx(1.0)
    one = arms.run_interleaved([arm("b"), arm("a")], [[7]], rounds=1)
    assert arms.paired_ratio(one[1], one[0], 0) == pytest.approx(1.2)


def test_rounds_flag_is_checked() -> None:
    assert build_parser().parse_args(["perf"]).rounds == 1
    assert build_parser().parse_args(["perf", "--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["perf", "--rounds", "0"])


def test_in_process_arms_decode_each_prompt_afresh_every_round() -> None:
    """Real arms on a tiny model: plain and adaptive n-gram give the same greedy tokens in
    every round (a new controller and proposer per decode), and the median is one of them."""
    from specserve.sampling_params import SamplingParams
    from specserve.spec_decode.factory import make_proposer
    from specserve.spec_decode.k_controller import KController

    model = make_tiny_model("qwen2")
    params = SamplingParams(temperature=0.0, max_tokens=12)
    eos: tuple[int, ...] = ()
    ngram = arms.spec_arm(
        "ngram",
        model,
        lambda: make_proposer("ngram", model.cfg.vocab_size),
        lambda: KController(4),
        params,
        eos,
    )
    plain = arms.plain_arm("plain", model, params, eos)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12]]
    seen: list[tuple[str, int, list[int]]] = []
    out = arms.run_interleaved(
        [plain, ngram], prompts, rounds=2, on_run=lambda a, i, r: seen.append((a, i, r.token_ids))
    )
    assert len(seen) == 8
    for i in range(2):
        texts = {tuple(t) for a, j, t in seen if j == i}
        assert len(texts) == 1  # both arms, both rounds
        assert out[0].token_ids[i] == out[1].token_ids[i] and len(out[0].token_ids[i]) == 12
    assert out[0].bytes_per_token is not None and out[1].bytes_per_token is None


def test_draft_weights_flag_names_the_drafts_format_in_its_arms() -> None:
    from specserve.perf.main import _in_process_arms
    from specserve.sampling_params import SamplingParams

    assert build_parser().parse_args(["perf"]).draft_weights is None
    assert build_parser().parse_args(["perf", "--draft-weights", "int4"]).draft_weights == "int4"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["perf", "--draft-weights", "int3"])
    model = make_tiny_model("qwen2")
    params = SamplingParams(temperature=0.0, max_tokens=4)
    wanted = {"draft", "hybrid", "ngram", "fused"}
    names = [a.name for a in _in_process_arms("bf16", model, model, wanted, 4, params, (), "int4")]
    assert names == [
        "specserve bf16 plain",
        "specserve bf16 int4 draft k=4",
        "specserve bf16 int4 draft k=adaptive",
        "specserve bf16 hybrid int4 draft k=adaptive",
        "specserve bf16 ngram k=adaptive",
        "specserve bf16 fused int4 draft k=4",
    ]
    same = [a.name for a in _in_process_arms("int4", model, model, wanted, 4, params, (), "int4")]
    assert same[1] == "specserve int4 draft k=4"


def test_the_draft_defaults_to_the_format_serve_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--draft-weights`` a format's arms draft in the format ``serve`` would pick
    beside that target: int4 beside gguf or bf16 where the native int4 kernels run, the
    target's format otherwise; the flag always wins."""
    from specserve.models.native import int4_native
    from specserve.perf.main import draft_format_beside

    draft = "a/hf-directory"  # not a GGUF file: no format of its own
    monkeypatch.setattr(int4_native, "available", lambda: True)
    assert draft_format_beside(None, "gguf", draft) == "int4"
    assert draft_format_beside(None, "bf16", draft) == "int4"
    assert draft_format_beside(None, "int8", draft) == "int8"
    assert draft_format_beside(None, "fp32", draft) == "fp32"  # fp32 compute: no int4 kernel
    assert draft_format_beside("bf16", "gguf", draft) == "bf16"
    monkeypatch.setattr(int4_native, "available", lambda: False)
    assert draft_format_beside(None, "bf16", draft) == "bf16"
    assert draft_format_beside(None, "int4", draft) == "int4"


def test_the_hybrid_arm_gives_plain_decodings_tokens() -> None:
    """Suffix drafts where they are accepted, the draft model otherwise, adaptive k: greedy
    tokens equal plain decoding's, on a repetitive prompt and a plain one."""
    from specserve.perf.main import _in_process_arms
    from specserve.sampling_params import SamplingParams

    model = make_tiny_model("qwen2")
    draft = make_tiny_model("qwen2", seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    plain, hybrid = _in_process_arms("bf16", model, draft, {"hybrid"}, 4, params, ())
    assert hybrid.name == "specserve bf16 hybrid draft k=adaptive"
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6, 7, 5], [9, 10, 11, 12]]
    out = arms.run_interleaved([plain, hybrid], prompts)
    assert out[0].token_ids == out[1].token_ids
    assert all(len(t) == 16 for t in out[1].token_ids)
