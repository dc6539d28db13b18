"""The engine on a CUDA device (every test is skipped where torch sees none): greedy fp32
speculation equals plain decoding for every proposer, staggered and batched; a quantised GGUF
loads as float weights and serves through ``specserve serve --device cuda``; ``train-draft
--device cuda`` trains a head that then drafts on the GPU. The native kernels are CPU-only,
so on CUDA every format runs on PyTorch's own ops.

``SPECSERVE_TEST_CUDA_DEVICE`` names the device (default ``cuda``); ``cpu`` runs the same
checks on the CPU, which is how they are kept working on machines without a GPU."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from gguf import GGMLQuantizationType

from specserve.cli import main
from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.builder import build_engine
from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import load_model
from specserve.loading.gguf_stored import default_format
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.server.launcher import ServerProcess
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model
from tests.heads import make_eagle_head, make_medusa_heads
from tests.integration.test_engine_spec import assert_equals_plain, make_engine
from tests.unit.loading.conftest import tiny_hf_model, write_gguf

DEVICE = os.environ.get("SPECSERVE_TEST_CUDA_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE != "cpu" and not torch.cuda.is_available(), reason="needs a CUDA device"
)
SHOWN = "cpu" if DEVICE == "cpu" else str(torch.device(DEVICE, torch.device(DEVICE).index or 0))

VOCAB = 13
METHODS = ["ngram", "suffix", "draft", "hybrid", "eagle", "medusa"]


def cuda_engine(method: str, k: int | None, target: DecoderLM):  # type: ignore[no-untyped-def]
    draft = head = None
    if method in ("draft", "hybrid"):
        draft = make_tiny_model("qwen3", seed=1, vocab_size=VOCAB).to(DEVICE)
    elif method == "eagle":
        head = make_eagle_head(target, seed=3, draft_vocab_size=10).to(DEVICE)
    elif method == "medusa":
        head = make_medusa_heads(target, seed=3, num_heads=5).to(DEVICE)
    return make_engine(target, method, k, draft=draft, head=head, device=DEVICE)


def run_one(engine, prompt: list[int], max_tokens: int = 16) -> list[int]:  # type: ignore[no-untyped-def]
    """Greedy tokens of one request through ``engine``."""
    engine.add_request("r", prompt, SamplingParams(max_tokens=max_tokens))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


def plain_tokens(engine, prompt: list[int], max_tokens: int = 16) -> list[int]:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=max_tokens)
    return generate_plain(engine.model, prompt, params, engine.eos_token_ids).token_ids


@pytest.mark.parametrize("k", [3, None])
@pytest.mark.parametrize("method", METHODS)
def test_speculation_on_cuda_equals_plain(method: str, k: int | None) -> None:
    target = make_tiny_model("qwen3", vocab_size=VOCAB).to(DEVICE)
    engine = cuda_engine(method, k, target)
    assert_equals_plain(engine, target, seed=2)
    assert engine.stats().spec.num_drafts > 0


def test_sampled_speculation_on_cuda_is_seeded() -> None:
    target = make_tiny_model("qwen3", vocab_size=VOCAB).to(DEVICE)
    outs = []
    for _ in range(2):
        engine = cuda_engine("draft", 3, target)
        engine.add_request("a", [1, 2, 3, 4], SamplingParams(max_tokens=24, temperature=0.8,
                                                             seed=7))  # fmt: skip
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens.extend(out.new_token_ids)
        outs.append(tokens)
    assert outs[0] == outs[1] and len(outs[0]) > 0


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q8_0 GGUF of a random-weight qwen2 with the tests' byte-level tokenizer."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2-Q8_0.gguf"
    return write_gguf(path, tiny_hf_model("qwen2", seed=0), "qwen2", GGMLQuantizationType.Q8_0)


def test_quantised_gguf_on_cuda_runs_its_float_weights(tiny_gguf: Path) -> None:
    if DEVICE != "cpu":  # the stored-block kernels are CPU's
        assert default_format(str(tiny_gguf), DEVICE) is None
    ids = [1, 5, 60, 99, 7, 3]
    texts, logits = [], []
    for device in ("cpu", DEVICE):
        lm = load_model(tiny_gguf, torch.float32, device)
        assert str(lm.model.device) == ("cpu" if device == "cpu" else SHOWN)
        texts.append(generate_plain(lm.model, ids, SamplingParams(max_tokens=12), ()).token_ids)
        with torch.no_grad():
            hidden = SingleSequenceCache(lm.model, 32).forward(ids)
            logits.append(lm.model.compute_logits(hidden).cpu())
    assert texts[0] == texts[1]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_engine_built_from_flags_on_cuda_equals_plain(tiny_gguf: Path) -> None:
    config = EngineConfig(
        model=ModelConfig(str(tiny_gguf), dtype="float32", device=DEVICE),
        cache=CacheConfig(block_size=4, memory_bytes=8 << 20),
        scheduler=SchedulerConfig(max_num_seqs=4),
        spec=SpecConfig(method="draft", draft_model=str(tiny_gguf), num_speculative_tokens=None),
    )
    engine = build_engine(config)
    assert engine.model_info["target_device"] == SHOWN
    assert engine.model_info["draft_device"] == SHOWN
    prompt = [1, 5, 60, 99, 7, 3]
    assert run_one(engine, prompt) == plain_tokens(engine, prompt)


@pytest.fixture
def cuda_server(tiny_gguf: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    args = ["--model", str(tiny_gguf), "--device", DEVICE, "--draft-model", str(tiny_gguf),
            "--num-speculative-tokens", "3", "--max-model-len", "96"]  # fmt: skip
    with ServerProcess(args, log_path=tmp_path / "server.log") as server:
        yield server


def test_serve_on_cuda(cuda_server: ServerProcess, tiny_gguf: Path) -> None:
    with httpx.Client(base_url=cuda_server.base_url, timeout=120) as http:
        r = http.post("/v1/completions", json={"model": str(tiny_gguf), "prompt": "abc",
                                               "max_tokens": 12, "temperature": 0})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
        metrics = http.get("/metrics").text
    assert f'target_device="{SHOWN}"' in metrics
    if DEVICE != "cpu":
        assert 'target_decode_path="eager (' in metrics


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_train_draft_on_cuda(method: str, tiny_gguf: Path, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": p}) for p in ["abc", "hello", "xyz"]) + "\n")
    out = tmp_path / "head"
    argv = ["train-draft", "--model", str(tiny_gguf), "--method", method, "--device", DEVICE,
            "--dtype", "float32", "--data", str(data), "--max-tokens", "16", "--epochs", "2",
            "--batch-tokens", "8", "--checkpoint-every", "2", "--medusa-heads", "2",
            "--draft-vocab-size", "64", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    training = json.loads((out / "training.json").read_text())
    assert training["train_state"]["steps"] > 0
    config = EngineConfig(
        model=ModelConfig(str(tiny_gguf), dtype="float32", device=DEVICE),
        cache=CacheConfig(block_size=4, memory_bytes=8 << 20),
        spec=SpecConfig(method=method, draft_model=str(out), num_speculative_tokens=3),  # type: ignore[arg-type]
    )
    engine = build_engine(config)
    prompt = [1, 5, 60, 99, 7, 3]
    assert run_one(engine, prompt) == plain_tokens(engine, prompt)
    assert engine.stats().spec.num_drafts > 0
