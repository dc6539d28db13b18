"""The llama.cpp worker of ``specserve perf`` kept alive for the run: its arms alternate with
ours round by round, one ``Llama`` per mode, and a worker that dies or hangs becomes a row
that says why while the other arms go on; its log-likelihood comes from llama.cpp's logits.
Fake ``llama_cpp`` packages stand in for the library (the project's environment does not
install it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from specserve.perf import arms
from specserve.perf.arms import ArmFailed, ArmResult
from specserve.perf.report import print_paired_ratios
from specserve.perf.worker_arms import (
    WorkerProcess,
    count_bytes,
    llamacpp_arms,
    llamacpp_loglik,
    run_llamacpp,
    start_llamacpp,
)
from specserve.spec_decode.plain_loop import GenerationResult

_FAKE = '''
import os, sys, time

LOG = os.environ["FAKE_LLAMA_LOG"]
DECODES = []


def _log(line):
    with open(LOG, "a") as f:
        f.write(line + "\\n")


class Llama:
    """Generates prompt[-1] + 1, + 2, ...; logs each construction and decode."""

    def __init__(self, **kwargs):
        self.draft = "draft_model" in kwargs
        self.scores = [[0.0, 0.0]] * 8
        _log(f"init {'lookup' if self.draft else 'plain'}")

    def reset(self):
        pass

    def eval(self, ids):
        pass

    def generate(self, prompt, **kwargs):
        DECODES.append(1)
        if len(DECODES) > int(os.environ.get("FAKE_LLAMA_DIE_AFTER", "1000")):
            print("RuntimeError: the fake died", file=sys.stderr, flush=True)
            os._exit(3)
        if os.environ.get("FAKE_LLAMA_HANG"):
            time.sleep(60)
        _log(f"decode {'lookup' if self.draft else 'plain'} {prompt[-1]}")
        token = prompt[-1] + 1
        while True:
            yield token
            token += 1
'''


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """A fake ``llama_cpp`` package of ``source`` on the worker's path."""
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(source)
    (package / "llama_speculative.py").write_text(
        "class LlamaPromptLookupDecoding:\n    def __init__(self, **kw):\n        pass\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))


@pytest.fixture
def fake_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The logging fake on the worker's path; returns its log file."""
    _install(tmp_path, monkeypatch, _FAKE)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    return log


def _gguf(tmp_path: Path) -> Path:
    """A small real GGUF file (the fake library does not read it; ``count_bytes`` does)."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "model-q4_k_m.gguf"
    if not path.exists():
        w = GGUFWriter(str(path), "llama")
        w.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
        w.add_tensor("output.weight", np.zeros((64, 32), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def _worker(tmp_path: Path, **kwargs: float) -> WorkerProcess:
    worker = start_llamacpp(sys.executable, _gguf(tmp_path), 1)
    assert isinstance(worker, WorkerProcess), worker
    if kwargs:
        worker.timeout_s = kwargs["timeout_s"]
    return worker


def test_llama_cpp_arms_alternate_with_ours_in_one_worker(tmp_path: Path, fake_llama: Path) -> None:
    worker = _worker(tmp_path)
    plain, lookup = llamacpp_arms(worker, _gguf(tmp_path), 3, (99,))

    def ours(i: int, ids: list[int]) -> GenerationResult:
        with fake_llama.open("a") as f:
            f.write(f"ours {ids[-1]}\n")
        return GenerationResult([1, 2, 3], "length", len(ids), 0.01, 0.02)

    out = arms.run_interleaved([arms.InProcessArm("ours", ours), plain, lookup], [[7], [20]], 2)
    assert [a.name for a in out] == [
        "ours",
        "llama.cpp q4_k_m plain",
        "llama.cpp q4_k_m prompt_lookup",
    ]
    assert out[1].token_ids == [[8, 9, 10], [21, 22, 23]] == out[2].token_ids
    assert all(len(r) == 2 for a in out for r in a.round_tok_per_s)
    assert all(a.bytes_per_token is None for a in out)  # counted after the rounds:
    count_bytes(out, _gguf(tmp_path))
    assert [a.bytes_per_token for a in out] == [None, 64 * 32 * 4, None]  # the head only
    loglik: dict[str, float] = {}
    llamacpp_loglik(worker, [0, 1, 1], loglik)
    assert loglik["llama.cpp"] == pytest.approx(-0.6931471805599453)  # two equal logits
    proc = worker.proc
    worker.close()
    assert proc is not None and proc.returncode == 0
    calls = fake_llama.read_text().splitlines()
    # one Llama per mode, made on its first request and kept for the rounds; the arms of a
    # prompt back to back, in reverse order in the second round
    assert calls == [
        "ours 7", "init plain", "decode plain 7", "init lookup", "decode lookup 7",
        "ours 20", "decode plain 20", "decode lookup 20",
        "decode lookup 7", "decode plain 7", "ours 7",
        "decode lookup 20", "decode plain 20", "ours 20",
        "init plain",  # the log-likelihood's own Llama (all rows' logits)
    ]  # fmt: skip


def test_a_worker_that_dies_leaves_rows_that_say_why(
    tmp_path: Path, fake_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DIE_AFTER", "1")
    worker = _worker(tmp_path)
    ran: list[int] = []

    def ours(i: int, ids: list[int]) -> GenerationResult:
        ran.append(i)
        return GenerationResult([1, 2], "length", len(ids), 0.01, 0.02)

    llama = llamacpp_arms(worker, _gguf(tmp_path), 3, (99,))
    out = arms.run_interleaved([arms.InProcessArm("ours", ours), *llama], [[7], [8]], 2)
    why = "llama.cpp worker failed: RuntimeError: the fake died"
    assert out[1].error == why and out[2].error == why  # the second arm: the same reason
    assert out[0].error is None and len(ran) == 4  # ours went on through both rounds
    loglik: dict[str, float] = {}
    llamacpp_loglik(worker, [0, 1], loglik)  # logged, not raised
    assert loglik == {}
    worker.close()


def test_a_worker_that_does_not_answer_is_stopped(
    tmp_path: Path, fake_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_HANG", "1")
    worker = _worker(tmp_path, timeout_s=1.0)
    proc = worker.proc
    with pytest.raises(ArmFailed, match="no answer in 1 s"):
        worker.request({"op": "decode", "mode": "plain", "prompt": [1], "max_tokens": 2, "eos": []})
    assert proc is not None and proc.returncode is not None  # killed, not left running
    with pytest.raises(ArmFailed, match="no answer in 1 s"):  # later requests say why too
        worker.request({"op": "loglik", "ids": [1, 2]})
    worker.close()


def test_an_unknown_mode_is_an_error_of_the_request(tmp_path: Path, fake_llama: Path) -> None:
    worker = _worker(tmp_path)
    with pytest.raises(ArmFailed, match="unknown mode 'beam'"):
        worker.request({"op": "decode", "mode": "beam", "prompt": [1], "max_tokens": 2, "eos": []})
    worker.close()


def test_paired_ratios_against_llama_cpp_only_within_its_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def row(name: str, group: str, speeds: list[float]) -> ArmResult:
        arm = ArmResult(name, group=group, round_tok_per_s=[speeds])
        arm.token_ids, arm.decode_s, arm.prefill_s = [[1, 2]], [1.0], [0.1]
        return arm

    gguf_plain = row("specserve gguf plain", "gguf", [30.0, 33.0, 36.0])
    llama = row("llama.cpp q4_k_m plain", "gguf", [30.0, 30.0, 30.0])
    bf16_plain = row("specserve bf16 plain", "bf16", [10.0, 10.0, 10.0])
    results = [bf16_plain, gguf_plain, llama]
    print_paired_ratios(results, ["p"], {"bf16": bf16_plain, "gguf": gguf_plain})
    out = capsys.readouterr().out
    against_llama = out.split("× llama.cpp plain")[1]
    # round by round 30/30, 33/30, 36/30: median 1.1
    assert "| specserve gguf plain | 1.10 |" in against_llama
    assert "bf16" not in against_llama  # it ran at other times: no pairing
    # llama.cpp against our plain in the table of its group: 30/30, 30/33, 30/36 -> 0.91
    assert "| llama.cpp q4_k_m plain | 0.91 |" in out.split("× llama.cpp plain")[0]


_FAKE_LLAMA_CPP = '''
import numpy as np

VOCAB = 7


class Llama:
    """Logits row t = t-th of a fixed random table; generates 3, 4, 5, ..."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.scores = np.random.default_rng(0).normal(size=(64, VOCAB)).astype(np.float32)

    def eval(self, ids):
        self.evaluated = list(ids)

    def reset(self):
        pass

    def generate(self, prompt, **kwargs):
        token = 3
        while True:
            yield token
            token += 1
'''


def test_llamacpp_worker_reports_the_log_likelihood_of_its_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, monkeypatch, _FAKE_LLAMA_CPP)
    gguf = tmp_path / "model-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    ids = [0, 2, 6, 1, 1, 5]
    loglik: dict[str, float] = {}
    got = run_llamacpp(sys.executable, gguf, [[1, 2]], 3, (99,), 1, loglik_ids=ids, loglik=loglik)
    assert [a.token_ids for a in got] == [[[3, 4, 5]], [[3, 4, 5]]]
    table = torch.from_numpy(
        __import__("numpy").random.default_rng(0).normal(size=(64, 7)).astype("float32")
    ).double()
    logp = torch.log_softmax(table[: len(ids) - 1], dim=-1)
    expected = float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean())
    assert loglik["llama.cpp"] == pytest.approx(expected, rel=1e-9)
