"""Weight-only int8/int4 layers: accuracy, packed kernel == fallback, batch invariance, and
quantised greedy decoding equal between plain and speculative (verify == decode)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specserve.models.decoder import SHORT_FORWARD_ROWS
from specserve.models.quant.int4_weight import Int4Weight, quantize_int4
from specserve.models.quant.layers import Int4Linear, Int8Embedding, Int8Linear, quantize_int8
from specserve.models.quant.quantize import (
    apply_quantized,
    quantize_model,
    quantize_weights,
    weight_bytes,
)
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_int8_roundtrip_error_is_small() -> None:
    w = torch.randn(48, 64)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (48,)
    assert _rel_err(q.float() * s[:, None], w) < 0.01


@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_int4_roundtrip_error_is_small_and_clipping_helps(group_size: int) -> None:
    torch.manual_seed(0)
    w = torch.randn(32, 128)
    w[0, 3] = 12.0  # an outlier: clipping may trade it for the rest of its group
    w4 = quantize_int4(w, group_size)
    assert w4.nibbles.shape == (32, 64) and w4.nibbles.dtype == torch.uint8
    assert int(w4.codes().max()) <= 15
    err = _rel_err(w4.dequantize(), w)
    assert err < 0.12
    # Plain min/max quantisation (no clipping search) of the same tensor is never better.
    g = w.view(32, -1, group_size)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / 15
    plain = (torch.round((g - lo) / scale).clamp(0, 15) * scale + lo).view_as(w)
    assert (w4.dequantize() - w).pow(2).sum() <= (plain - w).pow(2).sum() + 1e-6


def test_int4_rejects_bad_group_size() -> None:
    with pytest.raises(ValueError, match="group_size"):
        quantize_int4(torch.randn(16, 96), 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_packed_matches_fallback_and_reference(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(1)
    lin = nn.Linear(64, 40, bias=bias).requires_grad_(False)
    q, s = quantize_int8(lin.weight)
    layer = Int8Linear(q, s, lin.bias, dtype)
    x = torch.randn(2, 3, 64).to(dtype)
    ref = x.float() @ (q.float() * s[:, None]).T + (lin.bias if bias else 0)
    assert layer.use_packed
    y = layer(x)
    layer.use_packed = False
    y_fallback = layer(x)
    assert y.shape == (2, 3, 40) and y.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert _rel_err(y, ref) < tol
    assert _rel_err(y_fallback, ref) < tol


def test_int4_packing_by_row_chunks_equals_packing_at_once() -> None:
    from specserve.models.quant.int4_weight import ROW_CHUNK
    from specserve.models.quant.layers import _pack_int4_rows

    torch.manual_seed(3)
    n, k = ROW_CHUNK + 40, 64  # more than one chunk; 40 rows need 8 rows of padding
    w4 = quantize_int4(torch.randn(n, k), 32)
    codes = torch.nn.functional.pad(w4.codes().to(torch.int32), (0, 0, 0, 8))
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(_pack_int4_rows(w4, 8), whole)


def test_int8_linear_copies_a_misaligned_weight() -> None:
    # A weight read from a safetensors file sits at an 8-byte aligned offset; the packed
    # int8 kernel segfaulted on such a weight (896 x 896 at offset 56 mod 64, 4 rows).
    torch.manual_seed(2)
    q, s = quantize_int8(torch.randn(896, 896))
    buf = torch.empty(q.numel() + 64, dtype=torch.int8)
    offset = (56 - buf.data_ptr()) % 64
    misaligned = buf[offset : offset + q.numel()].view(896, 896)
    misaligned.copy_(q)
    assert misaligned.data_ptr() % 64 == 56
    layer = Int8Linear(misaligned, s, None, torch.bfloat16)
    assert layer.qweight.data_ptr() % 64 == 0 and layer.scale.data_ptr() % 64 == 0
    x = torch.randn(4, 896, dtype=torch.bfloat16)
    ref = x.float() @ (q.float() * s[:, None]).T
    assert _rel_err(layer(x), ref) < 3e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features", [48, 40])  # 40: padded to 48 for the packed kernel
def test_int4_linear_packed_matches_fallback_and_reference(
    dtype: torch.dtype, out_features: int
) -> None:
    torch.manual_seed(2)
    lin = nn.Linear(64, out_features, bias=True).requires_grad_(False)
    w4 = quantize_int4(lin.weight, 32)
    packed = Int4Linear(w4, lin.bias, dtype, use_packed=True)
    fallback = Int4Linear(w4, lin.bias, dtype, use_packed=False)
    x = torch.randn(5, 64).to(dtype)
    ref = x.float() @ w4.dequantize().T + lin.bias
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert _rel_err(packed(x), ref) < tol
    assert _rel_err(fallback(x), ref) < tol
    assert packed(x).shape == (5, out_features)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_linear_rows_are_batch_invariant(kind: str) -> None:
    """A row's result must not depend on the rows batched with it (verify == decode)."""
    torch.manual_seed(3)
    w = torch.randn(96, 128)
    layer: nn.Module
    if kind == "int8":
        layer = Int8Linear(*quantize_int8(w), None, torch.bfloat16)
    else:
        layer = Int4Linear(quantize_int4(w, 64), None, torch.bfloat16)
    x = torch.randn(9, 128, dtype=torch.bfloat16)
    full = layer(x)
    for m in range(1, 9):
        for i in range(0, 9 - m + 1):
            assert torch.equal(layer(x[i : i + m]), full[i : i + m]), (m, i)


