"""``--weights gguf``: a quantised GGUF file's blocks computed as stored."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import gguf_blocks, gguf_stored
from specserve.loading.gguf_loader import GGUFFile, hf_name
from specserve.loading.loader import load_model
from specserve.loading.quant_cache import load_model_with_weights
from specserve.models.quant.int4_weight import Int4Weight
from specserve.models.quant.int8_group import Int8GroupLinear, Int8GroupWeight
from specserve.models.quant.layers import Int4Linear
from specserve.models.quant.stored import (
    GroupEmbedding,
    as_int8_group,
    concat_rows,
    stored_weight,
)

# A Q4_K_M-like mix on tiny shapes (K-quants need rows of 256): 4-bit projections, byte
# codes for v, down and the (tied) embedding.
MIX = {"attn_v.weight": Q.Q8_0, "ffn_down.weight": Q.Q5_0, "token_embd.weight": Q.Q5_1}


def _ids() -> torch.Tensor:
    return torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = _ids()[0].tolist()
    with torch.no_grad():
        cache = SingleSequenceCache(model, len(ids) + 1)  # type: ignore[arg-type]
        return model.compute_logits(cache.forward(ids)).float()  # type: ignore[operator]


def test_int4_rows_written_as_bytes_and_regrouped_are_the_same_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    nibbles = torch.randint(0, 256, (5, 32), dtype=torch.uint8, generator=gen)
    w4 = Int4Weight(nibbles, torch.randn(5, 2, generator=gen), torch.randn(5, 2, generator=gen), 32)
    w8 = Int8GroupWeight(
        torch.randint(-128, 128, (3, 64), dtype=torch.int8, generator=gen),
        torch.randn(3, 4, generator=gen),
        torch.zeros(3, 4),
        16,
    )
    assert torch.equal(as_int8_group(w4, 16).dequantize(), w4.dequantize())
    mixed = concat_rows([w4, w8, w4])
    assert isinstance(mixed, Int8GroupWeight) and mixed.group_size == 16
    expected = torch.cat([w4.dequantize(), w8.dequantize(), w4.dequantize()])
    assert torch.equal(mixed.dequantize(), expected)
    same = concat_rows([w4, w4])
    assert isinstance(same, Int4Weight) and same.group_size == 32
    with pytest.raises(ValueError, match="does not divide"):
        as_int8_group(w8, 32)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_every_stored_weight_equals_llama_cpp_dequantisation(gguf_factory, family) -> None:
    path, _ = gguf_factory(family, Q.Q4_0, tensor_types=MIX)
    arch = load_model(path).arch
    state = gguf_stored.stored_state(path, arch)
    reference = load_model(path).model.state_dict()  # fp32: llama.cpp's dequantisation
    for t in GGUFFile(path).reader.tensors:
        if len(t.shape) != 2:
            continue
        name = hf_name(t.name).removesuffix(".weight")
        weight = stored_weight(state, name)
        assert weight is not None, name
        assert torch.equal(weight.dequantize(), reference[f"{name}.weight"]), name
        raw = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if family == "qwen2":  # llama's q / k rows are permuted back by the loader
            flat = weight.dequantize()
            assert torch.equal(flat, torch.from_numpy(raw).view_as(flat))


def test_gguf_model_runs_the_stored_codes_and_agrees_with_the_dequantised_model(
    gguf_factory,
) -> None:
    path, _ = gguf_factory("qwen2", Q.Q4_0, tensor_types=MIX)
    lm = load_model_with_weights(path, "gguf")
    attn, mlp = lm.model.model.layers[0].self_attn, lm.model.model.layers[0].mlp
    assert lm.model.dtype == torch.bfloat16
    assert isinstance(attn.qkv_proj, Int8GroupLinear)  # q, k Q4_0 beside v Q8_0
    assert attn.qkv_proj.group_size == 32 and attn.q_proj is None
    assert isinstance(attn.o_proj, Int4Linear) and attn.o_proj.group_size == 32
    assert isinstance(mlp.gate_up_proj, Int4Linear) and isinstance(mlp.down_proj, Int8GroupLinear)
    assert isinstance(lm.model.model.embed_tokens, GroupEmbedding)
    assert isinstance(lm.model.lm_head, Int8GroupLinear)  # tied: the embedding's codes
    reference = load_model(path, dtype=torch.float32)
    ref_embed = reference.model.model.embed_tokens(_ids())
    assert torch.equal(lm.model.model.embed_tokens(_ids()), ref_embed.to(torch.bfloat16))
    ours, ref = _logits(lm.model), _logits(reference.model)
    assert (ours - ref).abs().max() < 0.05 * ref.abs().max()
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_second_load_reads_the_cache_and_computes_the_same(gguf_factory, caplog) -> None:
    path, _ = gguf_factory("qwen2", Q.Q4_0, tensor_types=MIX)
    first = _logits(load_model_with_weights(path, "gguf").model)
    with caplog.at_level(logging.INFO, logger="specserve.loading.quant_cache"):
        second = _logits(load_model_with_weights(path, "gguf").model)
    assert "read the stored GGUF blocks" in caplog.text
    assert torch.equal(first, second)


def test_a_type_without_a_mapping_is_named_and_runs_dequantised(
    gguf_factory, monkeypatch, caplog
) -> None:
    path, _ = gguf_factory("qwen2", Q.Q4_0, tensor_types=MIX)
    monkeypatch.delitem(gguf_blocks._BLOCK, Q.Q8_0)  # as if Q8_0 had no native mapping
    with caplog.at_level(logging.WARNING, logger="specserve.loading.gguf_stored"):
        lm = load_model_with_weights(path, "gguf", use_cache=False)
    assert "GGUF type Q8_0 has no native kernel" in caplog.text
    assert caplog.text.count("has no native kernel") == 1  # once per file and type
    attn = lm.model.model.layers[0].self_attn
    assert attn.qkv_proj is None and type(attn.v_proj) is torch.nn.Linear  # float weights
    assert isinstance(lm.model.model.layers[0].mlp.down_proj, Int8GroupLinear)


def test_gguf_needs_a_quantised_gguf_file(gguf_factory) -> None:
    path, _ = gguf_factory("qwen2")  # F32 tensors
    with pytest.raises(ValueError, match="not one; use int4/int8"):
        load_model_with_weights(path, "gguf")


def test_the_default_format_is_gguf_for_a_quantised_file_on_cpu(gguf_factory) -> None:
    quantised, _ = gguf_factory("qwen2", Q.Q4_0)
    dense, _ = gguf_factory("qwen2")
    assert gguf_stored.default_format(str(quantised)) == "gguf"
    assert gguf_stored.default_format(str(quantised), dtype="auto") == "gguf"
    assert gguf_stored.default_format(str(quantised), dtype="float32") is None
    assert gguf_stored.default_format(str(quantised), device="cuda") is None
    assert gguf_stored.default_format(str(dense)) is None
    assert gguf_stored.default_format(str(Path(quantised).parent)) is None  # a directory
    assert gguf_stored.default_format("no-such.gguf") is None
    # the draft: gguf (or nothing) on the target means the draft's own default
    assert gguf_stored.draft_format(None, "gguf", str(dense)) is None
    assert gguf_stored.draft_format(None, "gguf", str(quantised)) == "gguf"
    assert gguf_stored.draft_format(None, "bf16", str(quantised)) == "bf16"
    assert gguf_stored.draft_format("int4", "gguf", str(quantised)) == "int4"
    assert gguf_stored.draft_format("gguf", "gguf", str(quantised), dtype="bfloat16") == "gguf"


def test_the_default_draft_is_int4_where_its_native_kernels_run(gguf_factory, monkeypatch) -> None:
    from specserve.models.native import int4_native

    quantised, _ = gguf_factory("qwen2", Q.Q4_0)
    draft = gguf_stored.draft_format
    monkeypatch.setattr(int4_native, "available", lambda: True)
    for target in (None, "gguf", "bf16"):
        assert draft(None, target, str(quantised), "cpu", "bfloat16") == "int4"
    assert draft(None, "int8", str(quantised), "cpu", "bfloat16") == "int8"  # the target's
    assert draft(None, "gguf", str(quantised), "cpu", "float32") is None  # fp32: dequantised
    assert draft(None, "bf16", str(quantised), "cuda", "bfloat16") == "bf16"  # a CPU kernel
    monkeypatch.setattr(int4_native, "available", lambda: False)  # e.g. SPECSERVE_INT4_NATIVE=0
    assert draft(None, "gguf", str(quantised), "cpu", "bfloat16") == "gguf"
    assert draft(None, "bf16", str(quantised), "cpu", "bfloat16") == "bf16"


def test_serve_without_weights_runs_a_quantised_gguf_as_stored_in_bf16(gguf_factory) -> None:
    from specserve.cli import build_parser
    from specserve.commands.serve import engine_config_from_args

    path, _ = gguf_factory("qwen2", Q.Q4_0)
    config = engine_config_from_args(build_parser().parse_args(["serve", "--model", str(path)]))
    assert (config.model.weights, config.model.dtype) == ("gguf", "bfloat16")
    argv = ["serve", "--model", str(path), "--dtype", "float32"]
    reference = engine_config_from_args(build_parser().parse_args(argv))
    assert (reference.model.weights, reference.model.dtype) == (None, "float32")
