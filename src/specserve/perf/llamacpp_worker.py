"""llama.cpp arm of ``specserve perf``, run by the interpreter that has ``llama_cpp``.

Standalone on purpose (stdlib + ``llama_cpp`` only): ``llama-cpp-python`` usually lives in a
virtual environment of its own. The worker lives as long as the run, so that ``perf`` can
alternate llama.cpp's decodes with its own, seconds apart, instead of running them minutes
later on a host whose speed has drifted.

Input: one JSON argument ``{"gguf", "threads", "num_pred_tokens", "n_ctx" (optional)}``. The
worker answers ``{"ready": true}`` once ``llama_cpp`` imports (or ``{"error"}`` and exits),
then one JSON line on stdout per JSON line on stdin, until stdin closes:

- ``{"op": "decode", "mode": "plain" | "prompt_lookup", "prompt": ids, "max_tokens", "eos"}``:
  ``{"mode", "token_ids", "prefill_s", "decode_s"}``, greedy, from a fresh context (one
  ``Llama`` per mode, made on its first request and kept);
- ``{"op": "loglik", "ids": ids}``: ``{"loglik": mean log-probability per token of ids[1:]
  given the preceding ones}``, computed from llama.cpp's logits of the file as stored.

A request that fails is answered ``{"error"}`` and the worker exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# Run as a script, this file's folder (specserve/perf) comes first on sys.path, and its
# profile.py would shadow the standard library's (which cProfile imports).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


def _say(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main() -> int:
    args = json.loads(sys.argv[1])
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as e:
        _say({"error": f"llama_cpp is not importable here: {e}"})
        return 2
    _say({"ready": True})
    models: dict[str, Any] = {}

    def model(mode: str) -> Any:
        if mode not in models:
            kwargs = {}
            if mode == "prompt_lookup":
                kwargs["draft_model"] = LlamaPromptLookupDecoding(
                    num_pred_tokens=args["num_pred_tokens"]
                )
            elif mode != "plain":
                raise ValueError(f"unknown mode {mode!r}")
            models[mode] = Llama(
                model_path=args["gguf"],
                n_ctx=args.get("n_ctx", 2048),
                n_threads=args["threads"],
                n_threads_batch=args["threads"],
                verbose=False,
                **kwargs,
            )
        return models[mode]

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req["op"] == "decode":
                _say(_decode(model(req["mode"]), req))
            elif req["op"] == "loglik":
                _say({"loglik": _loglik(Llama, args, req["ids"])})
            else:
                raise ValueError(f"unknown op {req['op']!r}")
        except Exception as e:  # said on stdout, where the parent reads
            _say({"error": f"{type(e).__name__}: {e}"})
            return 1
    return 0


def _decode(llm: Any, req: dict[str, Any]) -> dict[str, Any]:
    eos = set(req["eos"])
    llm.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    t1 = t0
    for tok in llm.generate(req["prompt"], temp=0.0, top_k=1, top_p=1.0, reset=True):
        if not out:
            t1 = time.perf_counter()
        out.append(int(tok))
        if int(tok) in eos or len(out) >= req["max_tokens"]:
            break
    t2 = time.perf_counter()
    return {"mode": req["mode"], "token_ids": out, "prefill_s": t1 - t0, "decode_s": t2 - t1}


def _loglik(llama_class: Any, args: dict[str, Any], ids: list[int]) -> float:
    """Mean log p(ids[t] | ids[:t]) over t >= 1, from one evaluation with every row's logits."""
    import numpy as np  # a dependency of llama-cpp-python

    llm = llama_class(
        model_path=args["gguf"],
        n_ctx=max(2048, len(ids) + 8),
        n_batch=512,
        n_threads=args["threads"],
        n_threads_batch=args["threads"],
        logits_all=True,
        verbose=False,
    )
    llm.eval(ids[:-1])
    rows = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)  # [T - 1, vocab]
    peak = rows.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
    picked = rows[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    del llm
    return float((picked - log_z).mean())


if __name__ == "__main__":
    sys.exit(main())
