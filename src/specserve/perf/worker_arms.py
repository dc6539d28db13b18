"""The arms of ``specserve perf`` that run in a child process of another interpreter:
llama.cpp (``llamacpp_worker.py``) and vLLM (``vllm_worker.py``), each usually installed in a
virtual environment of its own. A worker takes one JSON argument and prints one JSON line per
(mode, prompt) on stdout (or one ``{"error"}`` line); an arm that cannot run is returned with
the reason, printed in its row.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specserve.perf.arms import ArmResult

logger = logging.getLogger(__name__)


def _run_worker(
    python: str, worker: str, args: Mapping[str, object], env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Run ``python worker JSON`` (a ``*_worker.py`` next to this module) and read its JSON
    lines from stdout: the records, and why it failed (its ``error`` record, else the last
    exception line or last line on stderr, else its exit status), None when it did not.
    Other stdout lines are ignored."""
    script = Path(__file__).with_name(worker)
    try:
        proc = subprocess.run(
            [python, str(script), json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"{python}: {e}"
    records: list[dict[str, Any]] = []
    for line in proc.stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "error" in rec:
            return records, str(rec["error"])
        records.append(rec)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        # The exception's line: vLLM logs its shutdown after it.
        raised = [line for line in lines if re.match(r"\w+(Error|Exception)\b", line)]
        why = (raised or lines or [f"exit {proc.returncode}"])[-1]
        return records, f"{worker.removesuffix('.py')} failed: {why}"
    return records, None


def _add_record(arm: ArmResult, rec: dict[str, Any]) -> None:
    arm.token_ids.append(rec["token_ids"])
    arm.prefill_s.append(rec["prefill_s"])
    arm.decode_s.append(rec["decode_s"])
    if arm.num_forwards is not None:  # one unknown count makes the arm's unknown
        forwards = rec.get("num_forwards")
        arm.num_forwards = None if forwards is None else [*arm.num_forwards, int(forwards)]


def run_llamacpp(
    python: str,
    gguf: Path,
    prompts: list[list[int]],
    max_tokens: int,
    eos: tuple[int, ...],
    threads: int,
    num_pred_tokens: int = 10,
    loglik_ids: list[int] | None = None,
    loglik: dict[str, float] | None = None,
) -> list[ArmResult]:
    """llama.cpp plain and prompt-lookup arms, in a child process of ``python``; with
    ``loglik_ids``, also the mean log-likelihood of those tokens, stored in
    ``loglik["llama.cpp"]``."""
    modes = ["plain", "prompt_lookup"]
    arms = {m: ArmResult(f"llama.cpp {gguf.name.split('-')[-1][:-5]} {m}") for m in modes}
    args = {
        "gguf": str(gguf),
        "prompts": prompts,
        "max_tokens": max_tokens,
        "threads": threads,
        "modes": modes,
        "num_pred_tokens": num_pred_tokens,
        "eos": list(eos),
        "loglik_ids": loglik_ids or [],
    }
    records, error = _run_worker(python, "llamacpp_worker.py", args)
    if error is not None:
        if error.startswith("llamacpp_worker failed"):
            error = error.replace("llamacpp_worker", "llama.cpp worker", 1)
        return [ArmResult(a.name, error=error) for a in arms.values()]
    for rec in records:
        if "loglik" in rec:
            if loglik is not None:
                loglik["llama.cpp"] = float(rec["loglik"])
            continue
        _add_record(arms[rec["mode"]], rec)
    arms["plain"].bytes_per_token = gguf_decode_bytes(gguf)
    return list(arms.values())


def gguf_decode_bytes(path: Path) -> int | None:
    """Bytes of a GGUF file's tensors that a plain decode step reads: all of them but the
    token embedding, of which a step reads one row, unless the file has no ``output.weight``
    (the embedding is then the LM head too, read whole). None: not a readable GGUF file."""
    from gguf import GGUFReader

    try:
        tensors = GGUFReader(str(path)).tensors
    except Exception as e:  # the reader raises what a truncated file makes it raise
        logger.warning("%s: cannot read its tensors (%s); no bytes per token", path, e)
        return None
    total = sum(int(t.n_bytes) for t in tensors)
    if any(t.name == "output.weight" for t in tensors):
        total -= sum(int(t.n_bytes) for t in tensors if t.name == "token_embd.weight")
    return total


def vllm_env(python: str, threads: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a vLLM CPU child of ``python``: ``environ`` plus the CPU backend's
    settings (those already in ``environ`` win) and ``LD_PRELOAD`` of tcmalloc (Debian
    ``libtcmalloc-minimal4``) and of the ``libiomp5.so`` that ``intel-openmp`` installs into
    ``python``'s environment, where present (vLLM CPU runs faster with both)."""
    env = dict(environ)
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}" if threads > 1 else "0")
    env["HF_HUB_OFFLINE"] = "1"
    prefix = Path(shutil.which(python) or python).absolute().parent.parent  # venv/bin/python
    found = [
        next(iter(sorted(glob.glob(pattern, recursive=True))), None)
        for pattern in ("/usr/lib*/*/libtcmalloc_minimal.so.4", f"{prefix}/lib*/**/libiomp5.so")
    ]
    preload = [p for p in found if p and p not in env.get("LD_PRELOAD", "")]
    if preload:
        env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [env.get("LD_PRELOAD")])])
    return env


def run_vllm(
    python: str | None,
    model_dir: str | None,
    draft_dir: str | None,
    prompts: list[list[int]],
    max_tokens: int,
    eos: tuple[int, ...],
    threads: int,
    k: int,
) -> list[ArmResult]:
    """vLLM plain and draft-model arms (bf16 Hugging Face directories), one child process of
    ``python`` per mode (``vllm_worker.py``); rows saying why where they cannot run."""
    names = {"plain": "vllm bf16 plain", "draft": f"vllm bf16 draft k={k}"}
    if not python:
        why = "no --vllm-python (env SPECSERVE_VLLM_PYTHON): an interpreter with vllm"
        return [ArmResult(n, error=why) for n in names.values()]
    if not model_dir:
        why = "no --vllm-model-dir (bf16 Hugging Face dir converted from the target's GGUF)"
        return [ArmResult(n, error=why) for n in names.values()]
    env = vllm_env(python, threads, os.environ)
    arms = []
    for mode, name in names.items():
        if mode == "draft" and not draft_dir:
            why = "no --vllm-draft-dir (bf16 Hugging Face dir converted from the draft's GGUF)"
            arms.append(ArmResult(name, error=why))
            continue
        args = {
            "mode": mode,
            "model": model_dir,
            "draft": draft_dir if mode == "draft" else None,
            "k": k,
            "prompts": prompts,
            "max_tokens": max_tokens,
            "eos": list(eos),
            "max_model_len": 2048,
        }
        records, error = _run_worker(python, "vllm_worker.py", args, env)
        arm = ArmResult(name, num_forwards=[], error=error)
        for rec in records if error is None else []:
            _add_record(arm, rec)
        arms.append(arm)
        if error is not None and "not importable" in error:  # the same for every mode
            arms += [ArmResult(n, error=error) for n in names.values() if n != name]
            break
    return arms
