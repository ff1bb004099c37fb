"""`spend_backfill`: one run reads many accounts' owed blocks and records each as it goes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import date, timedelta

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.keys import (
    AD_SPEND_DAILY,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SITE_SPEND_DAILY,
    fill_key,
)
from rastro_assets.defs.spend.fill import build_spend_fill
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact

ACCOUNTS = ("act_101", "act_202")
TODAY = date(2026, 11, 30)
FIRST = TODAY - timedelta(days=89)


def fill_asset():
    return build_spend_fill(0, 1)


def run_fill(instance, rastro, accounts=ACCOUNTS, raise_on_error=True):
    return dg.materialize(
        [fill_asset()],
        instance=instance,
        resources={"rastro": rastro},
        tags={RANGE_START_TAG: accounts[0], RANGE_END_TAG: accounts[-1]},
        raise_on_error=raise_on_error,
    )


def test_one_run_reads_every_accounts_ninety_days_in_three_blocks_each(
    instance, rastro, warehouse, linked_world
):
    requests = linked_world.record_requests()
    result = run_fill(instance, rastro)
    assert result.success

    with warehouse.connect() as con:
        for account in ACCOUNTS:
            assert_equals_truth(con, linked_world, account, FIRST, TODAY)
        assert_site_spend_exact(con)
        history = runs_by_account(sync_run_rows(con))
    for account in ACCOUNTS:
        runs = history[account]
        assert [(run.since, run.until, run.outcome) for run in runs] == [
            (TODAY - timedelta(days=29), TODAY, "ok"),
            (TODAY - timedelta(days=59), TODAY - timedelta(days=30), "ok"),
            (FIRST, TODAY - timedelta(days=60), "ok"),
        ]
        assert {run.run_id for run in runs} == {result.run_id}
    insights = Counter(
        r.account for r in requests if r.endpoint in ("insights", "async") and r.account
    )
    assert insights == Counter(dict.fromkeys(ACCOUNTS, 3))
    assert instance.get_materialized_partitions(fill_key(0)) == set(ACCOUNTS)
    grid = {f"{a}|{day}" for a in ACCOUNTS for day in days_between(FIRST, TODAY)}
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        assert instance.get_materialized_partitions(asset_key) == grid, asset_key


def spend_partitions_of(instance, account: str) -> set[str]:
    return {
        key
        for key in instance.get_materialized_partitions(AD_SPEND_DAILY)
        if key.startswith(account + "|")
    }


def newest_block(account: str) -> set[str]:
    return {f"{account}|{day}" for day in days_between(TODAY - timedelta(days=29), TODAY)}


def test_the_instance_shows_each_block_before_the_run_ends(
    instance, rastro, warehouse, linked_world
):
    linked_world.request_delay_seconds = 0.2
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(run_fill(instance, rastro)))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        seen: set[str] = set()
        while time.monotonic() < deadline and not newest_block("act_101") <= seen:
            seen = spend_partitions_of(instance, "act_101")
            time.sleep(0.05)
        assert newest_block("act_101") <= seen
        # Recorded while the run still reads the older blocks.
        assert worker.is_alive()
        assert seen < {f"act_101|{day}" for day in days_between(FIRST, TODAY)}
    finally:
        worker.join(timeout=120)
        linked_world.request_delay_seconds = 0.0
    assert outcome[0].success


def test_one_accounts_throttle_leaves_the_others_days_recorded_and_fails_only_it(
    instance, rastro, warehouse, linked_world
):
    linked_world.fail("insights", "throttled", times=None, account="act_202")
    result = run_fill(instance, rastro, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    description = failure.step_failure_data.user_failure_data.description
    assert "act_202" in description and "RATE_LIMITED" in description
    assert "act_101:" not in description

    assert instance.get_materialized_partitions(fill_key(0)) == {"act_101"}
    assert spend_partitions_of(instance, "act_101") == {
        f"act_101|{day}" for day in days_between(FIRST, TODAY)
    }
    assert spend_partitions_of(instance, "act_202") == set()
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", FIRST, TODAY)
        [run] = runs_by_account(sync_run_rows(con))["act_202"]
    assert (run.outcome, run.since, run.until) == (
        "throttled",
        TODAY - timedelta(days=29),
        TODAY,
    )


def test_a_token_dying_mid_run_keeps_every_block_already_recorded(
    instance, rastro, warehouse, linked_world
):
    # The newest block of each account reads; the token dies on the next read.
    linked_world.fail("insights", "token", times=None, skip=2)
    result = run_fill(instance, rastro, raise_on_error=False)
    assert not result.success
    for account in ACCOUNTS:
        assert spend_partitions_of(instance, account) == newest_block(account)
    assert instance.get_materialized_partitions(fill_key(0)) == set()
    with warehouse.connect() as con:
        for account in ACCOUNTS:
            assert_equals_truth(con, linked_world, account, TODAY - timedelta(days=29), TODAY)


CHILD = """
import os, sys
import dagster as dg
from rastro_assets.defs.keys import RANGE_END_TAG, RANGE_START_TAG
from rastro_assets.defs.spend.fill import build_spend_fill
from rastro_assets_tests.pinned import PinnedRastroResource

with dg.DagsterInstance.from_config(sys.argv[1]) as instance:
    dg.materialize(
        [build_spend_fill(0, 1)],
        instance=instance,
        resources={"rastro": PinnedRastroResource(fixed_now=sys.argv[2])},
        tags={RANGE_START_TAG: "act_101", RANGE_END_TAG: "act_202"},
    )
"""


def test_a_run_killed_mid_way_is_retried_from_the_first_block_it_had_not_recorded(
    tmp_path, rastro, warehouse, linked_world
):
    home = tmp_path / "persistent_home"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), list(ACCOUNTS))
    linked_world.request_delay_seconds = 0.3
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(home), NOW.isoformat()],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "child.log").open("w"),
    )
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(
                newest_block(account) <= spend_partitions_of(instance, account)
                for account in ACCOUNTS
            ):
                time.sleep(0.1)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            linked_world.request_delay_seconds = 0.0
            recorded = {account: spend_partitions_of(instance, account) for account in ACCOUNTS}
            assert all(newest_block(a) <= recorded[a] for a in ACCOUNTS)
            # Run monitoring fails a run whose worker died; nothing else is told.
            [killed] = instance.get_runs()
            instance.report_run_failed(killed, "its worker was killed")

            requests = linked_world.record_requests()
            retry = run_fill(instance, rastro)
            assert retry.success
    finally:
        if child.poll() is None:
            child.kill()
        linked_world.request_delay_seconds = 0.0

    with warehouse.connect() as con:
        for account in ACCOUNTS:
            assert_equals_truth(con, linked_world, account, FIRST, TODAY)
        assert_site_spend_exact(con)
    read = Counter(r.account for r in requests if r.endpoint in ("insights", "async"))
    # Only the blocks the killed run had not recorded: never its newest one again.
    for account in ACCOUNTS:
        unrecorded_blocks = 3 - len(recorded[account]) // 30
        assert read[account] == unrecorded_blocks, (account, read)
