"""AsyncEngine: concurrent streams, abort/disconnect free blocks, admission errors, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from specserve.config import CacheConfig, SchedulerConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.errors import EngineShutdownError, QueueFullError
from specserve.engine.llm_engine import LLMEngine
from specserve.engine.outputs import RequestOutput
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model


def make_engine(**sched: int) -> AsyncEngine:
    model = make_tiny_model("qwen2")
    return AsyncEngine(
        LLMEngine(
            model,
            cache=CacheConfig(block_size=4, num_blocks=128),
            scheduler=SchedulerConfig(**sched),
        )
    )


async def collect(engine: AsyncEngine, rid: str, prompt: list[int], params: SamplingParams):
    return [o async for o in engine.generate(rid, prompt, params)]


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


async def wait_until_idle(engine: AsyncEngine) -> None:
    for _ in range(500):
        s = engine.stats()
        if s.num_running == 0 and s.num_waiting == 0 and s.num_blocks_free == s.num_blocks_total:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {engine.stats()}")


async def test_concurrent_streams_equal_plain_generation() -> None:
    engine = make_engine()
    prompts = {f"r{i}": [(7 * i + j) % 90 for j in range(3 + 5 * i)] for i in range(5)}
    params = SamplingParams(max_tokens=9)
    results = await asyncio.gather(*(collect(engine, r, p, params) for r, p in prompts.items()))
    for prompt, outs in zip(prompts.values(), results, strict=True):
        ref = generate_plain(engine.engine.model, prompt, params, engine.arch.eos_token_ids)
        assert tokens(outs) == ref.token_ids
        assert outs[-1].finished and outs[-1].num_generated_tokens == len(ref.token_ids)
    await wait_until_idle(engine)
    stats = engine.stats()
    assert stats.num_finished.get("length", 0) + stats.num_finished.get("stop", 0) == 5
    await engine.shutdown()


async def test_abort_and_disconnect_free_blocks() -> None:
    engine = make_engine()
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    gen = engine.generate("a", list(range(30)), params)
    first = await gen.__anext__()
    assert not first.finished
    await engine.abort("a")
    rest = [o async for o in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    # A consumer that stops listening (client disconnect) aborts its request too.
    gen2 = engine.generate("b", list(range(30)), params)
    await gen2.__anext__()
    await gen2.aclose()
    await wait_until_idle(engine)
    assert engine.stats().num_finished.get("abort") == 2
    engine.engine.kv.check_invariants()
    await engine.shutdown()


async def test_bad_requests_raise_value_error() -> None:
    engine = make_engine()
    with pytest.raises(ValueError, match="leaves no room"):
        await collect(engine, "x", [1] * engine.max_model_len, SamplingParams())
    with pytest.raises(ValueError, match="at least one token"):
        await collect(engine, "y", [], SamplingParams())
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        await collect(engine, "z", [1, 2], SamplingParams(stop=("x",)))
    assert engine.stats().num_rejected == {"bad_request": 3}
    await engine.shutdown()


async def test_queue_full_raises() -> None:
    engine = make_engine(max_num_seqs=1, max_queue_len=1)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    running = engine.generate("a", [1, 2, 3], params)
    await running.__anext__()  # a is running
    waiting = asyncio.ensure_future(collect(engine, "b", [1, 2, 3], params))
    for _ in range(200):  # wait until b is queued
        if engine.stats().num_waiting == 1:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(QueueFullError):
        await collect(engine, "c", [1, 2, 3], params)
    assert engine.stats().num_rejected.get("queue_full") == 1
    await running.aclose()
    outs = await waiting
    assert outs[-1].finish_reason == "length"
    await engine.shutdown()


async def test_shutdown_drains_then_refuses() -> None:
    engine = make_engine()
    task = asyncio.ensure_future(collect(engine, "a", [1, 2, 3], SamplingParams(max_tokens=20)))
    await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    await engine.shutdown(drain=True)
    outs = await task
    assert outs[-1].finished and outs[-1].finish_reason in ("stop", "length")
    with pytest.raises(EngineShutdownError):
        await collect(engine, "b", [1, 2], SamplingParams())


async def test_from_config_builds_on_the_step_thread() -> None:
    """The models load on the thread that steps them: one OpenMP master in the process."""
    seen: list[threading.Thread] = []

    def build() -> LLMEngine:
        seen.append(threading.current_thread())
        return LLMEngine(make_tiny_model("qwen2"), cache=CacheConfig(block_size=4, num_blocks=64))

    engine = await asyncio.to_thread(AsyncEngine.build_on_step_thread, build)
    assert seen == [engine._thread]
    outs = await collect(engine, "a", [1, 2, 3], SamplingParams(max_tokens=4))
    ref = generate_plain(
        engine.engine.model, [1, 2, 3], SamplingParams(max_tokens=4), engine.arch.eos_token_ids
    )
    assert tokens(outs) == ref.token_ids
    await engine.shutdown()


async def test_build_failure_reaches_the_caller_and_ends_the_thread() -> None:
    seen: list[threading.Thread] = []

    def build() -> LLMEngine:
        seen.append(threading.current_thread())
        raise ValueError("no such model: nope")

    with pytest.raises(ValueError, match="no such model: nope"):
        await asyncio.to_thread(AsyncEngine.build_on_step_thread, build)
    for _ in range(200):  # the thread returns right after handing the error over
        if not seen[0].is_alive():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the step thread outlived its failed build")
