"""``specserve deploy``: render Kubernetes manifests for the A/B, and the Job's helper steps.

Subcommands:
    render CONFIG -o DIR   kustomize base + overlays from a deploy config YAML
    dashboard -o FILE      the Grafana dashboard JSON
    wait URL...            block until every server answers GET /v1/models (bench Job step)
    emf PATH               print the bench's CloudWatch EMF lines to stdout (bench Job step)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

from specserve.deploy.config import DeployConfigError, load_deploy_config
from specserve.deploy.emf import relay_lines
from specserve.deploy.render import RenderError, dashboard_json, render


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "deploy",
        help="render Kubernetes manifests (kustomize) for a baseline vs speculative A/B",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="deploy_command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("render", help="write base/ and overlays/ from a deploy config")
    p.add_argument("config", type=Path, help="deploy config YAML")
    p.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    p.add_argument("--force", action="store_true", help="replace existing base/ and overlays/")
    p.set_defaults(func=_render)

    p = sub.add_parser("dashboard", help="write the Grafana dashboard JSON")
    p.add_argument("-o", "--output", type=Path, required=True, help="output file")
    p.set_defaults(func=_dashboard)

    p = sub.add_parser("wait", help="wait until servers answer GET /v1/models")
    p.add_argument("urls", nargs="+", metavar="URL", help="server root, e.g. http://host:8000")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up after (seconds)")
    p.add_argument("--interval-s", type=float, default=10.0, help="poll interval (seconds)")
    p.set_defaults(func=_wait)

    p = sub.add_parser("emf", help="print the bench's CloudWatch EMF lines (emf.jsonl)")
    p.add_argument("path", type=Path, help="bench output folder or an emf.jsonl file")
    p.add_argument("--namespace", help="replace the CloudWatch namespace")
    p.add_argument(
        "--dimension",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra dimension (repeatable)",
    )
    p.set_defaults(func=_emf)


def _render(args: argparse.Namespace) -> int:
    try:
        cfg = load_deploy_config(args.config)
        written = render(cfg, args.output, force=args.force)
    except (DeployConfigError, RenderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    overlays = ", ".join(cfg.overlays)
    print(f"wrote {len(written)} files to {args.output} (overlays: {overlays})")
    for overlay, notes in cfg.notes().items():
        for note in notes:
            print(f"warning: {overlay}: {note}", file=sys.stderr)
    for name in cfg.overlays:
        print(f"  kubectl apply -k {args.output / 'overlays' / name}")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(dashboard_json())
    print(f"wrote {args.output}")
    return 0


def _ready(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url.rstrip('/')}/v1/models").status_code == 200
    except httpx.HTTPError:
        return False


def _wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout_s
    pending = list(args.urls)
    with httpx.Client(timeout=10.0) as client:
        while True:
            pending = [u for u in pending if not _ready(client, u)]
            if not pending:
                print("ready: " + ", ".join(args.urls))
                return 0
            if time.monotonic() >= deadline:
                print(f"error: not ready after {args.timeout_s:.0f} s: {', '.join(pending)}",
                      file=sys.stderr)  # fmt: skip
                return 1
            time.sleep(args.interval_s)


def _emf(args: argparse.Namespace) -> int:
    dims: dict[str, str] = {}
    for item in args.dimension:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            print(f"error: --dimension wants KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        dims[key] = value
    try:
        lines = relay_lines(args.path, args.namespace, dims)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0