def test_int8_embedding_reads_dequantised_rows() -> None:
    w = torch.randn(30, 16)
    q, s = quantize_int8(w)
    emb = Int8Embedding(q, s, torch.float32)
    ids = torch.tensor([[3, 0, 29]])
    out = emb(ids)
    assert out.shape == (1, 3, 16)
    assert torch.allclose(out, (q.float() * s[:, None])[ids], atol=1e-6)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantize_model_keeps_logits_close(family: str, fmt: str) -> None:
    model = make_tiny_model(family, hidden_size=64, intermediate_size=128)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 12))
    from specserve.kv_cache.single_sequence import SingleSequenceCache

    ref = model.compute_logits(SingleSequenceCache(model, 16).forward(ids[0]))
    before = weight_bytes(model)
    quantize_model(model, fmt, group_size=32)  # type: ignore[arg-type]
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert weight_bytes(model) < before / (3 if fmt == "int8" else 4)
    out = model.compute_logits(SingleSequenceCache(model, 16).forward(ids[0]))
    assert _rel_err(out, ref) < (0.05 if fmt == "int8" else 0.5)  # random nets amplify


def test_quantize_model_twice_is_refused() -> None:
    model = quantize_model(make_tiny_model("qwen2"), "int8")
    with pytest.raises(ValueError, match="already quantised"):
        quantize_model(model, "int8")
    with pytest.raises(ValueError, match="unknown quantised weight format"):
        quantize_weights(make_tiny_model("qwen2"), "int3")  # type: ignore[arg-type]


