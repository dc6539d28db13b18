"""Fused decoder layers (one native op per layer, int4 or bf16 weights, bf16 activations):
when the path is on,
agreement with the eager layers, bit-exact invariance to chunking, batching and context
padding, argument errors, the environment switch and torch.compile."""

from __future__ import annotations

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import SHORT_FORWARD_ROWS, AttentionMetadata, DecoderLM
from specserve.models.native import bf16_native, build, fused_layer, int4_native
from specserve.models.native.tile_stream import EXACT_X
from specserve.models.quant.quantize import quantize_model
from tests.conftest import make_tiny_model
from tests.fused_reference import reference

native = pytest.mark.skipif(
    not int4_native.available(), reason=f"native int4 kernel: {int4_native.unavailable_reason()}"
)
native_bf16 = pytest.mark.skipif(
    not bf16_native.available(), reason=f"native bf16 kernel: {bf16_native.unavailable_reason()}"
)
# Both forms of the op: quantised to int4, and the model's own bf16 weights.
FORMATS = [pytest.param("int4", marks=native), pytest.param("bf16", marks=native_bf16)]

SHAPE = dict(hidden_size=128, intermediate_size=192, num_heads=4, num_kv_heads=2, head_dim=32)


def _model(
    family: str = "qwen2",
    fmt: str = "int4",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    **overrides: object,
) -> DecoderLM:
    tiny = make_tiny_model(family, seed=seed, **{**SHAPE, **overrides}).to(dtype)
    if fmt == "bf16":  # the loader enables the path on every model it builds
        fused_layer.enable(tiny)
        return tiny
    return quantize_model(tiny, fmt, 32)  # type: ignore[arg-type]


IDS = [5, 17, 3, 44, 9, 71, 2, 30, 8, 61, 12, 19, 27, 4, 50, 33, 6, 90, 14, 21, 38, 11]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_enabled_for_bf16_models(family: str, fmt: str) -> None:
    model = _model(family, fmt)
    assert model.fused_layers and fused_layer.why_not(model) is None
    assert all(layer.fused is not None for layer in model.model.layers)
    # The dense model also gets the native LM head (int4 models quantise theirs).
    assert (model.logits_runner is not None) == (fmt == "bf16")


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        pytest.param(dict(dtype=torch.float32), "bf16", marks=native_bf16),
        pytest.param(dict(fmt="int8"), "native int4", marks=native_bf16),
        pytest.param(dict(head_dim=8), "head_dim 8", marks=native_bf16),
        pytest.param(dict(fmt="bf16", intermediate_size=200), "down_proj", marks=native_bf16),
    ],
)
def test_off_where_the_model_does_not_qualify(kwargs: dict, reason: str) -> None:  # type: ignore[type-arg]
    model = _model(**kwargs)
    assert not model.fused_layers
    why = fused_layer.why_not(model)
    assert why is not None and reason in why, why


