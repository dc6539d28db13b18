"""Grafana dashboard: baseline vs speculative, from Prometheus metrics of vLLM or specserve.

Both servers expose the same names (``vllm:*`` for what vLLM also has, ``specserve:*`` for
what only specserve has), with the ``model_name`` label; the scrape adds ``arm`` (baseline /
speculative) from the pod label, so every panel groups by ``arm``. Counters carry the
``_total`` suffix in PromQL, histograms ``_bucket`` / ``_sum`` / ``_count``.

Formulas (per arm, over the rate window):
    acceptance rate  α = rate(accepted_tokens) / rate(draft_tokens)
    mean acceptance length  τ = 1 + rate(accepted_tokens) / rate(drafts)   (bonus token incl.)
    per-position acceptance  α_i = rate(accepted_tokens_per_pos{position=i}) / rate(drafts)
"""

from __future__ import annotations

from typing import Any

DASHBOARD_UID = "specserve-ab"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'model_name=~"$model_name"'
RATE = "[$__rate_interval]"
QUANTILES = (0.5, 0.9, 0.99)
Obj = dict[str, Any]


def _target(expr: str, legend: str, ref: str) -> Obj:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def _quantile_targets(histogram: str, arm_filter: str = "") -> list[Obj]:
    sel = f"{SEL}{arm_filter}"
    return [
        _target(
            f"histogram_quantile({q}, sum by (le, arm) (rate({histogram}_bucket{{{sel}}}{RATE})))",
            f"{{{{arm}}}} p{round(q * 100)}",
            chr(ord("A") + i),
        )
        for i, q in enumerate(QUANTILES)
    ]


def _by_arm(expr_inner: str, legend: str = "{{arm}}") -> list[Obj]:
    return [_target(expr_inner, legend, "A")]


class _Layout:
    """Places panels left to right, two per row of height 8, with section rows between."""

    def __init__(self) -> None:
        self.panels: list[Obj] = []
        self._y = 0
        self._x = 0
        self._id = 0

    def _next_id(self) -> int:
        self._id += 1
        return self._id

    def row(self, title: str) -> None:
        if self._x:
            self._y += 8
            self._x = 0
        self.panels.append(
            {
                "id": self._next_id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y},
                "panels": [],
            }
        )
        self._y += 1

    def add(
        self,
        title: str,
        targets: list[Obj],
        unit: str,
        description: str,
        kind: str = "timeseries",
    ) -> None:
        self.panels.append(
            {
                "id": self._next_id(),
                "type": kind,
                "title": title,
                "description": description,
                "datasource": DATASOURCE,
                "gridPos": {"h": 8, "w": 12, "x": self._x, "y": self._y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "table", "placement": "bottom"}}
                if kind == "timeseries"
                else {"reduceOptions": {"calcs": ["lastNotNull"]}},
                "targets": targets,
            }
        )
        self._x += 12
        if self._x >= 24:
            self._x = 0
            self._y += 8


def _rate_sum(metric: str, by: str = "arm", sel: str = SEL) -> str:
    return f"sum by ({by}) (rate({metric}{{{sel}}}{RATE}))"


