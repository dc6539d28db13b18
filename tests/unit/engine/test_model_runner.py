"""The model runner's forward layouts: decode/verify rows of different lengths run without
padding on the native layer path (one-token rows), with the bits each row gets alone."""

from __future__ import annotations

import pytest
import torch

from specserve.engine.model_runner import ForwardRow, ModelRunner
from specserve.models.decoder import DecoderLM
from specserve.models.native import bf16_native, fused_layer
from tests.conftest import make_tiny_model

SHAPE = dict(hidden_size=128, intermediate_size=192, num_heads=4, num_kv_heads=2, head_dim=32)
BLOCK = 4
PROMPTS = [[5, 17, 3, 44, 9], [71, 2, 30, 8, 61, 12, 19], [27, 4, 50]]
# Each request's next forward: its last sampled token and 0, 3 or 1 drafts.
DECODE = [[6], [90, 14, 21, 38], [11, 1]]

native_bf16 = pytest.mark.skipif(
    not bf16_native.available(), reason=f"native bf16 kernel: {bf16_native.unavailable_reason()}"
)


def _model(fused: bool) -> DecoderLM:
    model = make_tiny_model("qwen2", **SHAPE).to(torch.bfloat16)
    if fused:
        assert fused_layer.enable(model)
    else:
        fused_layer.disable(model)
    return model


def _run(model: DecoderLM, which: list[int]) -> tuple[list[torch.Tensor], int]:
    """The prompts of ``which``, then their decode rows in one execute: each row's logits and
    the token rows that execute ran."""
    runner = ModelRunner(model, model.make_kv_cache(num_blocks=16, block_size=BLOCK))
    tables = {i: list(range(1 + 4 * i, 5 + 4 * i)) for i in range(len(PROMPTS))}
    runner.execute([ForwardRow(PROMPTS[i], 0, tables[i], 1) for i in which])
    rows = [ForwardRow(DECODE[i], len(PROMPTS[i]), tables[i], len(DECODE[i])) for i in which]
    logits = runner.execute(rows)
    return list(logits.split([len(DECODE[i]) for i in which])), runner.last_num_tokens


@native_bf16
def test_ragged_rows_run_unpadded_with_the_bits_of_each_row_alone() -> None:
    model = _model(fused=True)
    together, tokens = _run(model, [0, 1, 2])
    assert tokens == 7  # 1 + 4 + 2, not 3 rows of 4
    for i in range(3):
        alone, _ = _run(model, [i])
        assert torch.equal(together[i], alone[0]), i
    # Rows of one length keep their [B, T] form (nothing to pad).
    _, even = _run(model, [0])
    assert even == 1


def test_the_eager_path_keeps_padded_rows() -> None:
    model = _model(fused=False)
    together, tokens = _run(model, [0, 1, 2])
    assert tokens == 12
    for i in range(3):
        alone, _ = _run(model, [i])
        torch.testing.assert_close(together[i], alone[0], rtol=2e-2, atol=2e-2)


@native_bf16
def test_the_controller_costs_a_ragged_step_by_the_tokens_it_ran() -> None:
    """An engine on the native path hands the k controller each decode step's real size (the
    requests' tokens, drafts included), not the batch padded to its longest row."""
    import random

    from specserve.sampling_params import SamplingParams
    from tests.integration.test_engine_plain import run_staggered
    from tests.integration.test_engine_spec import make_engine

    target = make_tiny_model("qwen2", vocab_size=13, **SHAPE).to(torch.bfloat16)
    assert fused_layer.enable(target)
    engine = make_engine(target, "ngram", None)
    controller = engine.k_controller
    assert controller is not None
    ran: list[int] = []
    execute = engine.runner.execute

    def spy_execute(rows):  # type: ignore[no-untyped-def]
        ran.append(sum(len(r.token_ids) for r in rows))
        return execute(rows)

    recorded: list[tuple[int, int, int | None]] = []
    record = controller.record_cost

    def spy_record(*args, **kwargs):  # type: ignore[no-untyped-def]
        recorded.append((kwargs["batch_size"], args[3], kwargs["num_step_tokens"]))
        assert kwargs["num_step_tokens"] == ran[-1]
        return record(*args, **kwargs)

    engine.runner.execute = spy_execute  # type: ignore[method-assign]
    controller.record_cost = spy_record  # type: ignore[method-assign]
    rng = random.Random(3)
    prompts = {f"r{i}": [rng.randrange(12) for _ in range(rng.randint(3, 12))] for i in range(4)}
    params = {rid: SamplingParams(max_tokens=24, ignore_eos=True) for rid in prompts}
    run_staggered(engine, prompts, params, {rid: 0 for rid in prompts})
    # Some steps mixed requests with and without drafts (or with drafts of different lengths).
    assert any(size < batch * tokens for batch, tokens, size in recorded if size is not None)
    assert all(size == batch * tokens for batch, tokens, size in recorded if batch == 1)


@native_bf16
def test_ragged_rows_keep_each_rows_captured_hidden_states() -> None:
    """With hidden states captured (a proposer drafting from them), each row of a ragged step
    gets its tokens' states in order, the bits it gets alone."""
    model = _model(fused=True)
    model.capture_layers = (1, 2)

    def hidden(which: list[int]) -> list[torch.Tensor]:
        runner = ModelRunner(model, model.make_kv_cache(num_blocks=16, block_size=BLOCK))
        tables = {i: list(range(1 + 4 * i, 5 + 4 * i)) for i in range(len(PROMPTS))}
        runner.execute([ForwardRow(PROMPTS[i], 0, tables[i], 1) for i in which])
        runner.execute(
            [ForwardRow(DECODE[i], len(PROMPTS[i]), tables[i], len(DECODE[i])) for i in which]
        )
        assert runner.last_num_tokens == sum(len(DECODE[i]) for i in which)
        return runner.last_hidden

    together = hidden([0, 1, 2])
    assert [h.shape[0] for h in together] == [len(d) for d in DECODE]
    for i in range(3):
        assert torch.equal(together[i], hidden([i])[0]), i
