"""Tables the pipeline reads but never writes, as external assets in the lineage.

The registry (sites, connections, accounts, links) is written by the `rastro`
command; `lead_daily_rollups` by the host application. Dagster cannot
materialize them: they show where the spend and catalog assets start from.
"""

import dagster as dg

from rastro_assets.defs.keys import (
    LEAD_DAILY_ROLLUPS,
    META_AD_ACCOUNTS,
    META_CONNECTIONS,
    OWNERS,
    SITE_AD_ACCOUNTS,
    SITES,
)
from rastro_assets.defs.metadata import WAREHOUSE_KIND, table_metadata

GROUP = "registry"


def _external(key: dg.AssetKey, description: str, *, written_by: str) -> dg.AssetSpec:
    return dg.AssetSpec(
        key,
        description=description,
        kinds={WAREHOUSE_KIND},
        group_name=GROUP,
        owners=OWNERS,
        tags={"domain": "marketing"},
        metadata={**table_metadata(key.path[-1]), "written_by": written_by},
    )


def location_defs(shard_count: int) -> dg.Definitions:
    return dg.Definitions(assets=_registry_specs())


def _registry_specs() -> list[dg.AssetSpec]:
    return [
        _external(
            SITES,
            "The host application's sites that ad accounts are linked to.",
            written_by="rastro site add",
        ),
        _external(
            META_CONNECTIONS,
            "Meta connections: each holds one access token, sealed with AES-256-GCM under "
            "RASTRO_SECRETS_KEY (ciphertext only), and whether Meta still accepts it.",
            written_by="rastro connect",
        ),
        _external(
            META_AD_ACCOUNTS,
            "Every linked Meta ad account with its connection, timezone (which defines the "
            "account's local days) and currency (the unit of its spend).",
            written_by="rastro link / rastro unlink",
        ),
        _external(
            SITE_AD_ACCOUNTS,
            "Which ad accounts each site is linked to: site_spend_daily sums over these links.",
            written_by="rastro link / rastro unlink",
        ),
        _external(
            LEAD_DAILY_ROLLUPS,
            "Leads per site, ad and day, counted by the host application. Read to find ads that "
            "bring leads but have no name yet, so their names are fetched first. May be empty.",
            written_by="the host application",
        ),
    ]