def build_dashboard() -> Obj:
    """The dashboard as a Grafana JSON model (import it, or ship it in a ConfigMap)."""
    lay = _Layout()
    spec_sel = f'{SEL}, arm="speculative"'

    lay.row("Latency percentiles (per arm)")
    lay.add(
        "TPOT / inter-token latency",
        _quantile_targets("vllm:time_per_output_token_seconds"),
        "s",
        "Time per output token after the first: (E2E - TTFT) / (n - 1) per request.",
    )
    lay.add(
        "TTFT",
        _quantile_targets("vllm:time_to_first_token_seconds"),
        "s",
        "Time to first token; speculation should leave it unchanged.",
    )
    lay.add(
        "E2E request latency",
        _quantile_targets("vllm:e2e_request_latency_seconds"),
        "s",
        "Request arrival to last token.",
    )
    median = "histogram_quantile(0.5, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket"
    lay.add(
        "TPOT speedup (median baseline / median speculative)",
        [
            _target(
                f'{median}{{{SEL}, arm="baseline"}}{RATE}))) / {median}{{{spec_sel}}}{RATE})))',
                "speedup",
                "A",
            )
        ],
        "x",
        "Above 1: the speculative arm emits tokens faster than the baseline.",
        kind="stat",
    )

    lay.row("Throughput")
    lay.add(
        "Generated tokens / s",
        _by_arm(_rate_sum("vllm:generation_tokens_total")),
        "tps",
        "Aggregate output throughput of each arm.",
    )
    lay.add(
        "Prompt tokens / s",
        _by_arm(_rate_sum("vllm:prompt_tokens_total")),
        "tps",
        "Aggregate prefill throughput of each arm.",
    )
    lay.add(
        "Finished requests / s",
        _by_arm(
            _rate_sum("vllm:request_success_total", by="arm, finished_reason"),
            "{{arm}} {{finished_reason}}",
        ),
        "reqps",
        "Finished requests by finish reason.",
    )
    lay.add(
        "Rejected requests / s",
        _by_arm(
            _rate_sum("specserve:requests_rejected_total", by="arm, reason"),
            "{{arm}} {{reason}}",
        ),
        "reqps",
        "specserve only: requests refused (queue_full, bad_request).",
    )

    lay.row("Speculation")
    accepted = _rate_sum("vllm:spec_decode_num_accepted_tokens_total")
    lay.add(
        "Acceptance rate",
        _by_arm(f"{accepted} / {_rate_sum('vllm:spec_decode_num_draft_tokens_total')}"),
        "percentunit",
        "Accepted draft tokens / proposed draft tokens.",
    )
    lay.add(
        "Mean acceptance length",
        _by_arm(f"1 + {accepted} / {_rate_sum('vllm:spec_decode_num_drafts_total')}"),
        "none",
        "Tokens emitted per target forward, bonus token included.",
    )
    per_pos = _rate_sum(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total", by="position", sel=spec_sel
    )
    drafts = f"sum(rate(vllm:spec_decode_num_drafts_total{{{spec_sel}}}{RATE}))"
    lay.add(
        "Acceptance by draft position (speculative arm)",
        [_target(f"{per_pos} / ignoring(position) group_left {drafts}", "pos {{position}}", "A")],
        "percentunit",
        "Share of drafts whose token at this 0-based position was accepted.",
    )
    lay.add(
        "k chosen (specserve)",
        [
            _target(
                "histogram_quantile(0.5, sum by (le, arm) "
                f"(rate(specserve:spec_k_chosen_bucket{{{SEL}}}{RATE})))",
                "{{arm}} median k",
                "A",
            ),
            _target(
                f"{_rate_sum('specserve:spec_k_chosen_sum')} / "
                f"{_rate_sum('specserve:spec_k_chosen_count')}",
                "{{arm}} mean k",
                "B",
            ),
        ],
        "none",
        "specserve only: draft tokens asked for per request per step (adaptive k).",
    )
    lay.add(
        "Draft and verify step time p50 (specserve)",
        [
            _target(
                "histogram_quantile(0.5, sum by (le, arm) "
                f"(rate(specserve:{name}_time_seconds_bucket{{{SEL}}}{RATE})))",
                f"{{{{arm}}}} {name}",
                ref,
            )
            for name, ref in (("draft", "A"), ("verify", "B"))
        ],
        "s",
        "specserve only: proposer time and target verify time per engine step.",
    )
    lay.add(
        "Speculation-off steps / s (specserve)",
        _by_arm(_rate_sum("specserve:spec_off_steps_total")),
        "ops",
        "specserve only: request steps decoded with k = 0 (speculation judged not worth it).",
    )

    lay.row("Load")
    lay.add(
        "Requests running / waiting",
        [
            _target(f"sum by (arm) (vllm:num_requests_running{{{SEL}}})", "{{arm}} running", "A"),
            _target(f"sum by (arm) (vllm:num_requests_waiting{{{SEL}}})", "{{arm}} waiting", "B"),
        ],
        "none",
        "Scheduler queue of each arm.",
    )
    lay.add(
        "KV cache usage",
        _by_arm(f"max by (arm) (vllm:kv_cache_usage_perc{{{SEL}}})"),
        "percentunit",
        "Fraction of KV cache blocks in use.",
    )
    lay.add(
        "Preemptions / s (specserve)",
        _by_arm(_rate_sum("specserve:num_preemptions_total")),
        "ops",
        "specserve only: requests preempted for KV space.",
    )

    return {
        "uid": DASHBOARD_UID,
        "title": "specserve A/B: baseline vs speculative",
        "description": "Speculative decoding A/B of vLLM or specserve servers (same metrics).",
        "tags": ["specserve", "speculative-decoding", "vllm"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "model_name",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": "label_values(vllm:num_requests_running, model_name)",
                        "refId": "model_name",
                    },
                    "definition": "label_values(vllm:num_requests_running, model_name)",
                    "refresh": 2,
                    "includeAll": True,
                    "multi": False,
                    "allValue": ".*",
                    "current": {},
                    "hide": 0,
                },
            ]
        },
        "panels": lay.panels,
    }
