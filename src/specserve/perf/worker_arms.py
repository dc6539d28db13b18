"""The arms of ``specserve perf`` that run in a child process of another interpreter:
llama.cpp (``llamacpp_worker.py``) and vLLM (``vllm_worker.py``), each usually installed in a
virtual environment of its own. The llama.cpp worker lives as long as the run and decodes one
prompt per request, so that its arms alternate with ours (:class:`WorkerProcess`); a vLLM
worker takes one JSON argument and prints one JSON line per prompt (or one ``{"error"}``
line). An arm that cannot run is returned with the reason, printed in its row.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from specserve.perf.arms import ArmFailed, ArmResult, InProcessArm, run_interleaved
from specserve.spec_decode.plain_loop import GenerationResult

logger = logging.getLogger(__name__)

LLAMA_MODES = ("plain", "prompt_lookup")


def _why_failed(label: str, returncode: int | None, stderr: str) -> str:
    """A dead worker's reason: the last exception line on its stderr, else its last line,
    else its exit status, after ``label`` (``vllm_worker``, ``llama.cpp worker``)."""
    lines = stderr.strip().splitlines()
    # The exception's line: vLLM logs its shutdown after it.
    raised = [line for line in lines if re.match(r"\w+(Error|Exception)\b", line)]
    why = (raised or lines or [f"exit {returncode}"])[-1]
    return f"{label} failed: {why}"


def _run_worker(
    python: str, worker: str, args: Mapping[str, object], env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Run ``python worker JSON`` (a ``*_worker.py`` next to this module) and read its JSON
    lines from stdout: the records, and why it failed (its ``error`` record, else
    :func:`_why_failed`), None when it did not. Other stdout lines are ignored."""
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
        return records, _why_failed(worker.removesuffix(".py"), proc.returncode, proc.stderr)
    return records, None


