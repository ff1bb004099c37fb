"""What the `rastro` command asks of the Dagster instance at DAGSTER_HOME.

The command imports this module only when DAGSTER_HOME is set, so no other
command loads Dagster.
"""

from __future__ import annotations

import dagster as dg

from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME


def add_account_partition(ad_account_id: str) -> None:
    """Add `ad_account_id` to the account partitions of the instance at DAGSTER_HOME."""
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(ACCOUNT_PARTITIONS_NAME, [ad_account_id])
