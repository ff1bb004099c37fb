"""A run process killed with SIGKILL in the middle of its spend write, on both engines.

The child reads a week Meta changed since the last sync and is killed at one
point of the write (`_child.STALL_POINTS`): inside the COPY of its rows (on
PostgreSQL), after deleting the rows the read no longer has, just before its
COMMIT, with the COMMIT sent but unanswered (on PostgreSQL), or after the
COMMIT but before the run records its end. Whatever the point, every day holds
either all its previous rows or all of Meta's new ones, never a mix and never
a row twice; before the COMMIT, the previous rows are all there (on PostgreSQL
the server rolls the dead connection's transaction back). The planner notices
the run that never finished once its lease has passed, and the next run
completes with Meta's truth.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from decimal import Decimal
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
    child_env,
    link_world,
    make_syncer,
    perturb,
    spend_by_day,
    table_dump,
    truth_by_day,
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
UNTOUCHED = ("ad_catalog", "ad_thumbnails")
BEFORE_COMMIT = ("copy", "delete", "commit")
BACKEND_GONE_SECONDS = 30


def read_line(stream, timeout_seconds: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_seconds)
    if not ready:
        raise AssertionError(f"the child said nothing within {timeout_seconds:.0f} s")
    return stream.readline().decode().strip()


@pytest.mark.engines("duckdb", "postgres")
@pytest.mark.parametrize("point", ["delete", "commit", "committed"])
def test_a_run_killed_mid_write_loses_and_doubles_nothing(
    point, tmp_path, warehouse, warehouse_env, vault, secrets_key
):
    killed_mid_write(point, tmp_path, warehouse, warehouse_env, vault)


@pytest.mark.engines("postgres")
@pytest.mark.parametrize("point", ["copy", "commit-sent"])
def test_a_run_killed_mid_copy_or_with_its_commit_unanswered_loses_and_doubles_nothing(
    point, tmp_path, warehouse, warehouse_env, vault, secrets_key
):
    killed_mid_write(point, tmp_path, warehouse, warehouse_env, vault)


def killed_mid_write(point, tmp_path, warehouse, warehouse_env, vault) -> None:
    clock = MutableClock(NOW)
    world = build_world(clock, TOKEN)
    link_world(warehouse, vault, world, TOKEN, NOW)
    assert make_syncer(warehouse, world, clock).sync(
        SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="good", catalog=True)
    ).ok
    with warehouse.connect() as con:
        before = spend_by_day(con, ACCOUNT, SINCE, UNTIL)
        untouched = {table: table_dump(con, table) for table in UNTOUCHED}
        stored = con.execute(
            "SELECT count(*), sum(spend) FROM ad_spend_daily WHERE ad_account_id = ?", [ACCOUNT]
        ).fetchone()
    # What the killed child reads in its own world, at its own clock: today's figures grow.
    clock.set(KILLED_AT)
    perturb(world, ACCOUNT, SINCE, UNTIL)
    truth = truth_by_day(world, ACCOUNT, SINCE, UNTIL)
    new_rows = [row for rows in truth.values() for row in rows]

    log = tmp_path / "child.log"
    child = subprocess.Popen(
        [sys.executable, "-m", "rastro_assets_tests.reliability._child", "stall",
         "--point", point, "--account", ACCOUNT, "--since", SINCE.isoformat(),
         "--until", UNTIL.isoformat(), "--run-id", "killed", "--at", KILLED_AT.isoformat()],
        cwd=REPO,
        env=child_env(warehouse_env),
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    try:
        said = read_line(child.stdout, 60)
        assert said.startswith(f"at {point} "), (said, log.read_text())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    rows, spend, backend = said.split()[2:]
    seen = (int(rows), Decimal(spend))
    # What the child's own transaction saw when it stopped: the old rows before it
    # deleted, fewer after, and all of the new ones once every statement ran.
    if point == "copy":
        assert seen == stored
    elif point == "delete":
        assert seen[0] < stored[0]
    else:
        assert seen == (len(new_rows), sum(row[1] for row in new_rows))
    if int(backend):
        wait_for_backend_to_end(warehouse, int(backend))

    check_integrity(warehouse)
    with warehouse.connect() as con:
        after = spend_by_day(con, ACCOUNT, SINCE, UNTIL)
        assert {table: table_dump(con, table) for table in UNTOUCHED} == untouched
        assert_site_spend_exact(con)
        assert_no_row_twice(con)
        killed = {run.run_id: run for run in runs_by_account(sync_run_rows(con))[ACCOUNT]}["killed"]
        [account] = planned_accounts(con, [ACCOUNT])
    mixed = [day for day in after if after[day] not in (before[day], truth[day])]
    assert not mixed, f"days holding neither their old rows nor Meta's new ones: {mixed}"
    if point in BEFORE_COMMIT:
        assert after == before
    else:
        assert any(after[day] == truth[day] != before[day] for day in after), "nothing committed"
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
    again = make_syncer(warehouse, world, clock).sync(
        SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="after")
    )
    assert again.ok, again.error
    with warehouse.connect() as con:
        assert_equals_truth(con, world, ACCOUNT, SINCE, UNTIL)
        assert_site_spend_exact(con)
        assert_no_row_twice(con)
        [account] = planned_accounts(con, [ACCOUNT])
    assert cadence.status(account.state, later + timedelta(minutes=1)).state != "error"


def wait_for_backend_to_end(warehouse, backend: int) -> None:
    """Until the server has noticed the dead client and ended its transaction."""
    deadline = time.monotonic() + BACKEND_GONE_SECONDS
    while True:
        with warehouse.connect() as con:
            alive = con.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ?", [backend]
            ).fetchone()[0]
        if not alive:
            return
        assert time.monotonic() < deadline, f"the server kept backend {backend} for 30 s"
        time.sleep(0.05)


def assert_no_row_twice(con) -> None:
    rows, keys = con.execute(
        "SELECT count(*), count(DISTINCT (ad_account_id, ad_id, day)) FROM ad_spend_daily"
    ).fetchone()
    assert rows == keys, f"{rows - keys} ad-days stored twice"
