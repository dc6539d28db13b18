"""The experiment configs shipped in ``examples/`` validate (``specserve experiment FILE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specserve.experiment.config import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_serving_ab_example_is_the_serving_benchmark() -> None:
    # docs/benchmarks.md, "serving": the bf16 target alone vs with the int4 0.5B draft,
    # adaptive k, no drafting from 3 requests per step, concurrency 1-8, both suites.
    cfg = load_config(EXAMPLES / "serving-ab.yaml")
    assert cfg.name == "serving-ab" and cfg.endpoints is None and cfg.servers is not None
    s = cfg.servers
    assert (s.target, s.draft, s.method) == (
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "draft",
    )
    assert (s.dtype, s.draft_weights, s.num_speculative_tokens) == ("bfloat16", "int4", "auto")
    assert (s.disable_by_batch_size, s.max_model_len, s.max_num_seqs) == (3, 1024, 8)
    b = cfg.benchmark
    assert b.suites == ("structured", "open-ended") and b.concurrency == (1, 2, 4, 8)
    assert (b.endpoint, b.temperature, b.num_requests, b.max_tokens) == ("chat", 0.0, 8, 32)
    baseline = s.serve_args(speculative=False)
    assert "--draft-model" not in baseline and baseline[-2:] == ["--spec-method", "none"]


def test_sweep_example_runs_four_rates_on_both_suites() -> None:
    cfg = load_config(EXAMPLES / "sweep.yaml")
    assert cfg.name == "sweep" and cfg.servers is not None and cfg.endpoints is None
    b = cfg.benchmark
    assert b.suites == ("structured", "open-ended") and b.concurrency == ()
    points = b.load_points()
    assert [name for name, _ in points] == ["r0.125", "r0.25", "r0.5", "r1"]
    assert all(load.kind == "rate" and load.arrival == "poisson" for _, load in points)
    # sized for <= 20 min on 2 cores (docs/experiment.md, "Sweeps")
    assert (b.num_requests, b.warmup_requests, b.max_tokens) == (8, 1, 32)
    assert cfg.quality is None  # the curve only: the quality check is the main job's
    pricing = cfg.pricing()
    assert pricing is not None and pricing.instance == "local" and pricing.hourly_usd == 0.0


def test_study_example_is_priced_as_the_study_instance() -> None:
    pricing = load_config(EXAMPLES / "aws-trainium-study.yaml").pricing()
    assert pricing is not None and pricing.instance == "trn2.48xlarge"
    assert pricing.instances_per_arm == 0.5  # both arms on one instance, as in the study
    assert pricing.usd_per_million(10.0) == pytest.approx(35.76 * 0.5 / 3600 / 10 * 1e6)


def test_study_load_example_drafts_at_every_batch_size() -> None:
    # docs/benchmarks.md, "At the study's load": c = 4, structured, no batch limit.
    cfg = load_config(EXAMPLES / "study-load.yaml")
    assert cfg.servers is not None and cfg.endpoints is None and cfg.quality is None
    s = cfg.servers
    assert s.disable_by_batch_size is None and s.max_num_seqs == 4
    spec = s.serve_args(speculative=True)
    assert "--speculative-disable-by-batch-size" not in spec
    assert spec[spec.index("--draft-weights") + 1] == "int4"
    assert spec[spec.index("--weights") + 1] == "bf16"
    b = cfg.benchmark
    assert b.suites == ("structured",) and b.concurrency == (4,)
    assert (b.num_requests, b.max_tokens, b.temperature) == (16, 64, 0.0)


def test_int4_server_ab_example_runs_int4_on_both_arms() -> None:
    cfg = load_config(EXAMPLES / "int4-server-ab.yaml")
    assert cfg.servers is not None and cfg.quality is None
    base, spec = cfg.servers.serve_args(False), cfg.servers.serve_args(True)
    assert base[base.index("--weights") + 1] == spec[spec.index("--weights") + 1] == "int4"
    assert spec[spec.index("--draft-weights") + 1] == "int4"
    assert cfg.benchmark.suites == ("structured", "open-ended")
    assert cfg.benchmark.concurrency == (1,)


def test_defaults_example_serves_as_specserve_serve_does_by_default() -> None:
    # docs/benchmarks.md, "With serve's defaults": the arms are `specserve serve --model M`
    # and the same with `--spec-method draft --draft-model D`, nothing else that differs from
    # serve's defaults (gguf as stored for the catalog's GGUF files, the draft in its own
    # default, bf16 compute, adaptive k, no batch limit).
    cfg = load_config(EXAMPLES / "defaults-server-ab.yaml")
    assert cfg.servers is not None and cfg.endpoints is None and cfg.quality is None
    s = cfg.servers
    spec = s.serve_args(speculative=True)
    assert (
        spec[spec.index("--weights") + 1] == "gguf"
        and spec[spec.index("--dtype") + 1] == "bfloat16"
    )
    assert "--draft-weights" not in spec and "--speculative-disable-by-batch-size" not in spec
    assert spec[spec.index("--num-speculative-tokens") + 1] == "auto"
    assert spec[spec.index("--draft-model") + 1] == "qwen2.5-coder-0.5b-instruct"
    b = cfg.benchmark
    assert b.suites == ("structured", "open-ended") and b.concurrency == (1,)


def test_long_context_example_serves_the_defaults_pair_after_3000_token_prompts() -> None:
    # docs/benchmarks.md, "The fused layers' attention scores sixteen keys at a time": the
    # defaults example's servers (but room for the prompts), llmperf's prompts at 3000 tokens.
    defaults = load_config(EXAMPLES / "defaults-server-ab.yaml")
    long = load_config(EXAMPLES / "long-context-ab.yaml")
    assert defaults.servers is not None and long.servers is not None and long.quality is None
    room = {"max_model_len": 4096, "max_num_seqs": 4}
    assert long.servers.model_dump() == defaults.servers.model_dump() | room
    b = long.benchmark
    assert b.suites == ("llmperf",) and b.concurrency == (1,) and b.max_tokens == 64
    p = b.llmperf
    assert (p.mean_input_tokens, p.stddev_input_tokens, p.mean_output_tokens) == (3000, 0, 64)
    assert p.mean_input_tokens + b.max_tokens < room["max_model_len"]


def test_long_output_example_differs_from_the_long_context_one_in_its_answers() -> None:
    # docs/benchmarks.md, "Long prompts: the draft reads a prompt only where the answer can
    # repay it": the same servers and prompts, answers of up to 512 tokens (fewer requests).
    short = load_config(EXAMPLES / "long-context-ab.yaml")
    long = load_config(EXAMPLES / "long-context-long-output-ab.yaml")
    assert short.servers is not None and long.servers is not None and long.quality is None
    assert long.servers.model_dump() == short.servers.model_dump()
    b = long.benchmark
    assert b.max_tokens == b.llmperf.mean_output_tokens == 512 and b.concurrency == (1,)
    assert b.llmperf.mean_input_tokens == short.benchmark.llmperf.mean_input_tokens
    assert b.llmperf.mean_input_tokens + b.max_tokens < long.servers.max_model_len


def test_hybrid_example_differs_from_the_defaults_example_only_in_its_method() -> None:
    defaults = load_config(EXAMPLES / "defaults-server-ab.yaml")
    hybrid = load_config(EXAMPLES / "hybrid-server-ab.yaml")
    assert defaults.servers is not None and hybrid.servers is not None
    spec = hybrid.servers.serve_args(speculative=True)
    assert spec[spec.index("--spec-method") + 1] == "hybrid"
    assert spec[spec.index("--draft-model") + 1] == "qwen2.5-coder-0.5b-instruct"
    same = defaults.servers.model_dump() | {"method": "hybrid"}
    assert hybrid.servers.model_dump() == same
    assert hybrid.benchmark == defaults.benchmark and hybrid.quality is None


def _two_server_example(name: str) -> tuple[Any, str]:
    """An endpoints-mode example's config, checked to run the main job's benchmark settings,
    and its header comment as one line (continuations joined)."""
    path = EXAMPLES / name
    cfg, main = load_config(path), load_config(None)
    assert cfg.endpoints is not None and cfg.servers is None
    assert cfg.benchmark.suites == main.benchmark.suites
    for field in ("concurrency", "num_requests", "warmup_requests", "max_tokens", "endpoint"):
        assert getattr(cfg.benchmark, field) == getattr(main.benchmark, field), field
    header = " ".join(
        line.lstrip("#").strip().rstrip("\\").strip()
        for line in path.read_text().splitlines()
        if line.startswith("#")
    )
    return cfg, header


def test_confidence_stop_example_is_the_main_jobs_benchmark_on_two_servers() -> None:
    # docs/benchmarks.md, "The draft's confidence stop": endpoints mode, the main job's
    # benchmark settings, and the two serve commands in its header differ only in the stop.
    from specserve.config import DEFAULT_DRAFT_CONFIDENCE_THRESHOLD

    cfg, header = _two_server_example("confidence-stop-ab.yaml")
    off, on = header.split("specserve serve ")[1:3]
    on = on.split(" then:")[0]
    assert "--draft-confidence-threshold 0 " in off and "--draft-confidence-threshold" not in on
    strip = off.replace("--draft-confidence-threshold 0 ", "")
    assert strip.split("--port")[0] == on.split("--port")[0]
    assert off.split("--port ")[1].split()[0] in cfg.endpoints.baseline.base_url
    assert on.split("--port ")[1].split()[0] in cfg.endpoints.speculative.base_url
    assert DEFAULT_DRAFT_CONFIDENCE_THRESHOLD > 0


def test_code_ab_example_serves_the_same_command_from_two_checkouts() -> None:
    # docs/benchmarks.md, "Inline constants": endpoints mode with the main job's benchmark
    # settings; the two serve commands of its header are one command, the first run from an
    # earlier commit's sources, each on its arm's port.
    cfg, header = _two_server_example("code-ab.yaml")
    base, new = header.split("specserve serve ")[1:3]
    assert "PYTHONPATH=../specserve-base/src specserve serve" in header
    assert base.split("--port")[0] == new.split("--port")[0]
    assert base.split("--port ")[1].split()[0] in cfg.endpoints.baseline.base_url
    assert new.split("--port ")[1].split()[0] in cfg.endpoints.speculative.base_url


@pytest.mark.parametrize(
    "name, switch",
    [
        # docs/benchmarks.md, "AMX tiles": the baseline with the tiles switched off
        ("amx-server-ab.yaml", "SPECSERVE_BF16_AMX=0"),
        # docs/benchmarks.md, "A draft's one-token int4 matmuls on int8 x": x kept exact
        ("draft-int8-x-ab.yaml", "SPECSERVE_DRAFT_INT8_X=0"),
    ],
)
def test_switch_example_serves_the_main_jobs_speculative_server_on_and_off(
    name: str, switch: str
) -> None:
    # Endpoints mode with the main job's benchmark settings; the two serve commands of the
    # header are the main job's speculative server, the baseline's with one switch set, each
    # on its arm's port.
    cfg, header = _two_server_example(name)
    base, new = header.split("specserve serve ")[1:3]
    assert f"{switch} specserve serve" in header
    assert base.split("--port")[0] == new.split("--port")[0]
    servers = load_config(None).servers
    assert servers is not None
    assert f"--draft-model {servers.draft}" in base
    assert f"--draft-weights {servers.draft_weights}" in base
    assert base.split("--port ")[1].split()[0] in cfg.endpoints.baseline.base_url
    assert new.split("--port ")[1].split()[0] in cfg.endpoints.speculative.base_url


def test_quant_amx_example_serves_one_gguf_command_with_and_without_tiles() -> None:
    # docs/benchmarks.md, "int4 and six-bit codes on the AMX tiles": endpoints mode with the
    # main job's benchmark settings; the two serve commands of its header are one command, the
    # speculative arm's with the tiles switched on, each on its arm's port.
    cfg, header = _two_server_example("quant-amx-server-ab.yaml")
    base, new = header.split("specserve serve ")[1:3]
    assert "SPECSERVE_QUANT_AMX=1 specserve serve" in header
    assert base.split("--port")[0] == new.split("--port")[0]
    assert "--weights gguf" in base and "--draft-weights gguf" in base
    assert base.split("--port ")[1].split()[0] in cfg.endpoints.baseline.base_url
    assert new.split("--port ")[1].split()[0] in cfg.endpoints.speculative.base_url
