"""Price of an instance-hour: named presets with their source, or a price given by the user.

Cost per output token (definitions in docs/metrics.md, "Cost"):
    hourly price = instance price per hour + watts / 1000 × price per kWh (energy, optional)
    output tokens/s of one instance = an arm's output tokens/s / instances per arm (default
        1: each arm is one instance; 0.5 when two arms share one, as in the reference study)
    $/1M output tokens = hourly price / 3600 / (output tokens/s of one instance) × 1e6

The presets are AWS on-demand Linux prices in us-east-1 (one exception, marked: trn2.48xlarge,
whose only price found was us-east-2's), each with the address it was read from and the date.
Prices change: pass ``--price-per-hour`` for your own rate (reserved, spot, another region).
``local`` is this machine: no rent, so 0 unless energy is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class PricingError(ValueError):
    """An unknown preset, a negative price, or an incomplete energy setting."""


@dataclass(frozen=True)
class InstancePrice:
    """One preset: on-demand price per instance-hour and where it came from."""

    usd_per_hour: float
    region: str
    source: str
    read_on: str
    note: str = ""


# The tsaol/aws-gpu files are snapshots of instances.vantage.sh (which reads AWS's price list),
# "Last updated: 2026-08-26" at the commit below; read 2026-11-30.
_SNAPSHOT = "https://github.com/tsaol/aws-gpu/blob/299375be7a2b940b53b3d80ec79fd66ee688f4fa/data/"
READ_ON = "2026-11-30"

PRESETS: dict[str, InstancePrice] = {
    "local": InstancePrice(
        0.0,
        "-",
        "this machine: no rent (add energy with watts and price per kWh)",
        READ_ON,
    ),
    "trn2.48xlarge": InstancePrice(
        35.76,
        "us-east-2",
        "https://github.com/tsaol/aws-gpu/blob/main/data/trn2_instances.js "
        "(instances.vantage.sh snapshot 'Last updated: 2025-11-30')",
        READ_ON,
        "no us-east-1 on-demand price was found (that snapshot lists Trn2 in us-east-2 only, "
        "later snapshots list no price): this is us-east-2's",
    ),
    "trn1.32xlarge": InstancePrice(
        21.50,
        "us-east-1",
        _SNAPSHOT + "trn1_instances.js",
        READ_ON,
        "also $21.50/hr in https://www.usage.ai/blogs/aws/ai-ml-cost/trainium-vs-gpu-instances/",
    ),
    "inf2.48xlarge": InstancePrice(12.98127, "us-east-1", _SNAPSHOT + "inf2_instances.js", READ_ON),
    "g6e.xlarge": InstancePrice(1.861, "us-east-1", _SNAPSHOT + "g6e_instances.js", READ_ON),
    "p5.48xlarge": InstancePrice(
        55.04,
        "us-east-1",
        _SNAPSHOT + "p5_instances.js",
        READ_ON,
        "after AWS's June 2025 P5 price cut; also $55.04 in https://raw.githubusercontent.com/"
        "datareceipts/data-receipts/main/109-gpu-pricing/hyperscalers.json (retrieved 2026-11-09)",
    ),
}


class Pricing(BaseModel):
    """What one instance-hour costs, and where that number comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    instance: str | None = Field(default=None, description="Preset name; None for a given price.")
    price_per_hour: float = Field(ge=0, description="Instance price, USD per hour.")
    watts: float | None = Field(default=None, ge=0, description="Average power draw (energy).")
    price_per_kwh: float | None = Field(default=None, ge=0, description="USD per kWh (energy).")
    instances_per_arm: float = Field(
        default=1.0, gt=0, description="Instances one arm occupies (0.5: half of one)."
    )
    region: str | None = None
    source: str = Field(description="Where the price comes from.")
    read_on: str | None = Field(default=None, description="When the source was read.")

    @property
    def energy_per_hour(self) -> float:
        if self.watts is None or self.price_per_kwh is None:
            return 0.0
        return self.watts / 1000.0 * self.price_per_kwh

    @property
    def hourly_usd(self) -> float:
        """Price per instance-hour including energy."""
        return self.price_per_hour + self.energy_per_hour

    def per_instance(self, arm_tokens_per_s: float) -> float:
        """Output tokens/s of one instance, from an arm's."""
        return arm_tokens_per_s / self.instances_per_arm

    def usd_per_million(self, arm_tokens_per_s: float | None) -> float | None:
        """$ per 1M output tokens of an arm serving ``arm_tokens_per_s`` output tokens/s."""
        if arm_tokens_per_s is None or arm_tokens_per_s <= 0:
            return None
        return self.hourly_usd / 3600.0 / self.per_instance(arm_tokens_per_s) * 1e6

    def describe(self) -> str:
        """One line for reports: name, price, energy, region and source."""
        name = self.instance or "given price"
        price = self.price_per_hour
        text = f"{name}: ${price:.2f}/h" if round(price, 2) == price else f"{name}: ${price:g}/h"
        if self.energy_per_hour:
            text += f" + energy {self.watts:g} W × ${self.price_per_kwh:g}/kWh"
        if self.region and self.region != "-":
            text += f" (on-demand, {self.region})"
        if self.instances_per_arm != 1.0:
            text += f"; each arm uses {self.instances_per_arm:g} instance"
        text += f"; source: {self.source}"
        return text + (f", read {self.read_on}" if self.read_on else "")


def known_instances() -> str:
    return ", ".join(PRESETS)


def resolve_pricing(
    instance: str | None = None,
    price_per_hour: float | None = None,
    watts: float | None = None,
    price_per_kwh: float | None = None,
    instances_per_arm: float = 1.0,
) -> Pricing | None:
    """The pricing named by a preset or given as a price; None when nothing is given.

    Raises :class:`PricingError` for an unknown preset (listing the known ones), a negative
    number, both a preset and a price, only one of watts / price per kWh, or instances per
    arm not above 0.
    """
    if not instances_per_arm > 0:
        raise PricingError(f"instances per arm must be > 0, got {instances_per_arm:g}")
    for name, value in (
        ("price per hour", price_per_hour),
        ("watts", watts),
        ("price per kWh", price_per_kwh),
    ):
        if value is not None and value < 0:
            raise PricingError(f"{name} must be >= 0, got {value:g}")
    if (watts is None) != (price_per_kwh is None):
        raise PricingError("energy needs both watts and price per kWh")
    if instance is not None and price_per_hour is not None:
        raise PricingError("give an instance preset or a price per hour, not both")
    if instance is None and price_per_hour is None:
        if watts is None:
            return None
        instance = "local"  # energy alone: this machine's electricity
    if instance is not None:
        preset = PRESETS.get(instance)
        if preset is None:
            raise PricingError(f"unknown instance {instance!r}; known: {known_instances()}")
        return Pricing(
            instance=instance,
            price_per_hour=preset.usd_per_hour,
            watts=watts,
            price_per_kwh=price_per_kwh,
            instances_per_arm=instances_per_arm,
            region=preset.region,
            source=preset.source,
            read_on=preset.read_on,
        )
    assert price_per_hour is not None
    return Pricing(
        price_per_hour=price_per_hour,
        watts=watts,
        price_per_kwh=price_per_kwh,
        instances_per_arm=instances_per_arm,
        source="given by the user",
    )
