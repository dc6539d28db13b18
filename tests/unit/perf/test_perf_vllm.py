"""The vLLM arms of ``specserve perf`` without vLLM: flags, the rows saying why they did not
run, the child's environment, its JSON lines (from a fake interpreter through the same
subprocess path) and the ×vllm column."""

from __future__ import annotations

import ast
import stat
import sys
from pathlib import Path

import pytest

from specserve.cli import build_parser
from specserve.perf import vllm_worker, worker_arms
from specserve.perf.arms import ArmResult
from specserve.perf.report import print_table
from specserve.perf.worker_arms import run_vllm, vllm_env

PROMPTS = [[1, 2, 3], [4, 5]]


def test_vllm_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSERVE_VLLM_PYTHON", raising=False)
    args = build_parser().parse_args(["perf"])
    assert (args.vllm_python, args.vllm_model_dir, args.vllm_draft_dir) == (None, None, None)
    assert "vllm" not in args.arms.split(",")  # opt-in: vLLM starts in minutes
    vllm_flags = ["--vllm-python", "/v/bin/python", "--vllm-model-dir", "hf/t"]
    args = build_parser().parse_args(
        ["perf", "--arms", "plain,vllm", *vllm_flags, "--vllm-draft-dir", "hf/d"]
    )
    assert (args.vllm_python, args.vllm_model_dir, args.vllm_draft_dir) == (
        "/v/bin/python",
        "hf/t",
        "hf/d",
    )
    monkeypatch.setenv("SPECSERVE_VLLM_PYTHON", "/env/bin/python")
    assert build_parser().parse_args(["perf"]).vllm_python == "/env/bin/python"


def test_without_an_interpreter_or_a_model_the_rows_say_why() -> None:
    rows = run_vllm(None, "hf/t", "hf/d", PROMPTS, 4, (0,), 2, 4)
    assert [r.name for r in rows] == ["vllm bf16 plain", "vllm bf16 draft k=4"]
    assert all(r.error and "--vllm-python" in r.error for r in rows)
    rows = run_vllm(sys.executable, None, None, PROMPTS, 4, (0,), 2, 4)
    assert all(r.error and "--vllm-model-dir" in r.error for r in rows)


