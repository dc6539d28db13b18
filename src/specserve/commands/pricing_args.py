"""The price flags ``bench`` and ``compare`` share: ``--instance`` or ``--price-per-hour``,
and optional energy (``--watts`` with ``--price-per-kwh``)."""

from __future__ import annotations

import argparse

from specserve.bench.pricing import Pricing, known_instances, resolve_pricing


def add_pricing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cost", "price per instance-hour for $/1M output tokens (docs/metrics.md, Cost)"
    )
    price = group.add_mutually_exclusive_group()
    price.add_argument(
        "--instance",
        metavar="NAME",
        help=f"preset on-demand price of one instance: {known_instances()}",
    )
    price.add_argument(
        "--price-per-hour", type=float, metavar="USD", help="price of one instance-hour (USD)"
    )
    group.add_argument("--watts", type=float, help="average power draw per instance (energy)")
    group.add_argument("--price-per-kwh", type=float, metavar="USD", help="electricity price")
    group.add_argument(
        "--instances-per-arm",
        type=float,
        default=1.0,
        metavar="N",
        help="instances one arm occupies (default 1; 0.5 when both arms share one instance)",
    )


def pricing_from_args(args: argparse.Namespace) -> Pricing | None:
    """The pricing the flags name (None when none is given); PricingError when refused."""
    return resolve_pricing(
        args.instance, args.price_per_hour, args.watts, args.price_per_kwh, args.instances_per_arm
    )
