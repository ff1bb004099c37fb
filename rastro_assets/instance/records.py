"""Records (instance layer): what `rastro status --check` asks of the Dagster instance: the
account-days the warehouse holds from a complete read that the spend assets do not show as
materialized.

The command imports this module only when it checks, so no other command loads Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from rastro_assets.defs.cadence.records import RECORD_GRACE, stored_not_recorded
from rastro_assets.defs.partitions import configured_shard_count
from rastro_assets.planner.runs import epoch_us
from rastro_assets.warehouse.connection import Warehouse


@dataclass(frozen=True)
class Unrecorded:
    """Stored account-days not recorded, per account."""

    days: dict[str, int]

    @property
    def total_days(self) -> int:
        return sum(self.days.values())


def unrecorded_at(home: str, warehouse: Warehouse, now: datetime) -> Unrecorded:
    """What the instance whose home is `home` lacks of the warehouse, counting only days
    first stored `RECORD_GRACE` before `now` or earlier (`meta_records` records the others
    at its next ticks)."""
    with dg.DagsterInstance.from_config(home) as instance:
        missing = stored_not_recorded(instance, warehouse, now, configured_shard_count())
    settled = epoch_us(now - RECORD_GRACE)
    return Unrecorded(missing.account_days(stored_before_us=settled))