class WorkerProcess:
    """``python worker JSON`` kept alive: :meth:`request` writes one JSON line to its stdin
    and reads one back. Its stderr goes to a temporary file (read when it dies), so that a
    chatty library cannot fill a pipe and stall it.

    Raises (constructor and :meth:`request`):
        ArmFailed: the worker could not start, answered ``{"error"}``, died, or took longer
            than ``timeout_s`` for one answer (it is then killed).
    """

    def __init__(
        self,
        python: str,
        worker: str,
        args: Mapping[str, object],
        label: str,
        timeout_s: float = 900.0,
    ) -> None:
        self.label, self.timeout_s = label, timeout_s
        self._why: str | None = None  # why it died, for every later request
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        self._buf = b""
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [python, str(Path(__file__).with_name(worker)), json.dumps(args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
        except OSError as e:
            self.proc = None
            self._stderr.close()
            raise ArmFailed(f"{python}: {e}") from e
        self._read()  # {"ready": true}

    def request(self, req: Mapping[str, object]) -> dict[str, Any]:
        if self.proc is None:
            raise ArmFailed(self._why or f"{self.label} is not running")
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # it died: _read says why
            pass
        return self._read()

    def _read(self) -> dict[str, Any]:
        """The next JSON line of the worker (other stdout lines are skipped)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\n" not in self._buf:
                ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
                chunk = os.read(fd, 1 << 16) if ready else None
                if not chunk:
                    self._fail(None if chunk is not None else f"no answer in {self.timeout_s:g} s")
                self._buf += chunk
            line, _, self._buf = self._buf.partition(b"\n")
            if not line.startswith(b"{"):
                continue
            try:
                rec: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "error" in rec:
                self._fail(str(rec["error"]))
            return rec

    def _fail(self, why: str | None) -> NoReturn:
        """Stop the worker and raise with ``why``, else with what its stderr says."""
        assert self.proc is not None
        self.proc.kill()
        code = self.proc.wait()
        self.proc = None
        self._stderr.seek(0)
        stderr = self._stderr.read()
        self._stderr.close()
        self._why = why or _why_failed(self.label, code, stderr)
        raise ArmFailed(self._why)

    def close(self) -> None:
        """Close its stdin (it exits) and wait for it."""
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        self._stderr.close()


def llamacpp_names(gguf: Path) -> list[str]:
    """Row labels of the llama.cpp arms: ``llama.cpp q4_k_m plain`` and ``... prompt_lookup``."""
    return [f"llama.cpp {gguf.name.split('-')[-1][:-5]} {m}" for m in LLAMA_MODES]


def start_llamacpp(
    python: str, gguf: Path, threads: int, num_pred_tokens: int = 10
) -> WorkerProcess:
    """A llama.cpp worker of ``python`` for ``gguf``.

    Raises:
        ArmFailed: it cannot run (no ``llama_cpp`` there, the interpreter missing, ...).
    """
    args = {"gguf": str(gguf), "threads": threads, "num_pred_tokens": num_pred_tokens}
    return WorkerProcess(python, "llamacpp_worker.py", args, "llama.cpp worker")


def llamacpp_arms(
    worker: WorkerProcess, gguf: Path, max_tokens: int, eos: tuple[int, ...]
) -> list[InProcessArm]:
    """llama.cpp plain and prompt-lookup arms that ``run_interleaved`` can alternate with
    ours (the plain row's bytes per token are counted after the rounds, ``count_bytes``:
    reading the file's header takes half a GiB for a while, which must not count in the
    peak RSS ``perf`` prints after decoding)."""

    def arm(mode: str, name: str) -> InProcessArm:
        def run(i: int, ids: list[int]) -> GenerationResult:
            del i
            req = {"op": "decode", "mode": mode, "prompt": ids, "max_tokens": max_tokens}
            rec = worker.request({**req, "eos": list(eos)})
            out = [int(t) for t in rec["token_ids"]]
            finish = "stop" if out and out[-1] in eos else "length"
            return GenerationResult(out, finish, len(ids), rec["prefill_s"], rec["decode_s"])

        return InProcessArm(name, run)

    return [arm(m, n) for m, n in zip(LLAMA_MODES, llamacpp_names(gguf), strict=True)]


def count_bytes(rows: list[ArmResult], gguf: Path) -> None:
    """Set the bytes per token of the measured llama.cpp plain row among ``rows``."""
    plain = llamacpp_names(gguf)[0]
    for row in rows:
        if row.name == plain and not row.error:
            row.bytes_per_token = gguf_decode_bytes(gguf)


def llamacpp_loglik(worker: WorkerProcess, ids: list[int], loglik: dict[str, float]) -> None:
    """llama.cpp's mean log-likelihood of ``ids`` into ``loglik["llama.cpp"]`` (logged, not
    raised, when the worker cannot give it)."""
    try:
        loglik["llama.cpp"] = float(worker.request({"op": "loglik", "ids": ids})["loglik"])
    except ArmFailed as e:
        logger.warning("llama.cpp log-likelihood: %s", e)


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
    rounds: int = 1,
) -> list[ArmResult]:
    """llama.cpp plain and prompt-lookup arms on their own (``rounds`` alternated rounds),
    for a run where no specserve arm reads the same file; with ``loglik_ids``, also the mean
    log-likelihood of those tokens, stored in ``loglik["llama.cpp"]``."""
    try:
        worker = start_llamacpp(python, gguf, threads, num_pred_tokens)
    except ArmFailed as e:
        return [ArmResult(n, error=str(e)) for n in llamacpp_names(gguf)]
    try:
        arms = run_interleaved(llamacpp_arms(worker, gguf, max_tokens, eos), prompts, rounds)
        if loglik_ids and loglik is not None:
            llamacpp_loglik(worker, loglik_ids, loglik)
        count_bytes(arms, gguf)
        return arms
    finally:
        worker.close()


def _add_record(arm: ArmResult, rec: dict[str, Any]) -> None:
    arm.token_ids.append(rec["token_ids"])
    arm.prefill_s.append(rec["prefill_s"])
    arm.decode_s.append(rec["decode_s"])
    if arm.num_forwards is not None:  # one unknown count makes the arm's unknown
        forwards = rec.get("num_forwards")
        arm.num_forwards = None if forwards is None else [*arm.num_forwards, int(forwards)]


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
