"""``build_engine`` loads the target and the draft in their own weight formats (a quantised
draft next to a bf16/fp32 target), and the output stays the target's."""

from __future__ import annotations

from torch import nn

from specserve.config import EngineConfig, ModelConfig, SpecConfig
from specserve.engine.builder import build_engine
from specserve.models.decoder import DecoderLayer
from specserve.models.native import fused_layer
from specserve.models.quant.layers import Int4Linear, Int8Linear
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import DraftModelProposer


def _greedy(config: EngineConfig, prompt: list[int]) -> tuple[list[int], object]:
    engine = build_engine(config)
    engine.add_request("r", prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    out: list[int] = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            out += o.new_token_ids
    return out, engine


def _smollm2_draft(weights: str) -> SpecConfig:
    """SmolLM2 drafting for itself, 3 tokens a step, in the weight format ``weights``."""
    return SpecConfig(
        method="draft",
        draft_model="smollm2-135m-instruct",
        num_speculative_tokens=3,
        draft_weights=weights,  # type: ignore[arg-type]
    )


def test_int8_draft_next_to_an_fp32_target_keeps_the_targets_output(smollm2) -> None:  # type: ignore[no-untyped-def]
    prompt = list(smollm2.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False))
    model = ModelConfig(model="smollm2-135m-instruct", dtype="float32")
    plain, _ = _greedy(EngineConfig(model=model), prompt)
    spec = _smollm2_draft("int8")
    out, engine = _greedy(EngineConfig(model=model, spec=spec), prompt)
    assert out == plain  # fp32 target verifies: lossless whatever the draft's format
    proposer = engine.proposer  # type: ignore[attr-defined]
    assert isinstance(proposer, DraftModelProposer)
    draft_down = proposer.model.get_submodule("model.layers.0.mlp.down_proj")
    target_down = engine.model.get_submodule("model.layers.0.mlp.down_proj")  # type: ignore[attr-defined]
    assert isinstance(draft_down, Int8Linear)
    assert type(target_down) is nn.Linear
    assert engine.spec.draft_weights == "int8"  # type: ignore[attr-defined]
    # /metrics' specserve:model_info says whether the draft's confidence stop is on.
    threshold = engine.model_info["draft_confidence_threshold"]  # type: ignore[attr-defined]
    assert threshold == str(SpecConfig(method="ngram").draft_confidence_threshold)