def test_portable_state_rebuilds_the_same_model() -> None:
    a = make_tiny_model("qwen2", hidden_size=64, intermediate_size=128)
    b = make_tiny_model("qwen2", hidden_size=64, intermediate_size=128)
    state = quantize_weights(a, "int4", 32)
    apply_quantized(a, "int4", state, 32)
    apply_quantized(b, "int4", {k: v.clone() for k, v in state.items()}, 32)
    ids = torch.arange(10)
    from specserve.kv_cache.single_sequence import SingleSequenceCache

    ha = SingleSequenceCache(a, 16).forward(ids)
    hb = SingleSequenceCache(b, 16).forward(ids)
    assert torch.equal(a.compute_logits(ha), b.compute_logits(hb))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_verify_equals_decode(family: str, fmt: str) -> None:
    """Greedy plain decoding and a k + 1-token verification of the same tokens agree exactly
    (bf16 activations, packed kernels): the property speculative == plain rests on."""
    model = make_tiny_model(family, hidden_size=64, intermediate_size=128)
    model = quantize_model(model.to(torch.bfloat16), fmt, group_size=32)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompt = [5, 17, 33, 2, 9]
    plain = generate_plain(model, prompt, params, eos_token_ids=())
    from specserve.kv_cache.single_sequence import SingleSequenceCache

    # Prefill as plain decoding does, then verify the generated tokens in one short forward
    # (k + 1 <= SHORT_FORWARD_ROWS rows, the chunk the engine verifies in).
    cache = SingleSequenceCache(model, 64)
    first = model.compute_logits(cache.forward(prompt)[-1:])
    verify = model.compute_logits(cache.forward(plain.token_ids[:-1]))
    assert len(plain.token_ids) - 1 <= SHORT_FORWARD_ROWS
    verify_argmax = torch.cat([first, verify]).argmax(-1).tolist()
    assert verify_argmax == plain.token_ids


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_fused_projections_compute_exactly_the_separate_rows(fmt: str) -> None:
    """q/k/v and gate/up become one module each; every row equals the separate module's."""
    model = make_tiny_model("qwen2", hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    state = quantize_weights(model, fmt, 32)  # type: ignore[arg-type]
    attn = model.model.layers[1].self_attn
    biases = {n: getattr(attn, n).bias for n in ("q_proj", "k_proj", "v_proj")}

    def separate(name: str, bias: torch.Tensor | None) -> nn.Module:
        key = f"model.layers.1.{name}"
        if fmt == "int8":
            return Int8Linear(state[f"{key}.qweight"], state[f"{key}.scale"], bias, torch.bfloat16)
        w = Int4Weight(state[f"{key}.nibbles"], state[f"{key}.scale"], state[f"{key}.minimum"], 32)
        return Int4Linear(w, bias, torch.bfloat16)

    parts = [separate(f"self_attn.{n}", b) for n, b in biases.items()]
    mlp_parts = [separate(f"mlp.{n}", None) for n in ("gate_proj", "up_proj")]
    apply_quantized(model, fmt, state, 32)  # type: ignore[arg-type]
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert attn.q_proj is None and mlp.gate_proj is None and attn.qkv_proj is not None
    assert mlp.gate_up_proj is not None
    for rows in (1, 5):
        x = torch.randn(rows, 64).to(torch.bfloat16)
        assert torch.equal(attn.qkv_proj(x), torch.cat([p(x) for p in parts], dim=-1))
        assert torch.equal(mlp.gate_up_proj(x), torch.cat([p(x) for p in mlp_parts], dim=-1))


def test_int4_linear_picks_the_native_kernel_for_bf16_only() -> None:
    from specserve.models.native import int4_native

    torch.manual_seed(3)
    lin = nn.Linear(128, 40, bias=True).requires_grad_(False)
    w4 = quantize_int4(lin.weight, 32)
    auto_bf16 = Int4Linear(w4, lin.bias, torch.bfloat16)
    aten = Int4Linear(w4, lin.bias, torch.bfloat16, native=False)
    fp32 = Int4Linear(w4, lin.bias, torch.float32)
    assert aten.native is None and fp32.native is None  # fp32 models keep fp32 activations
    assert "kernel=aten" in aten.extra_repr()
    if not int4_native.available():
        assert auto_bf16.native is None
        with pytest.raises(RuntimeError, match="native int4 kernel requested"):
            Int4Linear(w4, lin.bias, torch.bfloat16, native=True)
        return
    assert auto_bf16.native is not None and "kernel=native" in auto_bf16.extra_repr()
    x = torch.randn(2, 3, 128).to(torch.bfloat16)
    ref = x.float() @ w4.dequantize().T + lin.bias
    out = auto_bf16(x)
    assert out.shape == (2, 3, 40) and out.dtype == torch.bfloat16
    assert _rel_err(out, ref) < 3e-2
    assert _rel_err(out, aten(x)) < 3e-2
