"""llama.cpp arm of ``specserve perf``, run by the interpreter that has ``llama_cpp``.

Standalone on purpose (stdlib + ``llama_cpp`` only): ``llama-cpp-python`` usually lives in a
virtual environment of its own. Input: one JSON argument ``{"gguf", "prompts" (token id
lists), "max_tokens", "threads", "modes", "num_pred_tokens", "eos", "loglik_ids" (optional: a
token id list)}``. Output: one JSON line per (mode, prompt) on stdout with the generated ids
and timings, and with ``loglik_ids`` one line ``{"loglik": mean log-probability per token of
ids[1:] given the preceding ones}``, computed from llama.cpp's logits of the file as stored.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Run as a script, this file's folder (specserve/perf) comes first on sys.path, and its
# profile.py would shadow the standard library's (which cProfile imports).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


def main() -> int:
    args = json.loads(sys.argv[1])
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as e:
        print(json.dumps({"error": f"llama_cpp is not importable here: {e}"}), flush=True)
        return 2
    eos = set(args["eos"])
    if args.get("loglik_ids"):
        print(json.dumps({"loglik": _loglik(Llama, args)}), flush=True)
    for mode in args["modes"]:
        kwargs = {}
        if mode == "prompt_lookup":
            kwargs["draft_model"] = LlamaPromptLookupDecoding(
                num_pred_tokens=args["num_pred_tokens"]
            )
        llm = Llama(
            model_path=args["gguf"],
            n_ctx=args.get("n_ctx", 2048),
            n_threads=args["threads"],
            n_threads_batch=args["threads"],
            verbose=False,
            **kwargs,
        )
        for prompt in args["prompts"]:
            llm.reset()
            out: list[int] = []
            t0 = time.perf_counter()
            t1 = t0
            for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, reset=True):
                if not out:
                    t1 = time.perf_counter()
                out.append(int(tok))
                if int(tok) in eos or len(out) >= args["max_tokens"]:
                    break
            t2 = time.perf_counter()
            print(
                json.dumps(
                    {"mode": mode, "token_ids": out, "prefill_s": t1 - t0, "decode_s": t2 - t1}
                ),
                flush=True,
            )
        del llm
    return 0


def _loglik(llama_class, args) -> float:  # type: ignore[no-untyped-def]
    """Mean log p(ids[t] | ids[:t]) over t >= 1, from one evaluation with every row's logits."""
    import numpy as np  # a dependency of llama-cpp-python

    ids = args["loglik_ids"]
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