@pytest.mark.parametrize("fmt", FORMATS)
def test_env_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    monkeypatch.setenv("SPECSERVE_FUSED_LAYER", "0")
    model = _model(fmt=fmt)
    assert not model.fused_layers and model.logits_runner is None
    assert "SPECSERVE_FUSED_LAYER" in str(fused_layer.why_not(model))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_residual_stream_is_fp32_unless_switched_to_bf16(
    monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """The layers pass the residual stream on in fp32; the final norm rounds it to bf16 once,
    and captured layer inputs come in the model's dtype. ``SPECSERVE_FP32_RESIDUAL=0`` keeps
    it in bf16 (the eager layers' roundings), and the path's description says so."""
    model = _model(fmt=fmt)
    model.capture_layers = (1, 2)
    kv = model.make_kv_cache(num_blocks=4, block_size=16)
    ids = torch.tensor([IDS[:5]])
    meta = AttentionMetadata(
        torch.arange(5)[None], torch.arange(16, 21)[None], torch.arange(16, 32)[None]
    )
    x = model.model.embed_tokens(ids)
    cos, sin = model.rotary(meta.positions, x.dtype)
    captured: list[torch.Tensor] = []
    assert fused_layer.run_layers(model, x, cos, sin, meta, kv, captured).dtype == torch.float32
    assert [c.dtype for c in captured] == [torch.bfloat16]  # layer 1 of 2; 2 is the norm's
    hidden, states = model.forward_with_hidden(ids, meta, kv)
    assert hidden.dtype == states.dtype == torch.bfloat16
    assert "residual" not in fused_layer.describe(model)
    monkeypatch.setenv("SPECSERVE_FP32_RESIDUAL", "0")
    fused_layer.enable(model)
    assert fused_layer.run_layers(model, x, cos, sin, meta, kv).dtype == torch.bfloat16
    assert fused_layer.describe(model).endswith(", bf16 residual stream")


@pytest.mark.parametrize("residual", ["fp32", "bf16"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])  # q/k/v bias; q/k norms
def test_agrees_with_the_eager_layers(family: str, fmt: str, residual: str) -> None:
    """A prefill (chunked on the fused path), then decode steps: fused and reference hidden
    states agree (see _reference), and so do the greedy tokens."""
    fused = _model(family, fmt)
    eager, tolerance = reference(fused, residual)
    want = {"fp32": torch.float32, "bf16": torch.bfloat16}[residual]  # fp32 by default
    assert fused.model.layers[0].fused.residual == want
    a, b = SingleSequenceCache(fused, 64), SingleSequenceCache(eager, 64)
    checked = 0
    for chunk in (IDS[:18], [3], [7, 1, 22], [40]):
        ha, hb = a.forward(chunk), b.forward(chunk)
        assert ha.dtype == torch.bfloat16
        err = float((ha.float() - hb.float()).norm() / hb.float().norm())
        assert err < tolerance, err
        la, lb = fused.compute_logits(ha), eager.compute_logits(hb)
        # Greedy tokens agree on every row whose eager top two are further apart than the
        # two paths' logits differ (only a closer tie can flip).
        top2 = lb.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * (la - lb).abs().amax(-1)
        assert torch.equal(la.argmax(-1)[clear], lb.argmax(-1)[clear])
        checked += int(clear.sum())
    assert checked >= 10  # of 23 rows


@pytest.mark.parametrize("residual", ["fp32", "bf16"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("context", [45, 86])
def test_long_contexts_agree_with_the_eager_layers(context: int, fmt: str, residual: str) -> None:
    """Attention over many blocks of keys (their q.k chains interleaved, their rows
    prefetched ahead), with every tail length a block can have: the decode steps after a long
    prompt agree with the reference (see _reference), and a verify chunk's rows equal them bit
    for bit."""
    fused = _model("qwen2", fmt)
    eager, tolerance = reference(fused, residual)
    ids = [(7 * i + 3) % 89 + 1 for i in range(context)]
    a, b, chunked = (SingleSequenceCache(m, 128) for m in (fused, eager, fused))
    for cache in (a, b, chunked):
        cache.forward(ids)
    new = [3, 7, 11, 2]  # the key count moves through every remainder mod 4
    steps = []
    for tok in new:
        ha, hb = a.forward([tok]), b.forward([tok])
        err = float((ha.float() - hb.float()).norm() / hb.float().norm())
        assert err < tolerance, (tok, err)
        steps.append(ha)
    assert torch.equal(chunked.forward(new), torch.cat(steps))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_chunks_equal_token_by_token_bit_for_bit(family: str, fmt: str) -> None:
    model = _model(family, fmt)
    one = SingleSequenceCache(model, 64)
    one.forward(IDS[:18])
    by_token = torch.cat([one.forward([i]) for i in IDS])
    for chunk in (2, 5, 16):
        cache = SingleSequenceCache(model, 64)
        cache.forward(IDS[:18])
        parts = [cache.forward(IDS[j : j + chunk]) for j in range(0, len(IDS), chunk)]
        assert torch.equal(torch.cat(parts), by_token), chunk


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("chunk_rows", [16, 128])
def test_a_prompt_prefills_as_its_tokens_decode_one_by_one(
    family: str, fmt: str, chunk_rows: int
) -> None:
    """A prompt runs in chunks of ``prompt_chunk_rows`` tokens through the fused ops: its rows
    (so its cached keys and values and its first token) equal one-token steps bit for bit,
    in chunks of 16, 16 and 8, or in one of 40 rows (several row blocks in each matmul, the
    attention in parts of 16 rows)."""
    model = _model(family, fmt)
    model.prompt_chunk_rows = chunk_rows
    prompt = IDS[:18] + IDS  # 40 tokens
    whole = SingleSequenceCache(model, 64).forward(prompt)
    one = SingleSequenceCache(model, 64)
    by_token = torch.cat([one.forward([i]) for i in prompt])
    assert torch.equal(whole, by_token)
    assert torch.equal(model.compute_logits(whole[-1:]), model.compute_logits(by_token[-1:]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_prompt_chunks_follow_the_weights(fmt: str) -> None:
    """bf16 layers take prompts in chunks of BF16_PROMPT_ROWS (their matmuls read the weights
    once per call), quantised ones in chunks of 16; the eager path is back at 16."""
    model = _model(fmt=fmt)
    want = fused_layer.BF16_PROMPT_ROWS if fmt == "bf16" else SHORT_FORWARD_ROWS
    assert model.prompt_chunk_rows == want
    fused_layer.disable(model)
    assert model.prompt_chunk_rows == SHORT_FORWARD_ROWS


def _meta(seqs: list[tuple[int, int, int]], block: int, pad: int = 0) -> AttentionMetadata:
    """Metadata for sequences ``(i, cached, new)`` (one row each, equal ``new``): sequence i
    owns the blocks from ``1 + 4i`` on (block 0 is scratch); contexts are padded with the
    scratch slot to a common length plus ``pad``."""
    s = max(c + n for _, c, n in seqs) + pad
    positions, slots, context = [], [], []
    for i, cached, new in seqs:
        base = (1 + 4 * i) * block
        positions.append(list(range(cached, cached + new)))
        slots.append([base + p for p in range(cached, cached + new)])
        context.append([base + j for j in range(cached + new)] + [0] * (s - cached - new))
    return AttentionMetadata(torch.tensor(positions), torch.tensor(slots), torch.tensor(context))


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_do_not_depend_on_the_batch_or_the_context_padding(fmt: str) -> None:
    """Two sequences of different lengths in one padded batch give the bits each gets alone,
    with any amount of context padding."""
    model = _model(fmt=fmt)
    block = 16
    prompts = [IDS[:9], IDS[4:20]]
    new = [[3, 8, 1], [60, 2, 9]]

    def run(which: list[int], pad: int) -> list[torch.Tensor]:
        kv = model.make_kv_cache(num_blocks=1 + 4 * len(prompts), block_size=block)
        for i in which:
            model(torch.tensor([prompts[i]]), _meta([(i, 0, len(prompts[i]))], block), kv)
        meta = _meta([(i, len(prompts[i]), 3) for i in which], block, pad)
        return list(model(torch.tensor([new[i] for i in which]), meta, kv))

    both = run([0, 1], 0)
    assert torch.equal(both[0], run([0], 0)[0])
    assert torch.equal(both[1], run([1], 0)[0])
    assert torch.equal(both[1], run([0, 1], 13)[1])


@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_in_its_earlier_form_gives_the_same_bits(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused layers' attention reads a block of keys once for all the rows of a sequence
    and runs its chains side by side; its earlier form (SPECSERVE_FAST_ATTENTION=0) took each
    row on its own and ran them one after another: two sequences of 5 new rows each, their
    contexts 47 and 84 tokens (the rows' key counts 48-52 and 85-89 leave every remainder
    modulo a block of 8 keys, and of 4), give the same bits either way. (Both with the scores
    as fp32 chains, SPECSERVE_BF16_SCORES=0: the keys in lanes are another arithmetic.)"""
    monkeypatch.setenv("SPECSERVE_BF16_SCORES", "0")
    model = _model(fmt=fmt)
    block = 32
    prompts = [[(7 * i + 3) % 89 + 1 for i in range(47)], [(5 * i + 2) % 83 + 1 for i in range(84)]]
    new = [[3, 8, 1, 5, 9], [60, 2, 9, 4, 7]]

    def run() -> torch.Tensor:
        kv = model.make_kv_cache(num_blocks=1 + 4 * len(prompts), block_size=block)
        for i, prompt in enumerate(prompts):
            model(torch.tensor([prompt]), _meta([(i, 0, len(prompt))], block), kv)
        meta = _meta([(i, len(p), 5) for i, p in enumerate(prompts)], block, pad=3)
        return model(torch.tensor(new), meta, kv)

    monkeypatch.setenv("SPECSERVE_FAST_ATTENTION", "0")
    earlier = run()
    monkeypatch.delenv("SPECSERVE_FAST_ATTENTION")
    assert torch.equal(run(), earlier)


# Scores with the keys in lanes (csrc/key_lanes.h): built where the CPU has AVX-512 BF16.
_KEY_LANES = {"avx512f", "avx512_bf16"} <= build.cpu_signature()[1]


def _steps_and_verify(
    model: DecoderLM, ids: list[int], new: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """After the prompt ``ids``, the rows of ``new`` as one-token steps and as one verify."""
    one, chunked = SingleSequenceCache(model, 128), SingleSequenceCache(model, 128)
    one.forward(ids)
    chunked.forward(ids)
    return torch.cat([one.forward([t]) for t in new]), chunked.forward(new)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("context", [45, 86])
def test_scores_in_lanes_and_as_fp32_chains_both_agree(
    context: int, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the build scores keys in lanes (vdpbf16ps over the dim pairs; the library says
    so), its steps after a long prompt are near the scores as fp32 chains
    (SPECSERVE_BF16_SCORES=0), and a verify's rows equal its one-token steps bit for bit either
    way. (On these tiny models the two forms' scores differ by fp32 roundings, which the
    attention output's rounding to bf16 nearly always absorbs: the hidden states may well be
    the same bits.)"""
    model = _model("qwen2", fmt)
    _, tolerance = reference(model, "fp32")
    ids = [(7 * i + 3) % 89 + 1 for i in range(context)]
    new = [3, 7, 11, 2]

    assert torch.ops.specserve.fused_bf16_scores(32) == _KEY_LANES  # head_dim 32 (SHAPE)
    assert not torch.ops.specserve.fused_bf16_scores(16)  # not a multiple of 32
    lanes, lanes_verify = _steps_and_verify(model, ids, new)
    monkeypatch.setenv("SPECSERVE_BF16_SCORES", "0")
    assert not torch.ops.specserve.fused_bf16_scores(32)
    chains, chains_verify = _steps_and_verify(model, ids, new)
    assert torch.equal(lanes_verify, lanes) and torch.equal(chains_verify, chains)
    err = float((lanes.float() - chains.float()).norm() / chains.float().norm())
    assert err < tolerance, err


# Attention on the AMX tiles (csrc/attention_tiles.h): built where the CPU has AMX BF16 too.
_ATTENTION_TILES = _KEY_LANES and {"amx_tile", "amx_bf16"} <= build.cpu_signature()[1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_on_the_tiles_and_on_the_vector_units_both_agree(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the build runs attention on the AMX tiles (the library says so; off with
    SPECSERVE_ATTENTION_AMX=0 and with the scores as fp32 chains), its steps after a long
    prompt are near the vector units' (the keys in lanes), and a verify's rows equal its
    one-token steps bit for bit either way."""
    model = _model("qwen2", fmt)
    _, tolerance = reference(model, "fp32")
    ids = [(7 * i + 3) % 89 + 1 for i in range(86)]
    new = [3, 7, 11, 2]

    assert torch.ops.specserve.fused_attention_tiles(32) == _ATTENTION_TILES
    assert not torch.ops.specserve.fused_attention_tiles(16)
    tiles, tiles_verify = _steps_and_verify(model, ids, new)
    monkeypatch.setenv("SPECSERVE_ATTENTION_AMX", "0")
    assert not torch.ops.specserve.fused_attention_tiles(32)
    assert torch.ops.specserve.fused_bf16_scores(32) == _KEY_LANES
    lanes, lanes_verify = _steps_and_verify(model, ids, new)
    assert torch.equal(tiles_verify, tiles) and torch.equal(lanes_verify, lanes)
    err = float((tiles.float() - lanes.float()).norm() / lanes.float().norm())
    assert err < tolerance, err
    monkeypatch.setenv("SPECSERVE_ATTENTION_AMX", "1")
    monkeypatch.setenv("SPECSERVE_BF16_SCORES", "0")
    assert not torch.ops.specserve.fused_attention_tiles(32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_switch_takes_every_kernel_off_the_tiles(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPECSERVE_AMX=0 runs as a CPU without AMX would: the library reports the bf16 matmul,
    the attention and the quantised tiles (switched on or a draft's) off, and the model's
    steps and verify equal, bit for bit, those with each kernel's own switch off."""
    model = _model("qwen2", fmt)
    ids = [(5 * i + 2) % 89 + 1 for i in range(40)]
    new = [9, 4, 13, 6]
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "1")
    monkeypatch.setenv("SPECSERVE_AMX", "0")
    assert not torch.ops.specserve.fused_attention_tiles(32)
    assert not int4_native.amx_tiles() and not int4_native.amx_tiles(switched=False)
    assert bf16_native.kernel() != "AMX tiles"
    off, off_verify = _steps_and_verify(model, ids, new)
    monkeypatch.delenv("SPECSERVE_AMX")
    monkeypatch.delenv("SPECSERVE_QUANT_AMX")
    for name in ("SPECSERVE_BF16_AMX", "SPECSERVE_ATTENTION_AMX"):
        monkeypatch.setenv(name, "0")
    each, each_verify = _steps_and_verify(model, ids, new)
    assert torch.equal(off, each) and torch.equal(off_verify, each_verify)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_long_prompt_of_wide_groups_prefills_as_its_tokens_decode(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 300-token prompt in chunks of 128 with six query heads of 96 dims per key-value
    head: the attention's parts hold 96 or 72 query heads (whole passes of four tiles of 16
    and leftovers of one and two), its keys cross a super-block of 256 (the tiles' value
    layout), its scores take three tiles of 32 dims and its value sums four and two of 16 dims;
    the prompt's rows equal one-token steps bit for bit (on the vector units where the build
    has no tiles), and are near the vector units' rows (SPECSERVE_ATTENTION_AMX=0)."""
    model = _model("qwen2", fmt, hidden_size=192, num_heads=6, num_kv_heads=1, head_dim=96)
    _, tolerance = reference(model, "fp32")
    model.prompt_chunk_rows = 128
    prompt = [(11 * i + 5) % 83 + 1 for i in range(300)]
    whole = SingleSequenceCache(model, 320).forward(prompt)
    one = SingleSequenceCache(model, 320)
    by_token = torch.cat([one.forward([t]) for t in prompt])
    assert torch.equal(whole, by_token)
    monkeypatch.setenv("SPECSERVE_ATTENTION_AMX", "0")
    lanes = SingleSequenceCache(model, 320).forward(prompt)
    err = float((whole.float() - lanes.float()).norm() / lanes.float().norm())
    assert err < tolerance, err


@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_arguments_raise_clear_errors(fmt: str) -> None:
    model = _model(fmt=fmt)
    kv = model.make_kv_cache(num_blocks=4, block_size=16)
    x = torch.zeros(1, 1, 128, dtype=torch.bfloat16)
    cos = sin = torch.zeros(1, 1, 32, dtype=torch.bfloat16)
    ctx = torch.tensor([[16] * 8])
    outside = AttentionMetadata(torch.tensor([[40]]), torch.tensor([[20]]), ctx)
    with pytest.raises(RuntimeError, match="position 40 outside the 8 context slots"):
        fused_layer.run_layers(model, x, cos, sin, outside, kv)
    bad_slot = AttentionMetadata(torch.tensor([[0]]), torch.tensor([[999]]), torch.tensor([[16]]))
    with pytest.raises(RuntimeError, match="slot 999 outside the cache"):
        fused_layer.run_layers(model, x, cos, sin, bad_slot, kv)
    meta = AttentionMetadata(torch.tensor([[0]]), torch.tensor([[16]]), torch.tensor([[16]]))
    w = model.model.layers[0].fused
    op = getattr(torch.ops.specserve, w.op)
    flat = (meta.positions.view(-1), meta.slot_mapping.view(-1), meta.context_slots)
    layer_kv = (kv._k_layers[0], kv._v_layers[0])
    with pytest.raises(RuntimeError, match="x must be a contiguous CPU bf16 or fp32 tensor"):
        op(x.view(1, 128).half(), *flat, cos.view(1, 32), sin.view(1, 32), *layer_kv, *w.args)


@pytest.mark.parametrize("fmt", FORMATS)
def test_runs_under_torch_compile(fmt: str) -> None:
    model = _model(fmt=fmt)
    cache = SingleSequenceCache(model, 64)
    cache.forward(IDS[:18])
    expected = cache.forward([7, 9])
    cache.truncate(18)
    model.forward = torch.compile(model.forward, dynamic=True)  # type: ignore[method-assign]
    assert torch.equal(cache.forward([7, 9]), expected)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_engine_batching_and_speculation_equal_plain(method: str, fmt: str) -> None:
    """Continuous batching (staggered arrivals, chunked prefill) with speculation on fused
    models gives exactly batch-1 plain greedy output. Prompts are at most MAX_ROWS tokens,
    so every forward of both runs takes the fused path."""
    import random

    from specserve.sampling_params import SamplingParams
    from specserve.spec_decode.plain_loop import generate_plain
    from tests.integration.test_engine_plain import run_staggered, tokens_of
    from tests.integration.test_engine_spec import make_engine

    target = _model(fmt=fmt, vocab_size=13)
    draft = _model(fmt=fmt, vocab_size=13, seed=1) if method == "draft" else None
    assert target.fused_layers and (draft is None or draft.fused_layers)
    engine = make_engine(target, method, 3, draft)
    rng = random.Random(0)
    prompts = {
        f"r{i}": [rng.randrange(12) for _ in range(rng.randint(2, fused_layer.MAX_ROWS))]
        for i in range(5)
    }
    params = {rid: SamplingParams(max_tokens=rng.randint(6, 20)) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {rid: i for i, rid in enumerate(prompts)})
    for rid, prompt in prompts.items():
        ref = generate_plain(target, prompt, params[rid], target.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
    assert engine.stats().spec.num_drafts > 0


def test_decoder_routes_forwards_through_an_installed_layer_runner() -> None:
    """The hook ``enable`` uses (checked on any CPU): with a runner installed, every forward
    runs the layers through it, one longer than ``prompt_chunk_rows`` tokens in chunks of
    that size, and removing it restores the eager path."""
    model = make_tiny_model("qwen2", **SHAPE)
    chunk = model.prompt_chunk_rows
    calls: list[int] = []

    def eager_runner(m, x, cos, sin, meta, kv, captured=None):  # type: ignore[no-untyped-def]
        calls.append(x.shape[1])
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        mask = meta.attention_mask()
        for layer in m.model.layers:
            x = layer(x, cos, sin, meta, mask, kv)
        return x

    ids = [(7 * i + 3) % 90 for i in range(chunk + 5)]
    plain = SingleSequenceCache(model, 64)
    want = [plain.forward(ids[:4]), plain.forward(ids[4:])]
    assert not model.fused_layers
    model.layer_runner = eager_runner
    assert model.fused_layers
    hooked = SingleSequenceCache(model, 64)
    got = [hooked.forward(ids[:4]), hooked.forward(ids[4:])]
    assert calls == [4, chunk, 1]  # the 17-token forward in two chunks
    assert torch.equal(want[0], got[0])
    # The chunks attend row by row, the whole forward through SDPA: equal to rounding.
    torch.testing.assert_close(want[1], got[1], rtol=1e-5, atol=1e-5)
    fused_layer.disable(model)
    assert model.layer_runner is None and not model.fused_layers


# What the description adds for int4 weights in groups of 32 where they take int8 activations
# (AVX-512 VNNI builds, unless SPECSERVE_INT8_ACTIVATIONS=0).
_INT4_X8 = ", int4 groups on int8 x" if int4_native.int8_activations() else ""


@pytest.mark.parametrize("fmt", FORMATS)
def test_describe_names_the_path(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(fmt=fmt)
    kernel = f" on {bf16_native.describe_kernel()}" if fmt == "bf16" else _INT4_X8
    assert fused_layer.describe(model) == f"native {fmt}_decoder_layer{kernel}"
    monkeypatch.setenv("SPECSERVE_BF16_AMX", "0")
    monkeypatch.setenv("SPECSERVE_BF16_FMA", "1")
    if fmt == "bf16" and bf16_native.kernel() == "AVX-512 BF16":
        pairs = "on AVX-512 BF16 (sums of several rows as FMA pairs)"
        assert fused_layer.describe(model) == f"native bf16_decoder_layer {pairs}"
    monkeypatch.setenv("SPECSERVE_BF16_FMA", "0")
    kernel = f" on {bf16_native.kernel()}" if fmt == "bf16" else _INT4_X8
    assert fused_layer.describe(model) == f"native {fmt}_decoder_layer{kernel}"
    fused_layer.disable(model)
    assert fused_layer.describe(model) == "eager (not enabled)"
    assert fused_layer.describe(_model(dtype=torch.float32)).startswith("eager (needs bf16")


@native
def test_a_layer_with_exact_x_projections_keeps_x_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a GGUF file's per-group blocks keep x exact (``exact_x``) the fused op does so for
    the whole layer: its outputs are the bits of ``SPECSERVE_INT8_ACTIVATIONS=0``, whatever
    the int4 format's groups would take, and the description names no int8 x."""
    model = _model()
    for module in model.modules():
        packed = getattr(module, "native", None)
        if packed is not None and hasattr(packed, "exact_x"):
            packed.exact_x = module is model.model.layers[0].mlp.down_proj or packed.exact_x
    fused_layer.enable(model)  # one projection of layer 0 marked: the layer takes the bit
    first, second = (layer.fused for layer in model.model.layers)
    assert first.args[-1] & EXACT_X and first.short_mode & EXACT_X
    assert not second.args[-1] & EXACT_X and not second.short_mode & EXACT_X
    ids = IDS[:7]
    marked = SingleSequenceCache(model, 32).forward(ids)
    assert fused_layer.describe(model) == f"native int4_decoder_layer{_INT4_X8}"  # layer 1
    for module in model.modules():
        packed = getattr(module, "native", None)
        if packed is not None and hasattr(packed, "exact_x"):
            packed.exact_x = True
    fused_layer.enable(model)
    assert fused_layer.describe(model) == "native int4_decoder_layer"
    exact = SingleSequenceCache(model, 32).forward(ids)
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
    assert torch.equal(exact, SingleSequenceCache(model, 32).forward(ids))
    if _INT4_X8:  # layer 1 took int8 x while only layer 0 kept x exact
        assert not torch.equal(marked, exact)


@native
@native_bf16
def test_quantising_a_bf16_model_replans_the_path() -> None:
    """The loader enables the bf16 path on a bf16 model; quantising it to int4 afterwards
    switches to the int4 op and drops the native bf16 LM head (int4 quantises the head)."""
    model = _model(fmt="bf16")
    kernel = bf16_native.describe_kernel()
    assert fused_layer.describe(model) == f"native bf16_decoder_layer on {kernel}"
    quantize_model(model, "int4", 32)
    assert fused_layer.describe(model) == f"native int4_decoder_layer{_INT4_X8}"
    assert model.logits_runner is None
    hidden = torch.randn(2, 128, dtype=torch.bfloat16)
    assert model.compute_logits(hidden).shape == (2, model.cfg.vocab_size)
