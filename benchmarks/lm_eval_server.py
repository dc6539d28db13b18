"""lm-eval against ``specserve serve``, offline: a plain and a speculative arm, side by side.

Starts the server once per arm, points lm-eval's ``local-completions`` model at it and runs
three small tasks whose data ship in ``benchmarks/lm_eval/``:

- ``specserve_mc``: 20 multiple-choice questions, scored by loglikelihood. Each choice is one
  request with ``echo: true, logprobs: 1, max_tokens: 1`` and the prompt as token ids, so
  this exercises prompt logprobs (``acc``, ``acc_norm``).
- ``specserve_arith``: 10 one-line sums, ``generate_until`` (greedy), the first number in the
  answer compared exactly (``exact_match``).
- ``specserve_copy``: 10 "repeat this sentence" prompts, ``generate_until``: the answer copies
  the prompt, so n-gram drafts are accepted and the speculative arm really speculates.

lm-eval tokenises on the client, so the script writes the served model's tokenizer as a
Hugging Face tokenizer directory first; nothing is fetched from a hub (``HF_*_OFFLINE=1``).
Needs ``pip install lm-eval`` (0.4.x) next to specserve.

Usage::

    python benchmarks/lm_eval_server.py [--model smollm2-135m-instruct] [--output DIR]

Prints one table (task, metric, plain, speculative) and whether every per-sample response
(loglikelihoods and generations) is the same in both arms; writes lm-eval's own results
under ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from specserve.loading.loader import load_tokenizer
from specserve.server.launcher import ServerProcess

DATA = Path(__file__).resolve().parent / "lm_eval"
TASKS = ("specserve_mc", "specserve_arith", "specserve_copy")
SPECULATIVE = (
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, '
    '"prompt_lookup_max": 3}'
)
ARMS = {"plain": [], "speculative": ["--speculative-config", SPECULATIVE]}
MAX_LEN = 2048

TASK_YAML = {
    "specserve_mc": """
task: specserve_mc
dataset_path: json
dataset_kwargs:
  data_files: {{test: "{data}/mc.jsonl"}}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
""",
    "specserve_arith": """
task: specserve_arith
dataset_path: json
dataset_kwargs:
  data_files: {{test: "{data}/arith.jsonl"}}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs: {{until: ["\\n"], max_gen_toks: 16, do_sample: false, temperature: 0}}
filter_list:
  - name: first_number
    filter:
      - {{function: regex, regex_pattern: "(-?[0-9]+)", group_select: 0}}
      - {{function: take_first}}
metric_list:
  - metric: exact_match
""",
    "specserve_copy": """
task: specserve_copy
dataset_path: json
dataset_kwargs:
  data_files: {{test: "{data}/copy.jsonl"}}
test_split: test
output_type: generate_until
doc_to_text: "Repeat the sentence exactly.\\nSentence: {{{{text}}}}\\nRepeat:"
doc_to_target: "{{{{text}}}}"
generation_kwargs: {{until: ["\\n"], max_gen_toks: 32, do_sample: false, temperature: 0}}
filter_list:
  - name: stripped
    filter:
      - {{function: remove_whitespace}}
      - {{function: take_first}}
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""",
}


def write_hf_tokenizer(model: str, directory: Path) -> None:
    """The served model's tokenizer as a directory ``AutoTokenizer`` loads offline."""
    tok = load_tokenizer(model)
    directory.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(directory / "tokenizer.json"))

    def name(token_id: int | None) -> str | None:
        return None if token_id is None else tok.id_to_token(token_id)

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(tok.bos_token_id),
        "eos_token": name(tok.eos_token_id),
        "model_max_length": MAX_LEN,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def lm_eval_command() -> list[str]:
    exe = Path(sys.executable).with_name("lm-eval")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "lm_eval"]


def run_arm(arm: str, model: str, work: Path, output: Path) -> dict[str, Any]:
    """Serve ``model`` with the arm's flags, run lm-eval against it, return its results."""
    server_args = ["--model", model, "--dtype", "float32", "--max-model-len", str(MAX_LEN)]
    log = output / f"server-{arm}.log"
    with ServerProcess([*server_args, *ARMS[arm]], log_path=log, name=arm) as server:
        model_args = ",".join(
            [
                f"model={model}",
                f"base_url={server.base_url}/v1/completions",
                f"tokenizer={work / 'tokenizer'}",
                "tokenizer_backend=huggingface",
                "tokenized_requests=True",
                "num_concurrent=1",
                "max_retries=1",
                f"max_length={MAX_LEN}",
            ]
        )
        cmd = [
            *lm_eval_command(), "run", "--model", "local-completions",
            "--model_args", model_args, "--tasks", ",".join(TASKS),
            "--include_path", str(work / "tasks"), "--output_path", str(output / arm),
            "--log_samples", "--seed", "0",
        ]  # fmt: skip
        offline = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
        env = {**os.environ, **dict.fromkeys(offline, "1")}
        env["HF_DATASETS_CACHE"] = str(work / "datasets")
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        wall_s = time.perf_counter() - t0
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    (results,) = sorted((output / arm).rglob("results_*.json"))[-1:]
    samples = {
        task: [
            json.loads(line)
            for path in sorted((output / arm).rglob(f"samples_{task}_*.jsonl"))[-1:]
            for line in path.read_text().splitlines()
        ]
        for task in TASKS
    }
    return {
        "results": json.loads(results.read_text())["results"],
        "samples": samples,
        "wall_s": wall_s,
        "drafted": counter(metrics, "vllm:spec_decode_num_draft_tokens_total"),
        "accepted": counter(metrics, "vllm:spec_decode_num_accepted_tokens_total"),
    }


def counter(exposition: str, name: str) -> float:
    """Sum of a counter's samples in a Prometheus exposition (0 when absent)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--output", type=Path, default=Path("results/lm-eval"))
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specserve-lm-eval-"))
    try:
        write_hf_tokenizer(args.model, work / "tokenizer")
        (work / "tasks").mkdir()
        for task, text in TASK_YAML.items():
            (work / "tasks" / f"{task}.yaml").write_text(text.format(data=DATA))
        arms = {arm: run_arm(arm, args.model, work, args.output) for arm in ARMS}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n| task | metric | {' | '.join(ARMS)} |\n|---|---|" + "---|" * len(ARMS))
    for task in TASKS:
        for metric, value in arms["plain"]["results"][task].items():
            if isinstance(value, float) and "stderr" not in metric:
                row = [f"{arms[a]['results'][task][metric]:.3f}" for a in ARMS]
                print(f"| {task} | {metric} | {' | '.join(row)} |")
    same = all(
        [s["resps"] for s in arms["plain"]["samples"][task]]
        == [s["resps"] for s in arms["speculative"]["samples"][task]]
        for task in TASKS
    )
    for arm, got in arms.items():
        print(
            f"{arm}: lm-eval wall time {got['wall_s']:.0f} s, draft tokens {got['drafted']:.0f}, "
            f"accepted {got['accepted']:.0f}"
        )
    print(f"per-sample responses identical in both arms: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
