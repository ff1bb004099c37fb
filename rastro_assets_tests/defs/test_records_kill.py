"""A fill run's worker SIGKILLed after the warehouse committed its last blocks and before it
recorded them: `meta_records` records them from the warehouse once the run has ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta

import dagster as dg
import pytest

from rastro_assets import shards
from rastro_assets.defs.cadence.recorder import build_meta_records_sensor
from rastro_assets.defs.cadence.records import RECORDED_FROM, SYNC_RUN_ID
from rastro_assets.defs.keys import AD_SPEND_DAILY, SITE_SPEND_DAILY, fill_key
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.truth import assert_equals_truth

meta_records_sensor = build_meta_records_sensor(1)

pytestmark = pytest.mark.slow

ACCOUNTS = ("act_101", "act_202")
FIRST = TODAY - timedelta(days=89)

# The fill run of both accounts, its worker stopped for good just before it records the
# block that ends their backfill: the warehouse has committed it (the writer calls back
# only after its commit), and the run's other thread goes on to close the syncs' rows.
CHILD = """
import sys, time
from datetime import date
import dagster as dg
from rastro_assets.defs.keys import RANGE_END_TAG, RANGE_START_TAG
from rastro_assets.defs.spend import fill
from rastro_assets_tests.pinned import PinnedRastroResource

record = fill.materializations
oldest = date.fromisoformat(sys.argv[3])

def stalling(outcome, *args, **kwargs):
    if outcome.request.since == oldest:
        print("committed", flush=True)
        time.sleep(600)
    yield from record(outcome, *args, **kwargs)

fill.materializations = stalling
with dg.DagsterInstance.from_config(sys.argv[1]) as instance:
    dg.materialize(
        [fill.build_spend_fill(0, 1)],
        instance=instance,
        resources={"rastro": PinnedRastroResource(fixed_now=sys.argv[2])},
        tags={RANGE_START_TAG: "act_101", RANGE_END_TAG: "act_202"},
    )
"""


def spend_partitions(instance, asset_key=AD_SPEND_DAILY) -> set[str]:
    return set(instance.get_materialized_partitions(asset_key))


def every_day() -> set[str]:
    return {f"{a}|{day}" for a in ACCOUNTS for day in days_between(FIRST, TODAY)}


def oldest_blocks_closed(warehouse) -> bool:
    with warehouse.connect(read_only=True) as con:
        rows = sync_run_rows(con, ACCOUNTS)
    return all(
        any(row[0] == account and row[3] == FIRST and row[7] == "ok" for row in rows)
        for account in ACCOUNTS
    )


def tick(instance, rastro, cursor=None):
    """One evaluation, its events stored as the daemon stores them."""
    context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"rastro": rastro})
    result = meta_records_sensor(context)
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result


def test_a_worker_killed_between_its_commit_and_its_events_leaves_nothing_unrecorded(
    tmp_path, rastro, warehouse, linked_world
):
    home = tmp_path / "persistent_home"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), list(ACCOUNTS))
    log = tmp_path / "child.log"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(home), NOW.isoformat(), FIRST.isoformat()],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
    )
    try:
        assert child.stdout.readline().decode().strip() == "committed", log.read_text()
        deadline = time.monotonic() + 60
        while not oldest_blocks_closed(warehouse):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()

    with warehouse.connect() as con:
        for account in ACCOUNTS:
            assert_equals_truth(con, linked_world, account, FIRST, TODAY)
    requests = linked_world.record_requests()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [killed] = instance.get_runs()
        assert killed.status == dg.DagsterRunStatus.STARTED
        recorded = spend_partitions(instance)
        # The two newer blocks were recorded by the run; the oldest of neither account.
        assert recorded == {
            f"{a}|{day}" for a in ACCOUNTS
            for day in days_between(FIRST + timedelta(days=30), TODAY)
        }
        assert spend_partitions(instance, fill_key(0)) == set()

        # While the run is in flight it records its own: nothing is taken from it.
        waiting = tick(instance, rastro)
        assert spend_partitions(instance) == recorded
        assert spend_partitions(instance, fill_key(0)) == set()

        # Run monitoring fails the run whose worker died; the next tick records the rest.
        instance.report_run_failed(killed, "its worker was killed")
        after = tick(instance, rastro, waiting.cursor)
        for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
            assert spend_partitions(instance, asset_key) == every_day(), asset_key
        assert spend_partitions(instance, fill_key(0)) == set(ACCOUNTS)
        events = [e for e in after.asset_events if isinstance(e, dg.AssetMaterialization)]
        spend = [e for e in events if e.asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY)]
        assert len(spend) == 2 * 2 * 30
        assert {e.metadata[SYNC_RUN_ID].value for e in spend} == {killed.run_id}
        assert {e.metadata[RECORDED_FROM].value for e in events} == {"warehouse"}

        # Idempotent: a second tick records nothing.
        again = tick(instance, rastro, after.cursor)
        assert [e for e in again.asset_events if isinstance(e, dg.AssetMaterialization)] == []
    # Recorded from the warehouse alone: Meta was not asked again.
    assert requests == []