def test_head_methods_load_their_head_and_keep_the_bf16_output(smollm2, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A head directory on disk (random EAGLE-3 / Medusa weights shaped for SmolLM2) serves
    through build_engine; bf16 on the fused path is batch invariant, so greedy output equals
    plain greedy output exactly."""
    import torch

    from specserve.loading.head_writer import eagle3_head_config, medusa_head_config, write_head
    from tests.heads import make_eagle_head, make_medusa_heads

    target = smollm2.model
    eagle = make_eagle_head(target, draft_vocab_size=4096, aux_layer_ids=(2, 15, 27))
    write_head(tmp_path / "eagle", eagle3_head_config(eagle.cfg, verifier="smollm2",
               verifier_arch="LlamaForCausalLM", num_speculative_tokens=3),
               {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                for k, v in eagle.state_dict().items()})  # fmt: skip
    medusa = make_medusa_heads(target, num_heads=3)
    write_head(tmp_path / "medusa", medusa_head_config(medusa.cfg, verifier="smollm2"),
               dict(medusa.state_dict()))  # fmt: skip
    prompt = list(smollm2.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False))
    model = ModelConfig(model="smollm2-135m-instruct", dtype="bfloat16")
    plain, _ = _greedy(EngineConfig(model=model), prompt)
    for method in ("eagle", "medusa"):
        spec = SpecConfig(
            method=method, draft_model=str(tmp_path / method), num_speculative_tokens=3
        )  # type: ignore[arg-type]
        out, engine = _greedy(EngineConfig(model=model, spec=spec), prompt)
        assert out == plain, method
        assert engine.model_info["draft_head"] == str(tmp_path / method)  # type: ignore[attr-defined]
        assert engine.stats().spec.num_drafts > 0  # type: ignore[attr-defined]


def test_a_draft_confidence_stop_reaches_the_proposer_and_the_controller() -> None:
    from specserve.engine.builder import build_spec
    from tests.conftest import make_tiny_model

    target, draft = make_tiny_model("qwen2", seed=1), make_tiny_model("qwen2", seed=2)
    spec = SpecConfig(method="draft", draft_model="d", draft_confidence_threshold=0.4)
    proposer, controller = build_spec(spec, target, draft)
    assert isinstance(proposer, DraftModelProposer) and proposer.confidence_threshold == 0.4
    assert controller is not None and controller.confidence_stop
    off = SpecConfig(method="draft", draft_model="d", draft_confidence_threshold=0.0)
    proposer, controller = build_spec(off, target, draft)
    assert isinstance(proposer, DraftModelProposer) and proposer.confidence_threshold == 0.0
    assert controller is not None and not controller.confidence_stop
    # n-gram drafts have no confidence: the controller keeps choosing k itself.
    _, controller = build_spec(SpecConfig(method="ngram"), target)
    assert controller is not None and not controller.confidence_stop


def test_the_draft_takes_the_amx_tiles_only_for_several_rows_and_the_output_stays_the_targets(  # type: ignore[no-untyped-def]
    smollm2, monkeypatch
) -> None:
    """With the tiles on (``SPECSERVE_QUANT_AMX=1``, where the CPU has them) the target's
    packed weights use them for every call and the draft's only for calls of
    ``DRAFT_TILE_ROWS`` rows or more (prompt chunks, catch-ups): speculative greedy output
    equals plain greedy output, both on the same target kernels. The draft's one-row int4
    calls round x to int8 where the kernel has that path (``fused_layer.set_draft``)."""
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "1")
    prompt = list(smollm2.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False))
    model = ModelConfig(model="smollm2-135m-instruct", dtype="bfloat16", weights="int4")
    plain, _ = _greedy(EngineConfig(model=model), prompt)
    spec = _smollm2_draft("int4")
    out, engine = _greedy(EngineConfig(model=model, spec=spec), prompt)
    assert out == plain
    proposer = engine.proposer  # type: ignore[attr-defined]
    assert isinstance(proposer, DraftModelProposer)
    draft_down = proposer.model.get_submodule("model.layers.0.mlp.down_proj")
    target_down = engine.model.get_submodule("model.layers.0.mlp.down_proj")  # type: ignore[attr-defined]
    assert isinstance(draft_down, Int4Linear) and isinstance(target_down, Int4Linear)
    if draft_down.native is None or target_down.native is None:  # no native int4 kernel
        return
    rows = fused_layer.DRAFT_TILE_ROWS
    assert (draft_down.native.tiles_from_rows, target_down.native.tiles_from_rows) == (rows, 1)
    # the draft's one-row calls may round x to int8 (on AVX2), never the target's
    assert draft_down.native.quantised_x and not target_down.native.quantised_x
    draft_layer = proposer.model.get_submodule("model.layers.0")
    target_layer = engine.model.get_submodule("model.layers.0")  # type: ignore[attr-defined]
    assert isinstance(draft_layer, DecoderLayer) and isinstance(target_layer, DecoderLayer)
    if draft_layer.fused is not None and target_layer.fused is not None:  # the op's last arg
        assert (draft_layer.fused.tiles_from_rows, target_layer.fused.tiles_from_rows) == (rows, 1)


def test_an_adaptive_controller_starts_with_the_targets_step_times(smollm2, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``build_engine`` times the target's steps of 1 .. k_max + 1 tokens once, so its
    controller drafts from the first request without climbing through untimed sizes
    (spec_decode/warm_start.py); ``SPECSERVE_K_WARM_START=0`` keeps the cold start. The
    output is the target's either way."""
    prompt = list(smollm2.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False))
    model = ModelConfig(model="smollm2-135m-instruct", dtype="float32")
    plain, _ = _greedy(EngineConfig(model=model), prompt)
    spec = SpecConfig(method="ngram", k_max=4)
    monkeypatch.delenv("SPECSERVE_K_WARM_START", raising=False)
    out, engine = _greedy(EngineConfig(model=model, spec=spec), prompt)
    assert out == plain
    controller = engine.k_controller  # type: ignore[attr-defined]
    assert controller.explored_k() == 4
    assert set(range(1, 6)) <= set(controller.costs.measured_by_size())
    monkeypatch.setenv("SPECSERVE_K_WARM_START", "0")
    cold = build_engine(EngineConfig(model=model, spec=spec))
    assert not cold.k_controller.plain_cost_measured()  # type: ignore[union-attr]
