"""One model and format decoded in process and through ``specserve serve`` (c = 1), side by side.

Both sides are configured by the same ``specserve serve`` flags (after ``--``), so they load the
same models in the same format and dtype with the same speculation:

- **in process**: the engine the server wraps (``build_engine``), driven step by step in this
  process with no HTTP and no event loop;
- **server**: a ``specserve serve`` child process with those flags, one streamed completion
  at a time.

For each prompt of the ``perf`` suite (chat-templated) and each side it prints the model
time — draft + verify seconds, prefill step included: in process from the engine's step
statistics, in the server from the growth of the ``specserve:draft_time_seconds`` and
``specserve:verify_time_seconds`` sums and count — per engine step and per output token,
the number of steps, and the TPOT (decode time per output token after the first, wall clock:
in process around the steps, server from the stream), then the server / in-process ratios.
A model-time ratio near 1.00 says the server's steps do the same model work; a TPOT ratio
near 1.00 says serving adds nothing between steps either.

Per step compares like with like only where both sides take steps of the same size. With the
adaptive controller (``--num-speculative-tokens auto``, serve's default) each side's k
follows its own measured costs and its history of requests, so the two may split the same
tokens into different numbers of steps (e.g. 8 steps of 5-9 tokens against 10 of 2-9): the
per-step ratio then measures k, not the server. Model time per output token holds whatever
k was chosen; with a fixed ``--num-speculative-tokens`` the per-step ratio holds as well.

Both sides are loaded at once and each prompt is decoded in process and then through the
server, ``--rounds`` times, so each pair runs seconds apart on a host whose speed drifts over
minutes; the summary line gives the median of the pairs' ratios. Last, the server process's
peak RSS (its VmHWM).

With ``--loop``, a third side decodes each prompt just before the other two: the batch-1
loop ``specserve perf`` times (``spec_decode/speculative_loop.py``, or the plain loop), on
the in-process engine's own model objects, with a new proposer and k controller for each
decode as ``perf`` makes them. Its TPOT beside the engine's says whether the engine's step
(scheduler, paged KV cache, its controller kept across requests) costs more than ``perf``'s
figures show; its tokens per target forward say whether the two controllers chose alike.

With ``--context N``, each prompt follows about N tokens of Python source (a coding agent's
long context): the steps then attend over it on both sides.

    .venv/bin/python benchmarks/server_step.py --max-tokens 64 -- \\
        --model qwen2.5-coder-1.5b-instruct --weights bf16 \\
        --draft-model qwen2.5-coder-0.5b-instruct --draft-weights int4

Heavy (the models are loaded twice and held at once, one copy per side): run it alone on
the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from specserve.bench.scrape import parse_prometheus
from specserve.bench.suites import get_suite
from specserve.cli import build_parser
from specserve.commands.serve import engine_config_from_args
from specserve.engine.builder import build_engine, build_spec
from specserve.loading import load_tokenizer
from specserve.sampling_params import SamplingParams
from specserve.server.launcher import ServerProcess
from specserve.spec_decode.plain_loop import generate_plain
from specserve.spec_decode.speculative_loop import generate_speculative

_STEP_SUMS = ("specserve:draft_time_seconds_sum", "specserve:verify_time_seconds_sum")
_STEP_COUNT = "specserve:verify_time_seconds_count"


@dataclass
class Side:
    """One prompt on one side: engine steps, their model time, and the decode timing."""

    steps: int
    step_s: float
    tokens: int
    decode_s: float  # from the first output token to the last

    @property
    def ms_per_step(self) -> float:
        return 1e3 * self.step_s / max(self.steps, 1)

    @property
    def model_ms_per_token(self) -> float:
        return 1e3 * self.step_s / max(self.tokens, 1)

    @property
    def tpot_ms(self) -> float:
        return 1e3 * self.decode_s / max(self.tokens - 1, 1)


class InProcess:
    """The engine the server wraps, built in this process and driven step by step."""

    def __init__(self, serve_args: argparse.Namespace, warm_up: list[int]) -> None:
        self.config = engine_config_from_args(serve_args)
        self.engine = build_engine(self.config)
        self.model_s: list[float] = []  # per step: draft + verify time, as the server sums
        self.engine.add_step_listener(lambda st: self.model_s.append(st.draft_s + st.verify_s))
        self.engine.add_request("warm-up", warm_up, SamplingParams(max_tokens=8, temperature=0.0))
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self._n = 0

    def run(self, ids: list[int], max_tokens: int) -> Side:
        """Decode one prompt (greedy) to the end."""
        self._n += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        self.engine.add_request(f"p{self._n}", ids, params)
        self.model_s.clear()
        tokens, first, last = 0, 0.0, 0.0
        while self.engine.has_unfinished_requests():
            new = sum(len(o.new_token_ids) for o in self.engine.step())
            now = time.perf_counter()
            if new:
                first = first or now
                last = now
            tokens += new
        return Side(len(self.model_s), sum(self.model_s), tokens, last - first)


class Loop:
    """``perf``'s batch-1 loop on the in-process engine's models: a new proposer and k
    controller per decode. ``Side.steps`` counts target forwards after the first token and
    ``Side.step_s`` is the wall time after it (the loop does not split draft from verify)."""

    def __init__(self, local: InProcess) -> None:
        engine = local.engine
        self.spec = local.config.spec
        if self.spec.enabled and self.spec.method not in ("draft", "ngram"):
            raise SystemExit(f"--loop runs plain, draft and ngram, not {self.spec.method}")
        self.target = engine.model
        self.draft = getattr(engine.proposer, "model", None)
        self.max_model_len = engine.max_model_len
        self.eos = engine.eos_token_ids

    def run(self, ids: list[int], max_tokens: int) -> Side:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        if not self.spec.enabled:
            r = generate_plain(self.target, ids, params, self.eos)
        else:
            proposer, controller = build_spec(
                self.spec, self.target, self.draft, max_model_len=self.max_model_len
            )
            assert proposer is not None and controller is not None
            r = generate_speculative(self.target, proposer, ids, params, self.eos, controller)
        return Side(r.num_target_forwards, r.decode_s, len(r.token_ids), r.decode_s)


def _step_totals(base_url: str) -> tuple[float, float]:
    samples = parse_prometheus(httpx.get(f"{base_url}/metrics", timeout=10).text)

    def total(name: str) -> float:
        return sum(v for (n, _), v in samples.items() if n == name)

    return sum(total(n) for n in _STEP_SUMS), total(_STEP_COUNT)


def _stream(base_url: str, ids: list[int], max_tokens: int) -> tuple[int, float]:
    body = {
        "model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    first = last = 0.0
    tokens = 0
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=None) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if any(c.get("text") for c in event.get("choices", [])):
                first = first or now
                last = now
    return tokens, last - first


def _peak_rss_gib(pid: int | None) -> float | None:
    """VmHWM of a running process (Linux), GiB; None where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        pass
    return None


