"""The engine on a CUDA GPU with random weights of real shapes: is speculation exact there,
and what does a step cost?

No model file is needed (weights are drawn on the device, scaled like the tests' tiny models
so that most greedy choices are well separated). Two parts:

- **exactness**: an ``--exact-shape`` target decodes ``--prompts`` random prompts greedily,
  once with the one-sequence reference loop (:func:`generate_plain`) and three times
  through the batched engine: without speculation (``none``), drafting with the target
  itself as its draft model (k = 4), and with n-gram drafting (k = 4); in fp32 and bf16.
  Each row prints how many requests equal the reference loop's text (``exact``, with the
  first differing positions) and how many equal the engine's own output without
  speculation (``equal_to_engine_plain``: what a baseline server answers). On CPU the bf16
  rows are made batch invariant by the native kernels; on CUDA every op is PyTorch's, and
  cuBLAS and the attention kernels choose their algorithm by shape, so this is measured,
  not guaranteed.
- **step cost**: a Qwen2.5-1.5B-shaped bf16 target decodes one request of ``--tokens``
  tokens through the engine: plain, with a 0.5B-shaped random draft (k = 4, never
  accepted: the draft step's cost) and with itself as the draft (k = 4); it prints ms per
  step and per token.

::

    python benchmarks/cuda_check.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.builder import build_engine_from_models
from specserve.models.arch import ArchConfig
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from specserve.spec_decode.replay import common_prefix

SHAPES = {  # (hidden, intermediate, layers, heads, kv heads, vocab)
    "small": (512, 1408, 8, 8, 2, 8192),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936),
}


def random_model(shape: str, dtype: torch.dtype, device: str, seed: int) -> DecoderLM:
    h, inter, layers, heads, kv, vocab = SHAPES[shape]
    arch = ArchConfig(
        family="qwen2", vocab_size=vocab, hidden_size=h, intermediate_size=inter,
        num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=h // heads,
        rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, attention_bias=True, eos_token_ids=(vocab - 1,),
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = DecoderLM(arch)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:  # well-separated argmax, as the tests' tiny models
                p.normal_(0.0, 2.0 / p.shape[1] ** 0.5)
    return model.to(dtype).eval()


def engine_for(target: DecoderLM, method: str, k: int | None, draft: DecoderLM | None = None):  # type: ignore[no-untyped-def]
    config = EngineConfig(
        model=ModelConfig("random", device=str(target.device)),
        cache=CacheConfig(block_size=16, num_blocks=512),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048),
        spec=SpecConfig(
            method=method,  # type: ignore[arg-type]
            num_speculative_tokens=k,
            draft_model="random-draft" if draft is not None else None,
        ),
    )
    return build_engine_from_models(config, target, draft=draft)


def run_engine(engine, prompts: dict[str, list[int]], max_tokens: int) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens))
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return out


def equal(a: dict[str, list[int]], b: dict[str, list[int]]) -> int:
    return sum(a[r] == b[r] for r in a)


def exactness(device: str, shape: str, n: int, max_tokens: int) -> list[dict[str, object]]:
    rows = []
    rng = random.Random(0)
    for dtype in (torch.float32, torch.bfloat16):
        target = random_model(shape, dtype, device, seed=0)
        vocab = target.cfg.vocab_size
        prompts = {f"r{i}": [rng.randrange(vocab - 1) for _ in range(rng.randint(8, 64))]
                   for i in range(n)}  # fmt: skip
        plain = {
            rid: generate_plain(target, ids, SamplingParams(max_tokens=max_tokens), ()).token_ids
            for rid, ids in prompts.items()
        }
        engine_plain: dict[str, list[int]] = {}
        for method, k, draft in (("none", None, None), ("draft", 4, target), ("ngram", 4, None)):
            got = run_engine(engine_for(target, method, k, draft), prompts, max_tokens)
            engine_plain = engine_plain or got
            firsts = [common_prefix(got[r], plain[r]) for r in prompts if got[r] != plain[r]]
            same = equal(got, plain)
            label = method if k is None else f"{method} k={k}"
            row = {"dtype": str(dtype).removeprefix("torch."), "method": label,
                   "exact": f"{same}/{n}",
                   "equal_to_engine_plain": f"{equal(got, engine_plain)}/{n}",
                   "first_differences": sorted(firsts)}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def step_cost(device: str, tokens: int) -> list[dict[str, object]]:
    target = random_model("qwen2.5-1.5b", torch.bfloat16, device, seed=0)
    draft = random_model("qwen2.5-0.5b", torch.bfloat16, device, seed=1)
    prompt = {"r": list(range(100, 164))}
    rows = []
    for label, method, k, d in (("plain", "none", None, None), ("draft k=4", "draft", 4, draft),
                                ("self-draft k=4", "draft", 4, target)):  # fmt: skip
        engine = engine_for(target, method, k, d)
        run_engine(engine, prompt, 8)  # warm-up (allocator, kernels)
        engine = engine_for(target, method, k, d)
        steps: list[float] = []
        engine.add_request("r", prompt["r"], SamplingParams(max_tokens=tokens, ignore_eos=True))
        produced = 0
        engine.step()  # prefill
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda _: None)
        while engine.has_unfinished_requests():
            sync(device)
            t0 = time.perf_counter()
            outs = engine.step()
            sync(device)
            steps.append(time.perf_counter() - t0)
            produced += sum(len(o.new_token_ids) for o in outs)
        ms = 1e3 * sum(steps) / len(steps)
        row = {"arm": label, "steps": len(steps), "tokens": produced,
               "ms_per_step": round(ms, 2), "tokens_per_step": round(produced / len(steps), 2),
               "ms_per_token": round(1e3 * sum(steps) / produced, 2)}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--exact-shape", choices=list(SHAPES), default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128, help="tokens of the step-cost request")
    ap.add_argument("--skip-step-cost", action="store_true")
    ap.add_argument("--output", help="write both tables as JSON here")
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        print(json.dumps({"gpu": torch.cuda.get_device_name(args.device),
                          "torch": torch.__version__}))  # fmt: skip
    result = {"exactness": exactness(args.device, args.exact_shape, args.prompts, args.max_tokens)}
    if not args.skip_step_cost:
        result["step_cost"] = step_cost(args.device, args.tokens)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
