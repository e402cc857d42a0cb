"""The one pricing model: what holding accelerator units for a while costs.

Every cost figure in RLHFless goes through `charge`: the planner's forecast of each candidate N,
the runtime's meter of real invocations, the simulator's bill, and so the report. An allocation
is `units` accelerators (GPUs, or the CPU slot standing in for one) held for `seconds`, of which
`cold_s` were spent starting up, plus `idle_s` kept warm after release. Whether start-up and
keep-alive are billed is the platform's rule (`Pricing`); serverless GPU platforms bill both,
since a starting or warm container holds its GPU.

Who holds what is decided where the work runs, and priced here alike:
- a serverless decode function: from its request to its release, then its keep-alive idle;
- a function colocated with another (prefill, the learner's decode actor, the reference) holds
  no resources of its own: its host's allocation covers it;
- the learner (the runtime's driver): its resources for the whole step;
- a serverful baseline (`verl`): its whole allocation for the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PriceSheet:
    """A platform's published prices and billing rules, with where they come from."""

    name: str
    source: str
    unit_hour: dict[str, float]  # accelerator kind -> USD per unit-hour
    bill_cold_start: bool
    bill_keep_alive: bool


# Prices as published in ../shared/data/hardware_facts.md ("Serverless GPU prices, 2026").
PRICE_SHEETS: dict[str, PriceSheet] = {
    "modal-2026": PriceSheet(
        "modal-2026",
        "Modal serverless GPU prices per GPU-hour, 2026 (shared/data/hardware_facts.md); "
        "containers are billed from start-up and while idle in their scale-down window",
        {"h100": 3.95, "a100": 2.50, "l40s": 1.95},  # a100: the 80 GB card,
        bill_cold_start=True,
        bill_keep_alive=True,
    ),
    "aws-on-demand-2026": PriceSheet(
        "aws-on-demand-2026",
        "AWS g6e.xlarge (1x L40S) on demand, 2026 (shared/data/hardware_facts.md); an instance is "
        "billed while it runs, booting and idle included",
        {"l40s": 1.861},
        bill_cold_start=True,
        bill_keep_alive=True,
    ),
}


@dataclass(frozen=True)
class Pricing:
    """USD per accelerator unit-hour and which parts of a function's life are billed."""

    unit_hour: float
    bill_cold_start: bool = True
    bill_keep_alive: bool = True

    def __post_init__(self) -> None:
        if not self.unit_hour >= 0:
            raise ValueError(f"unit_hour: got {self.unit_hour}, expected a price >= 0")

    @classmethod
    def from_sheet(cls, name: str, accelerator: str) -> Pricing:
        """The named sheet's price for `accelerator` (e.g. 'h100'); ValueError naming what is known."""
        sheet = PRICE_SHEETS.get(name)
        if sheet is None:
            raise ValueError(f"price_sheet: got {name!r}, expected one of {', '.join(PRICE_SHEETS)}")
        if accelerator not in sheet.unit_hour:
            raise ValueError(
                f"price_sheet: {name} has no price for {accelerator!r}, expected one of "
                f"{', '.join(sheet.unit_hour)}"
            )
        return cls(sheet.unit_hour[accelerator], sheet.bill_cold_start, sheet.bill_keep_alive)


def charge(pricing: Pricing, units: Any, seconds: Any, cold_s: Any = 0.0, idle_s: Any = 0.0) -> Any:
    """USD for `units` held `seconds` (including `cold_s` of start-up), then kept warm `idle_s`.

    Broadcasts over numpy arrays (the planner prices every candidate at once); floats in, float out.
    """
    billed = np.maximum(np.asarray(seconds, dtype=float), 0.0)
    if not pricing.bill_cold_start:
        billed = np.maximum(billed - np.asarray(cold_s, dtype=float), 0.0)
    if pricing.bill_keep_alive:
        billed = billed + np.maximum(np.asarray(idle_s, dtype=float), 0.0)
    out = pricing.unit_hour / 3600.0 * np.asarray(units, dtype=float) * billed
    return float(out) if out.ndim == 0 else out


def keep_warm(pricing: Pricing, gap_s: Any, cold_start_s: float, lam: float) -> np.ndarray:
    """Keep a released function warm for its next use `gap_s` away (array), or stop it now?

    Warm costs the gap's idle bill. Stopping costs a cold start at the next use: its billed
    seconds, plus the seconds it adds to the step, valued at lam / (1 - lam) unit-seconds per
    second (lam = 1: time only, keep whenever there is a next use; lam = 0: cost only). A function
    with no next use (an infinite gap) saves nothing by staying warm. An unbilled keep-alive is free.
    """
    gap = np.asarray(gap_s, dtype=float)
    if not pricing.bill_keep_alive:
        return np.ones(gap.shape, dtype=bool)
    if lam >= 1.0:
        return np.isfinite(gap)
    return gap <= cold_start_s * (float(pricing.bill_cold_start) + lam / (1.0 - lam))