def through_server(base_url: str, ids: list[int], max_tokens: int) -> Side:
    """One prompt through the server: its stream, and the step metrics' growth meanwhile."""
    s0, c0 = _step_totals(base_url)
    tokens, decode_s = _stream(base_url, ids, max_tokens)
    s1, c1 = _step_totals(base_url)
    return Side(int(c1 - c0), s1 - s0, tokens, decode_s)


def source_context(tokenizer, tokens: int) -> str:  # type: ignore[no-untyped-def]
    """About ``tokens`` tokens of Python source (the standard library's ``textwrap`` and
    ``json.encoder``, repeated as needed) as a block a prompt can follow: a long context of
    the kind a coding agent sends."""
    import inspect
    import json.encoder
    import textwrap

    text = inspect.getsource(textwrap) + inspect.getsource(json.encoder)
    ids = tokenizer.encode(text * (1 + tokens // max(1, len(tokenizer.encode(text)))))
    code = tokenizer.decode(ids[:tokens])
    return f"Here is some code for context:\n```python\n{code}\n```\n\n"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", default="palindrome,cat", help="ids of the perf suite")
    p.add_argument(
        "--rounds", type=int, default=2,
        help="rounds of (each prompt in process, then the same through the server)",
    )  # fmt: skip
    p.add_argument(
        "--loop", action="store_true",
        help="also decode each prompt with perf's batch-1 loop on the same models",
    )  # fmt: skip
    p.add_argument(
        "--context", type=int, default=0, metavar="TOKENS",
        help="put about this many tokens of Python source ahead of each prompt",
    )  # fmt: skip
    p.add_argument("serve_flags", nargs=argparse.REMAINDER, help="-- then specserve serve flags")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    flags = [f for f in args.serve_flags if f != "--"]
    serve_args = build_parser().parse_args(["serve", *flags])
    tokenizer = load_tokenizer(serve_args.model)
    wanted = args.prompts.split(",")
    suite = {prompt.id: prompt for prompt in get_suite("perf")}
    ahead = source_context(tokenizer, args.context) if args.context > 0 else ""
    prompts = [
        tokenizer.encode_chat([{"role": "user", "content": ahead + suite[name].text}])
        for name in wanted
    ]
    log = Path(tempfile.mkdtemp(prefix="server-step-")) / "server.log"
    with ServerProcess([*flags, "--served-model-name", "m"], log_path=log, name="server") as srv:
        _stream(srv.base_url, prompts[0], 8)  # warm-up, as in process
        local = InProcess(serve_args, prompts[0])
        loop = Loop(local) if args.loop else None
        print(
            f"serve flags: {' '.join(flags)}; max_tokens {args.max_tokens}; "
            f"prompts of {', '.join(str(len(ids)) for ids in prompts)} tokens"
        )
        extra = " TPOT ms loop | in process / loop | tokens per forward loop / in process |"
        print("| round | prompt | steps in process / server | ms/step in process | "
              "ms/step server | server/in process | model ms/token in process | "
              "model ms/token server | server/in process | TPOT ms in process | "
              "TPOT ms server | server/in process | tokens |"
              + (extra if loop else ""))  # fmt: skip
        print("|---" * (16 if loop else 13) + "|")
        step_ratios: list[float] = []
        token_ratios: list[float] = []
        tpot_ratios: list[float] = []
        loop_ratios: list[float] = []
        for round_ in range(1, args.rounds + 1):
            for name, ids in zip(wanted, prompts, strict=True):  # a pair's sides: seconds apart
                c = loop.run(ids, args.max_tokens) if loop else None
                a = local.run(ids, args.max_tokens)
                b = through_server(srv.base_url, ids, args.max_tokens)
                step_ratios.append(b.ms_per_step / a.ms_per_step)
                token_ratios.append(b.model_ms_per_token / a.model_ms_per_token)
                tpot_ratios.append(b.tpot_ms / a.tpot_ms)
                row = (
                    f"| {round_} | {name} | {a.steps} / {b.steps} | {a.ms_per_step:.1f} | "
                    f"{b.ms_per_step:.1f} | {step_ratios[-1]:.2f} | "
                    f"{a.model_ms_per_token:.1f} | {b.model_ms_per_token:.1f} | "
                    f"{token_ratios[-1]:.2f} | {a.tpot_ms:.1f} | {b.tpot_ms:.1f} | "
                    f"{tpot_ratios[-1]:.2f} | {a.tokens} / {b.tokens} |"
                )
                if c is not None:
                    loop_ratios.append(a.tpot_ms / c.tpot_ms)
                    # the engine's steps include the prompt's: its first token is not decode
                    per_step = (a.tokens - 1) / max(a.steps - 1, 1)
                    per_forward = (c.tokens - 1) / max(c.steps, 1)
                    row += (
                        f" {c.tpot_ms:.1f} | {loop_ratios[-1]:.2f} | "
                        f"{per_forward:.2f} / {per_step:.2f} |"
                    )
                print(row, flush=True)
        if loop_ratios:
            print(f"median of {len(loop_ratios)}, in process / loop: TPOT "
                  f"{statistics.median(loop_ratios):.2f}")  # fmt: skip
        print(
            f"median of {len(tpot_ratios)} pairs, server / in process: "
            f"ms/step {statistics.median(step_ratios):.2f}, "
            f"model ms/token {statistics.median(token_ratios):.2f}, "
            f"TPOT {statistics.median(tpot_ratios):.2f}"
        )
        peak = _peak_rss_gib(srv.pid)
    print(f"server peak RSS: {'unknown' if peak is None else f'{peak:.2f} GiB'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