def test_an_interpreter_without_vllm_is_reported() -> None:
    rows = run_vllm(sys.executable, "hf/t", "hf/d", PROMPTS, 4, (0,), 2, 4)  # no vllm here
    assert [r.name for r in rows] == ["vllm bf16 plain", "vllm bf16 draft k=4"]
    for row in rows:
        assert row.error is not None and "vllm is not importable" in row.error


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands for the vLLM interpreter: runs ``body`` with ``args`` (the
    worker's JSON argument) and ``emit``."""
    script = tmp_path / "venv" / "bin" / "python"
    script.parent.mkdir(parents=True)
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "args = json.loads(sys.argv[2])\n"
        "def emit(rec): print(json.dumps(rec), flush=True)\n"
        "print('INFO vllm log line on stdout')\n" + body
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_worker_lines_become_rows(tmp_path: Path) -> None:
    python = _fake_python(
        tmp_path,
        "assert os.environ['VLLM_TARGET_DEVICE'] == 'cpu'\n"
        "assert os.environ['HF_HUB_OFFLINE'] == '1'\n"
        "assert sys.argv[1].endswith('vllm_worker.py')\n"
        "draft = args['mode'] == 'draft'\n"
        "assert (args['draft'] is not None) == draft and args['k'] == 3\n"
        "for i, ids in enumerate(args['prompts']):\n"
        "    out = [7, 8, 9, 0][: args['max_tokens']]\n"
        "    emit({'mode': args['mode'], 'token_ids': out, 'prefill_s': 0.5,\n"
        "          'decode_s': 1.5, 'num_forwards': 1 if draft else len(out) - 1})\n",
    )
    plain, draft = run_vllm(python, "hf/t", "hf/d", PROMPTS, 4, (0,), 2, 3)
    assert (plain.name, draft.name) == ("vllm bf16 plain", "vllm bf16 draft k=3")
    assert plain.error is None and draft.error is None
    assert plain.token_ids == [[7, 8, 9, 0]] * 2 and plain.prefill_s == [0.5, 0.5]
    assert plain.tok_per_s(0) == 2.0 and plain.tokens_per_forward(0) == 1.0
    assert draft.tokens_per_forward(1) == 3.0


FAKE_VLLM = """
import cProfile  # as vLLM does: the worker's folder must not shadow the standard library
from types import SimpleNamespace

print("INFO fake vllm: a log line on stdout")


class SamplingParams:
    def __init__(self, **kw):
        assert kw["temperature"] == 0.0 and not kw["ignore_eos"]
        self.__dict__.update(kw)


class LLM:
    def __init__(self, **kw):
        assert kw["dtype"] == "bfloat16" and kw["max_model_len"] == 2048
        assert not kw["enable_prefix_caching"]
        self.spec = kw.get("speculative_config")
        assert self.spec in (None, {"model": "hf/d", "num_speculative_tokens": 3})
        self.drafts = 0

    def generate(self, prompts, params, use_tqdm=True):
        (prompt,) = prompts
        n = params.max_tokens
        ids = [(sum(prompt["prompt_token_ids"]) + i) % 5 + 1 for i in range(n)]
        if self.spec:
            self.drafts += (n - 1 + 3) // 4  # each verify gives up to k + 1 tokens
        stats = SimpleNamespace(
            first_token_ts=10.0, last_token_ts=10.0 + 0.25 * (n - 1), first_token_latency=0.5
        )
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)], metrics=stats)]

    def get_metrics(self):
        return [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=self.drafts)]
"""


def test_the_worker_against_a_fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    (tmp_path / "vllm" / "inputs.py").write_text(
        "def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    plain, draft = run_vllm(sys.executable, "hf/t", "hf/d", PROMPTS, 9, (0,), 2, 3)
    assert plain.error is None and draft.error is None, (plain.error, draft.error)
    expected = [[2, 3, 4, 5, 1, 2, 3, 4, 5], [5, 1, 2, 3, 4, 5, 1, 2, 3]]
    assert plain.token_ids == draft.token_ids == expected
    assert plain.prefill_s == [0.5, 0.5] and plain.decode_s == [2.0, 2.0]
    assert plain.tok_per_s(0) == 4.0 and plain.tokens_per_forward(0) == 1.0
    assert draft.tokens_per_forward(0) == 4.0  # 8 tokens after the first in 2 verifies


def test_a_failing_worker_and_unknown_forwards(tmp_path: Path) -> None:
    python = _fake_python(
        tmp_path,
        "if args['mode'] == 'draft':\n"
        "    print('Traceback ...', file=sys.stderr)\n"
        "    print('RuntimeError: no draft on CPU', file=sys.stderr)\n"
        "    print('INFO shutting down', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        "emit({'mode': 'plain', 'token_ids': [1, 2], 'prefill_s': 0.1, 'decode_s': 0.1,\n"
        "      'num_forwards': None})\n",
    )
    plain, draft = run_vllm(python, "hf/t", "hf/d", [[1]], 2, (0,), 1, 4)
    assert plain.error is None and plain.tokens_per_forward(0) is None
    assert draft.error == "vllm_worker failed: RuntimeError: no draft on CPU"
    plain, draft = run_vllm(python, "hf/t", None, [[1]], 2, (0,), 1, 4)
    assert plain.error is None and draft.error and "--vllm-draft-dir" in draft.error


def test_vllm_env(tmp_path: Path) -> None:
    iomp = tmp_path / "venv" / "lib" / "libiomp5.so"
    iomp.parent.mkdir(parents=True)
    iomp.write_bytes(b"")
    python = str(tmp_path / "venv" / "bin" / "python")
    env = vllm_env(python, 2, {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "8"})
    assert env["PATH"] == "/bin" and env["VLLM_CPU_KVCACHE_SPACE"] == "8"
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["LD_PRELOAD"].split(":")[-1] == str(iomp)
    env = vllm_env(python, 1, {"LD_PRELOAD": "/x.so"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["LD_PRELOAD"].endswith(f"{iomp}:/x.so")


def test_the_vllm_column(capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = ArmResult("specserve bf16 plain", [[1, 2, 3]], [1.0], [0.1])
    vllm = ArmResult("vllm bf16 plain", [[1, 2, 3]], [0.5], [0.1])
    draft = ArmResult("vllm bf16 draft k=4", [[1, 2, 4]], [0.25], [0.1])
    print_table([bf16], ["p"], ["open"], 10.0, {"bf16": bf16})
    assert "tok/s ×bf16 ×llama tok/fwd same" in capsys.readouterr().out  # no vllm row: as before
    print_table([bf16, vllm, draft], ["p"], ["open"], 10.0, {"bf16": bf16})
    out = capsys.readouterr().out
    assert "tok/s ×bf16 ×llama ×vllm tok/fwd same" in out
    assert "| vllm bf16 plain | 4.0 2.00 - 1.00 - yes |" in out
    assert "| vllm bf16 draft k=4 | 8.0 4.00 - 2.00 - 67% |" in out


def test_the_worker_needs_only_the_standard_library_and_vllm() -> None:
    tree = ast.parse(Path(vllm_worker.__file__).read_text())
    modules = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names) | {"vllm"}
    assert Path(worker_arms.__file__).with_name("vllm_worker.py").is_file()
