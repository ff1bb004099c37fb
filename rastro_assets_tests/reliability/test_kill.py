"""A run process killed with SIGKILL inside the writer's transaction.

The child deletes the rows a complete read no longer has and is killed before
it inserts the new ones: the warehouse must still hold every previous row
(delete and insert are one transaction), and the planner must notice the run
that never finished once its lease has passed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.reliability.helpers import (
    build_world,
    check_integrity,
    link_world,
    make_syncer,
    perturb,
    table_dump,
)
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.world import MutableClock

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "act_101"
TODAY = date(2026, 11, 30)
SINCE, UNTIL = TODAY - timedelta(days=6), TODAY
KILLED_AT = NOW + timedelta(hours=1)  # the killed run's clock: its started_at
KEPT = ("ad_spend_daily", "site_spend_daily", "ad_catalog", "ad_thumbnails")


def read_line(stream, timeout_seconds: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_seconds)
    if not ready:
        raise AssertionError(f"the child said nothing within {timeout_seconds:.0f} s")
    return stream.readline().decode().strip()


def test_a_run_killed_between_delete_and_insert_keeps_the_previous_rows(
    tmp_path, warehouse, vault, secrets_key
):
    clock = MutableClock(NOW)
    world = build_world(clock, TOKEN)
    link_world(warehouse, vault, world, TOKEN, NOW)
    assert make_syncer(warehouse, world, clock).sync(
        SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="good", catalog=True)
    ).ok
    with warehouse.connect() as con:
        before = {table: table_dump(con, table) for table in KEPT}
    stored = len(before["ad_spend_daily"])

    child = subprocess.Popen(
        [sys.executable, "-m", "rastro_assets_tests.reliability._child", "stall",
         "--db", warehouse.path, "--account", ACCOUNT, "--since", SINCE.isoformat(),
         "--until", UNTIL.isoformat(), "--run-id", "killed", "--at", KILLED_AT.isoformat()],
        cwd=REPO,
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "child.log").open("wb"),
    )
    try:
        said = read_line(child.stdout, 60)
        assert said.startswith("in-transaction"), (said, (tmp_path / "child.log").read_text())
        # Inside its transaction the child already sees fewer rows: it did delete.
        assert int(said.split()[1]) < stored
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    check_integrity(warehouse)
    with warehouse.connect() as con:
        assert {table: table_dump(con, table) for table in KEPT} == before
        assert_site_spend_exact(con)
        killed = {run.run_id: run for run in runs_by_account(sync_run_rows(con))[ACCOUNT]}["killed"]
        [account] = planned_accounts(con, [ACCOUNT])
    assert killed.started_at == KILLED_AT
    assert (killed.finished_at, killed.outcome) == (None, None)

    # Within its lease the run is taken for running; after it, for dead.
    running = cadence.plan(account.state, KILLED_AT + timedelta(minutes=5))
    assert "a sync is running" in running.reason
    assert not running.is_due(KILLED_AT + timedelta(minutes=5))
    later = KILLED_AT + timedelta(minutes=16)
    status = cadence.status(account.state, later)
    assert status.state == "error"
    assert status.last_error == cadence.RUN_TIMEOUT_ERROR
    assert status.last_error.startswith("RUN_TIMEOUT: ")

    # The next sync, by a live process, replaces the week as Meta has it now.
    clock.set(later)
    perturb(world, ACCOUNT, SINCE, UNTIL)  # what the killed child was reading
    again = make_syncer(warehouse, world, clock).sync(
        SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="after")
    )
    assert again.ok, again.error
    with warehouse.connect() as con:
        assert_equals_truth(con, world, ACCOUNT, SINCE, UNTIL)
        assert_site_spend_exact(con)
        [account] = planned_accounts(con, [ACCOUNT])
    assert cadence.status(account.state, later + timedelta(minutes=1)).state != "error"
