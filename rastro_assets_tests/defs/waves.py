"""A sync wave run in-process, as the cadence sensor asks for it: sealed as the sensor's,
planned at the resource's clock."""

from __future__ import annotations

from datetime import timedelta

from rastro_assets.defs.cadence.wave import build_sync_wave_job, sealed_wave_config
from rastro_assets_tests.defs.conftest import TODAY

sync_wave_job = build_sync_wave_job()


def live(account: str) -> dict:
    """A live sync of the account's yesterday and today, as the cadence plans it."""
    return {
        "ad_account_id": account,
        "kind": "live",
        "since": str(TODAY - timedelta(days=1)),
        "until": str(TODAY),
        "catalog": False,
    }


def run_wave(instance, rastro, syncs, *, raise_on_error: bool = True):
    return sync_wave_job.execute_in_process(
        run_config={"ops": {"sync_wave": {"config": sealed_wave_config(syncs, rastro.clock()())}}},
        instance=instance,
        resources={"rastro": rastro},
        raise_on_error=raise_on_error,
    )
