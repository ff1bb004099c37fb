"""The resource with its clock pinned at one instant, for tests and benches that replay it.

The product's resource takes nothing from run config: anyone who reaches the Dagster UI could
set it. This subclass is built in Python, or bound by `pinned_location` (a code location that
only benches load), never by the product's code location.
"""

from __future__ import annotations

from datetime import datetime

import dagster as dg

from rastro_assets.defs.resources import RastroResource
from rastro_assets.timekeeping import Clock, fixed_clock


class PinnedRastroResource(RastroResource):
    """`RastroResource` whose clock, and every run's start, is `fixed_now` (ISO 8601)."""

    fixed_now: str | None = None

    def clock(self) -> Clock:
        if self.fixed_now:
            return fixed_clock(datetime.fromisoformat(self.fixed_now))
        return super().clock()

    def run_started_at(self, context: dg.OpExecutionContext | dg.AssetExecutionContext) -> datetime:
        # A replay stamps the instant it claims, not the wall clock's.
        if self.fixed_now:
            return self.clock()()
        return super().run_started_at(context)


def pinned(instant: datetime) -> PinnedRastroResource:
    return PinnedRastroResource(fixed_now=instant.isoformat())


@dg.definitions
def pinned_location() -> dg.Definitions:
    """The product's definitions with `PinnedRastroResource`, its `fixed_now` set by run
    config (`resources: {rastro: {config: {fixed_now: ...}}}`): `bench/cadence.py` runs its
    waves at the simulated world's instant on it."""
    from rastro_assets.definitions import defs

    return dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        sensors=defs.sensors,
        schedules=defs.schedules,
        resources={**(defs.resources or {}), "rastro": PinnedRastroResource()},
        executor=defs.executor,
        loggers=defs.loggers,
    )
