"""The planner's reduced history gives the answers every row would give.

`planned_accounts` loads only the runs the planner's answers depend on
(`reduced.planner_runs_by_account`); these histories check that plans, statuses and
freshness are those of the full history at instants from the newest run on.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.planner.history import COLUMNS, History

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

def scenarios() -> list[History]:
    out = []

    def new(name, timezone="America/Sao_Paulo", linked=NOW - timedelta(days=40)):
        history = History(f"act_{100 + len(out)}", timezone, linked)
        history.name = name
        out.append(history)
        return history

    h = new("steady")
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), NOW - timedelta(minutes=5), fail_every=37)

    h = new("steady in Tokyo", "Asia/Tokyo", NOW - timedelta(days=95))
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), NOW - timedelta(minutes=30))

    for timezone in ("Pacific/Kiritimati", "Pacific/Pago_Pago"):
        h = new(f"far from UTC ({timezone})", timezone, NOW - timedelta(days=20, hours=7))
        h.backfill(h.linked_at + timedelta(minutes=1))
        h.cadence(h.linked_at + timedelta(minutes=3), NOW - timedelta(minutes=2))

    h = new("a month's pause, never filled", linked=NOW - timedelta(days=70))
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), h.linked_at + timedelta(days=10))
    h.cadence(h.linked_at + timedelta(days=41), NOW - timedelta(minutes=20))

    h = new("a month's pause, then the gap fill", linked=NOW - timedelta(days=70))
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), h.linked_at + timedelta(days=10))
    resumed = h.linked_at + timedelta(days=41)
    h.run("gap", h.today(h.linked_at + timedelta(days=9)), h.today(resumed), resumed)
    h.cadence(resumed + timedelta(minutes=5), NOW - timedelta(minutes=20))

    h = new("a three-week pause (a bucket may be empty)", linked=NOW - timedelta(days=60))
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), h.linked_at + timedelta(days=15))
    h.cadence(h.linked_at + timedelta(days=37), NOW - timedelta(minutes=40))

    h = new("failing now, a run in flight and a dead one")
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), NOW - timedelta(hours=6))
    h.run("live", h.today(NOW) - timedelta(days=1), h.today(NOW), NOW - timedelta(days=3),
          None)
    for hours, outcome in ((5, "throttled"), (3, "other"), (1, "permission")):
        at = NOW - timedelta(hours=hours)
        h.run("live", h.today(at) - timedelta(days=1), h.today(at), at, outcome,
              regain_at=at + timedelta(minutes=30) if outcome == "throttled" else None)
    h.run("live", h.today(NOW) - timedelta(days=1), h.today(NOW), NOW - timedelta(minutes=5),
          None)

    h = new("never a good run", linked=NOW - timedelta(days=2))
    for hours in (40, 30, 20, 2):
        at = NOW - timedelta(hours=hours)
        h.run("backfill", h.today(at) - timedelta(days=89), h.today(at), at, "token")

    h = new("truncated backfill days", linked=NOW - timedelta(days=30))
    link_day = h.today(h.linked_at)
    once, thrice = link_day - timedelta(days=50), link_day - timedelta(days=20)
    h.backfill(h.linked_at + timedelta(minutes=1), incomplete=[once, thrice])
    for tries in range(2):
        at = h.linked_at + timedelta(hours=1 + tries)
        h.run("backfill", thrice, thrice, at, incomplete=[thrice])
    h.cadence(h.linked_at + timedelta(hours=3), NOW - timedelta(minutes=10))

    h = new("backfilling", linked=NOW - timedelta(hours=3))
    h.run("backfill", h.today(h.linked_at) - timedelta(days=89),
          h.today(h.linked_at) - timedelta(days=60), h.linked_at + timedelta(minutes=2))

    new("linked, nothing read yet", linked=NOW - timedelta(minutes=1))

    h = new("idle for twelve days")
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), NOW - timedelta(days=12))

    h = new("latest good run reads an old range")
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), NOW - timedelta(hours=2))
    h.run("manual", h.today(NOW) - timedelta(days=60), h.today(NOW) - timedelta(days=50),
          NOW - timedelta(minutes=30))

    h = new("relinked after its runs", linked=NOW - timedelta(days=2))
    h.run("backfill", h.today(NOW) - timedelta(days=150), h.today(NOW) - timedelta(days=20),
          NOW - timedelta(days=20))
    h.cadence(NOW - timedelta(days=20), NOW - timedelta(days=19))

    h = new("a good run that took eleven days")
    h.backfill(h.linked_at + timedelta(minutes=1))
    h.run("manual", h.today(NOW) - timedelta(days=30), h.today(NOW) - timedelta(days=12),
          NOW - timedelta(days=12), took=timedelta(days=12) - timedelta(minutes=1))
    h.cadence(h.linked_at + timedelta(minutes=10), NOW - timedelta(minutes=15))

    rng = random.Random(20261130)
    for index in range(6):
        linked = NOW - timedelta(days=rng.randrange(1, 120), minutes=rng.randrange(1440))
        h = new(f"random {index}", rng.choice(["Europe/Berlin", "America/Los_Angeles",
                                               "Asia/Kolkata", "Pacific/Auckland"]), linked)
        if rng.random() < 0.8:
            h.backfill(linked + timedelta(minutes=2))
        at = linked + timedelta(minutes=5)
        while at < NOW - timedelta(hours=1):
            stop = min(at + timedelta(days=rng.choice([2, 9, 15, 40])), NOW)
            h.cadence(at, stop, rng=rng)
            at = stop + timedelta(days=rng.choice([0, 0, 1, 12, 28, 31]))
    return out


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def histories(request, tmp_path_factory):
    """The scenarios written once per engine, read back reduced and whole."""
    if request.param == "postgres":
        server = request.getfixturevalue("warehouse_server")
        warehouse = PostgresWarehouse(server.fresh_schema_url())
    else:
        warehouse = Warehouse(tmp_path_factory.mktemp("history") / "rastro.duckdb")
    warehouse.migrate()
    built = scenarios()
    rows = sorted((row for history in built for row in history.rows),
                  key=lambda row: row["started_at"])
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", "Site", NOW - timedelta(days=200))
        registry.save_connection(con, "c1", b"\0" * 40, NOW - timedelta(days=200))
        for history in built:
            link_store.link_account(con, "s1", history.account, "c1", history.timezone, "BRL",
                                  history.linked_at)
        table = pa.table({name: pa.array([row[name] for row in rows], kind)
                          for name, kind in COLUMNS})
        con.register("incoming_runs", table)
        con.execute(
            f"INSERT INTO meta_sync_runs ({', '.join(name for name, _ in COLUMNS)})"
            " SELECT * FROM incoming_runs"
        )
        con.unregister("incoming_runs")
        reduced = planned_accounts(con)
        full = planned_accounts(con, full_history=True)
    newest = max(row["started_at"] for row in rows)
    if request.param == "postgres":
        warehouse.close()
    return built, reduced, full, newest


INSTANTS = [timedelta(0), timedelta(minutes=1), timedelta(minutes=44), timedelta(hours=5),
            timedelta(hours=19), timedelta(days=2), timedelta(days=6, hours=13),
            timedelta(days=9), timedelta(days=29), timedelta(days=95)]


@pytest.mark.parametrize("offset", INSTANTS)
def test_reduced_history_gives_the_same_answers(histories, offset) -> None:
    built, reduced, full, newest = histories
    now = newest + offset
    assert [account.state.ad_account_id for account in reduced] == [
        account.state.ad_account_id for account in full
    ]
    names = {history.account: history.name for history in built}
    for small, every in zip(reduced, full, strict=True):
        what = names[small.state.ad_account_id]
        assert cadence.plan(small.state, now) == cadence.plan(every.state, now), what
        assert cadence.status(small.state, now) == cadence.status(every.state, now), what
        assert cadence.today_synced_at(small.state) == cadence.today_synced_at(every.state)
        assert cadence.is_stale(small.state, now) == cadence.is_stale(every.state, now), what
        # What a sensor tick asks once for both.
        assert cadence.plan_and_status(small.state, now) == (
            cadence.plan(every.state, now), cadence.status(every.state, now)
        ), what


def test_the_scenarios_cover_what_the_planner_does(histories) -> None:
    _, _, full, newest = histories
    kinds = {cadence.plan(account.state, newest + timedelta(hours=5)).kind for account in full}
    assert {"backfill", "gap", "live", "daily"} <= kinds


def test_a_steady_account_loads_a_handful_of_runs(histories) -> None:
    built, reduced, full, _ = histories
    sizes = {small.state.ad_account_id: (len(small.state.runs), len(every.state.runs))
             for small, every in zip(reduced, full, strict=True)}
    steady = built[0].account
    kept, every = sizes[steady]
    assert every > 1000 and kept <= 15, sizes[steady]
    # Runs come oldest first either way.
    for account in reduced:
        starts = [run.started_at for run in account.state.runs]
        assert starts == sorted(starts)
