"""Fused decoder layers over a mix of int4 and int8-group projections: the plan accepts
``Int8GroupLinear`` (and reports its kernel when it is off), the op agrees with the eager
layers, and a multi-token forward's rows equal one-token forwards bit for bit."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLayer, DecoderLM
from specserve.models.native import fused_layer, int4_native, int8_native, superblock
from specserve.models.quant.int8_group import Int8GroupLinear, Int8GroupWeight
from specserve.models.quant.layers import Int4Linear
from specserve.models.quant.quantize import quantize_model
from tests.conftest import make_tiny_model
from tests.fused_reference import reference

pytestmark = pytest.mark.skipif(
    not (int4_native.available() and int8_native.available()),
    reason=f"native kernels: int4 {int4_native.unavailable_reason()}, "
    f"int8-group {int8_native.unavailable_reason()}",
)

SHAPE = dict(hidden_size=128, intermediate_size=192, num_heads=4, num_kv_heads=2, head_dim=32)
IDS = [5, 17, 3, 44, 9, 71, 2, 30, 8, 61, 12, 19, 27, 4, 50, 33, 6, 90, 14, 21, 38, 11]
GROUP = 16
# Each projection of a layer: its module's parent attribute, module name, float parts.
_PROJ = {
    "qkv": ("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "o": ("self_attn", "o_proj", ("o_proj",)),
    "gate_up": ("mlp", "gate_up_proj", ("gate_proj", "up_proj")),
    "down": ("mlp", "down_proj", ("down_proj",)),
}


def _k_quant_group(w: torch.Tensor, offsets: bool) -> Int8GroupWeight:
    """Codes -32..31 in groups of ``GROUP`` with the K-quants' constants (per row and 64
    inputs an fp16 ``d`` times int8 scale codes, and with ``offsets`` an fp16 ``dmin`` times
    codes 0..63, Q4_K's ``−dmin·m``): what the kernel packs with superblock constants."""
    n, k = w.shape
    g = w.float().view(n, k // GROUP, GROUP)
    per = 64 // GROUP
    offset = torch.zeros(n, k // GROUP)
    if offsets:
        gen = torch.Generator().manual_seed(n + k)
        dmin = (g.abs().amax(-1).view(n, -1, per).amax(-1) / 500).half().float()
        m = torch.randint(0, 64, (n, k // GROUP), generator=gen).float()
        offset = -(dmin.repeat_interleave(per, dim=1) * m)
    centred = g - offset[..., None]
    ideal = (centred.abs().amax(-1) / 31).clamp(min=1e-6)
    d = (ideal.view(n, -1, per).amax(-1) / 127).half().float().repeat_interleave(per, dim=1)
    scale = d * (ideal / d).round().clamp(1, 127)
    codes = (centred / scale[..., None]).round().clamp(-32, 31)
    return Int8GroupWeight(codes.to(torch.int8).view(n, k), scale, offset, GROUP)


def _int8_group(w: torch.Tensor, bits: int | str = 8) -> Int8GroupWeight:
    """Asymmetric groups of ``GROUP`` inputs: codes -128..127 (``bits`` 8) or -32..31 (6,
    which the kernel packs in six bits, as a Q6_K tensor's), offset = the code 0's value;
    ``super`` / ``super+offsets``: :func:`_k_quant_group`."""
    if isinstance(bits, str):
        return _k_quant_group(w, offsets=bits == "super+offsets")
    n, k = w.shape
    half = 1 << (bits - 1)
    g = w.float().view(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / (2 * half - 1)).clamp(min=1e-8)
    offset = lo + half * scale
    codes = ((g - offset[..., None]) / scale[..., None]).round().clamp(-half, half - 1)
    return Int8GroupWeight(codes.to(torch.int8).view(n, k), scale, offset, GROUP)


def _mixed_model(
    int8: tuple[str, ...], family: str = "qwen2", int8_head: bool = False, bits: int | str = 8
) -> DecoderLM:
    """A tiny bf16 model quantised to int4 (group 32), then the projections named in ``int8``
    (and the LM head with ``int8_head``) replaced by int8-group ones of the float weights,
    with ``bits``-bit codes (``super``, ``super+offsets``: six-bit codes with superblock
    constants, skipped where the CPU does not run them)."""
    if isinstance(bits, str) and not superblock.preferred():
        pytest.skip(
            "superblock constants run on the AVX-512 BF16 / VBMI / GFNI kernel only, and not "
            "with the AMX tiles switched on (SPECSERVE_QUANT_AMX=1)"
        )
    form = {"super": 1, "super+offsets": 2}.get(str(bits), 0)
    tiny = make_tiny_model(family, **SHAPE).to(torch.bfloat16)
    floats = []
    for layer in tiny.model.layers:
        parts = {}
        for name, (parent, _, sources) in _PROJ.items():
            module = getattr(layer, parent)
            parts[name] = torch.cat([getattr(module, s).weight.detach() for s in sources])
        floats.append(parts)
    head = tiny.lm_head.weight.detach().clone()
    model = quantize_model(tiny, "int4", 32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECSERVE_SIX_BIT_CODES", "1")  # six bits where they fit, whatever the CPU
        for layer, parts in zip(model.model.layers, floats, strict=True):
            for name in int8:
                parent_name, attr, _ = _PROJ[name]
                parent = getattr(layer, parent_name)
                old = getattr(parent, attr)
                assert isinstance(old, Int4Linear)
                new = Int8GroupLinear(_int8_group(parts[name], bits), old.bias, torch.bfloat16)
                assert new.native is not None
                assert (new.native.code_bits, new.native.superblock_form) == (
                    6 if form else bits,
                    form,
                )
                setattr(parent, attr, new)
        if int8_head:
            head_weight = _int8_group(head, bits)
            model.lm_head = Int8GroupLinear(head_weight, None, torch.bfloat16)  # type: ignore[assignment]
    assert fused_layer.enable(model), fused_layer.why_not(model)
    return model


MIXES = [("qkv", "down"), ("o", "gate_up"), ("qkv", "o", "gate_up", "down")]


@pytest.mark.parametrize("residual", ["fp32", "bf16"])
@pytest.mark.parametrize("bits", [8, 6, "super", "super+offsets"])
@pytest.mark.parametrize("int8", MIXES)
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_mixed_model_agrees_with_the_eager_layers(
    family: str, int8: tuple[str, ...], bits: int | str, residual: str
) -> None:
    """Hidden states and logits agree with the reference of tests/fused_reference.py (the
    eager bf16 layers for a bf16 residual stream, fp32 activations for the default fp32 one),
    and so do the greedy tokens where the reference's top two are not a near tie."""
    fused = _mixed_model(int8, family, int8_head=True, bits=bits)
    # superblock constants, and the int4 groups of 32, take int8 activations where the kernels
    # have them (the reference's tolerance allows for it)
    kind = "K-quants" if isinstance(bits, str) else "int4 groups" if len(int8) < 4 else ""
    x8_named = f", {kind} on int8 x" if kind and int4_native.int8_activations() else ""
    assert fused_layer.describe(fused) == "native int4_decoder_layer" + x8_named
    eager, tolerance = reference(fused, residual)
    a, b = SingleSequenceCache(fused, 64), SingleSequenceCache(eager, 64)
    checked = 0
    for chunk in (IDS[:18], [3], [7, 1, 22], [40]):
        ha, hb = a.forward(chunk), b.forward(chunk)
        err = float((ha.float() - hb.float()).norm() / hb.float().norm())
        assert err < tolerance, err
        la, lb = fused.compute_logits(ha), eager.compute_logits(hb)
        err = float((la - lb).norm() / lb.norm())
        assert err < 1.5 * tolerance, err
        top2 = lb.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * (la - lb).abs().amax(-1)
        assert torch.equal(la.argmax(-1)[clear], lb.argmax(-1)[clear])
        checked += int(clear.sum())
    assert checked >= 10  # of 23 rows


@pytest.mark.parametrize("tiles", ["0", "1"])
@pytest.mark.parametrize("bits", [8, 6, "super", "super+offsets"])
@pytest.mark.parametrize("int8", MIXES)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_verify_rows_equal_one_token_steps_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    int8: tuple[str, ...],
    bits: int | str,
    tiles: str,
) -> None:
    """A k + 1-token forward (and the LM head on its rows) gives each row the bits k + 1
    one-token forwards give, for k + 1 up to 16 (verify steps and prefill chunks), with byte
    and with six-bit codes (superblock constants too), and with the int4 and six-bit
    matmuls on the AMX tiles (``SPECSERVE_QUANT_AMX=1``, where the CPU has them)."""
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", tiles)
    model = _mixed_model(int8, family, int8_head=True, bits=bits)
    one = SingleSequenceCache(model, 64)
    one.forward(IDS[:6])
    by_token = torch.cat([one.forward([i]) for i in IDS])
    logits_by_token = torch.cat([model.compute_logits(by_token[i : i + 1]) for i in range(22)])
    for rows in (2, 5, 16):
        cache = SingleSequenceCache(model, 64)
        cache.forward(IDS[:6])
        parts = [cache.forward(IDS[j : j + rows]) for j in range(0, len(IDS), rows)]
        assert torch.equal(torch.cat(parts), by_token), rows
        logits = torch.cat([model.compute_logits(p) for p in parts])
        assert torch.equal(logits, logits_by_token), rows


def test_plan_names_the_int8_group_kernel_when_it_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _mixed_model(("down",))
    monkeypatch.setenv("SPECSERVE_INT8_NATIVE", "0")
    why = fused_layer.why_not(model)
    assert why is not None and "int8-group kernel unavailable" in why, why
    assert "SPECSERVE_INT8_NATIVE" in why
    assert not fused_layer.enable(model) and not model.fused_layers
    monkeypatch.delenv("SPECSERVE_INT8_NATIVE")
    assert fused_layer.enable(model)


def test_plan_rejects_an_int8_group_projection_off_the_kernel() -> None:
    model = _mixed_model(())
    layer = cast("DecoderLayer", model.model.layers[1])
    old = layer.mlp.down_proj
    assert isinstance(old, Int4Linear)
    weight = _int8_group(torch.randn(128, 192) * 0.1)
    layer.mlp.down_proj = Int8GroupLinear(weight, None, torch.bfloat16, native=False)
    why = fused_layer.why_not(model)
    assert why is not None and "down_proj is not on the native int4 or int8-group kernel" in why
