"""Convert a GGUF file into a bf16 Hugging Face directory, for the vLLM arms of
``specserve perf`` (``--vllm-model-dir``, ``--vllm-draft-dir``): vLLM then runs the weights
that specserve and llama.cpp load from the same GGUF file (dequantised to bf16).

Run it with the vLLM environment's interpreter (it needs ``torch``, ``transformers``, ``gguf``
and ``accelerate``), once per model::

    $VLLM_PYTHON benchmarks/gguf_to_hf.py \\
        "$SPECSERVE_CACHE_DIR/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" hf/qwen-1.5b

transformers loads the GGUF file dequantised; its quantizer and ``quantization_config`` are
dropped before ``save_pretrained``, which refuses a GGUF-loaded model otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path, help="the GGUF file specserve loads (--target/--draft)")
    p.add_argument("out", type=Path, help="directory to write (config, safetensors, tokenizer)")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(args.gguf.parent), args.gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
