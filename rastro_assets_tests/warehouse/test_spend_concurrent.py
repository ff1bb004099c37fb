"""Spend writers in separate processes on one PostgreSQL warehouse: the lease orders them.

Each writer is a real process with its own pool, as run workers on other hosts are. Two on
one account: the later sync's figures win, an older run that writes after the newer one's
lease is refused, and no write meets a deadlock or a duplicate key. Eight on eight accounts
at once: every figure exact.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import threading
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from rastro_assets.meta.models import InsightRow, insight_table
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.ad_spend_table import (
    SpendWrite,
    SpendWriteResult,
    lock_accounts,
    write_spend_many,
)
from rastro_assets.warehouse.catalog import upsert_spend_names
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.errors import AccountTakenOver
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets.warehouse.runs import SyncRunStart, start_sync_runs
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact, spend_rows

AT = datetime(2026, 12, 1, tzinfo=UTC)
DAYS = [date(2026, 11, 25) + timedelta(days=offset) for offset in range(3)]
ROUNDS = 9
WAIT_SECONDS = 30
# Writers are forked from one server process that imported this module once, so eight start
# in a moment on two cores; none inherits the test's own connections.
_SPAWN = multiprocessing.get_context("forkserver")
_SPAWN.set_forkserver_preload([__name__])


def reads(ad_ids: list[str], days: list[date], cents: int) -> list[InsightRow]:
    return [
        InsightRow(ad, day, Decimal(cents + index) / 100, 10 + index, index % 7, index % 3)
        for day in days
        for index, ad in enumerate(ad_ids)
    ]


def link(warehouse: PostgresWarehouse, accounts: list[str]) -> None:
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, AT)
        site_store.add_site(con, "s2", None, AT)
        registry.save_connection(con, "c1", b"\0" * 40, AT)
        for account in accounts:
            link_store.link_account(con, "s1", account, "c1", "UTC", "USD", AT)
        link_store.link_account(con, "s2", accounts[0], "c1", "UTC", "USD", AT)


def open_lease(con, run_id: str, account: str, started_at: datetime) -> None:
    """What a sync's start does: the account's row held, then its lease row written."""
    with transaction(con):
        lock_accounts(con, [account])
        start_sync_runs(con, [SyncRunStart(run_id, account, "live", DAYS[0], DAYS[-1],
                                           started_at, False, None)])


def outcome_of(answer: SpendWriteResult | Exception) -> str:
    if isinstance(answer, SpendWriteResult):
        return "written"
    if isinstance(answer, AccountTakenOver):
        return "taken over"
    return f"{type(answer).__name__}: {answer}"


# -- two writers of one account ------------------------------------------------------

def round_rows(number: int, role: str) -> list[InsightRow]:
    """Each round brings ads no round stored before, so both writers insert the same keys."""
    shared = [f"r{number}-a{index}" for index in range(40)]
    own = [f"r{number}-{role}{index}" for index in range(10)]
    return reads(shared + own, DAYS, 100 if role == "old" else 7000)


# How the older run's write meets the newer run's start, round by round.
RACE, AFTER_LEASE, HELD_OPEN = "race", "after the lease", "held open"
MODES = [RACE, AFTER_LEASE, HELD_OPEN]


def same_account_writer(url: str, role: str, start, events, new_pid, results) -> None:
    """One writer's rounds: `new` opens its lease and writes; `old` writes as a run whose
    lease the test opened an hour before: at once, after `new`'s lease, or first, keeping its
    transaction open until `new`'s connection waits on a lock (on the account's row at its
    lease or its write, or, were writers not ordered, on a key `old` inserted)."""
    new_leased, old_wrote = events
    warehouse = PostgresWarehouse(url)
    try:
        for number in range(ROUNDS):
            start.wait(WAIT_SECONDS)
            mode = MODES[number % len(MODES)]
            old_start = AT + timedelta(hours=number)
            try:
                with warehouse.connect() as con:
                    rows = insight_table(round_rows(number, role))
                    write = SpendWrite("act_1", DAYS, rows, DAYS, f"{role}-{number}")
                    if role == "new":
                        new_pid.value = con.raw.info.backend_pid
                        synced_at = old_start + timedelta(minutes=1)
                        if mode == HELD_OPEN and not old_wrote.wait(WAIT_SECONDS):
                            raise TimeoutError("the older run never wrote")
                        open_lease(con, f"new-{number}", "act_1", synced_at)
                        new_leased.set()
                        [answer] = write_spend_many(con, [write], synced_at=synced_at)
                    elif mode == HELD_OPEN:
                        with transaction(con):
                            [answer] = write_spend_many(con, [write], synced_at=old_start)
                            old_wrote.set()
                            _wait_until_blocked(warehouse, new_pid)
                    else:
                        if mode == AFTER_LEASE and not new_leased.wait(WAIT_SECONDS):
                            raise TimeoutError("the newer run never opened its lease")
                        [answer] = write_spend_many(con, [write], synced_at=old_start)
                results.put((number, role, outcome_of(answer)))
            except Exception as exc:  # noqa: BLE001 - the test reports it
                results.put((number, role, f"{type(exc).__name__}: {exc}"))
    finally:
        warehouse.close()


def _wait_until_blocked(warehouse: PostgresWarehouse, pid) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    with warehouse.connect() as con:
        while time.monotonic() < deadline:
            waiting = con.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?", [pid.value]
            ).fetchone()
            if waiting and waiting[0] == "Lock":
                return
            time.sleep(0.005)
    raise TimeoutError("the newer run never waited on the older one")


@pytest.fixture
def shared(warehouse_server):
    """A fresh PostgreSQL warehouse and its URL, which the writer processes open again."""
    url = warehouse_server.fresh_schema_url()
    warehouse = PostgresWarehouse(url)
    warehouse.migrate()
    yield warehouse, url
    warehouse.close()


def test_two_writers_of_one_account_take_turns(shared):
    warehouse, url = shared
    link(warehouse, ["act_1"])
    start, results = _SPAWN.Barrier(3), _SPAWN.Queue()
    events = new_leased, old_wrote = _SPAWN.Event(), _SPAWN.Event()
    new_pid = _SPAWN.Value("i", 0)
    writers = [
        _SPAWN.Process(target=same_account_writer,
                       args=(url, role, start, events, new_pid, results))
        for role in ("old", "new")
    ]
    for writer in writers:
        writer.start()
    try:
        refused_after_lease = 0
        with warehouse.connect() as con:
            for number in range(ROUNDS):
                open_lease(con, f"old-{number}", "act_1", AT + timedelta(hours=number))
                new_leased.clear()
                old_wrote.clear()
                start.wait(WAIT_SECONDS)
                outcomes = dict(_results(results, 2, number))
                assert outcomes["new"] == "written", outcomes
                assert outcomes["old"] in {"written", "taken over"}, outcomes
                if MODES[number % len(MODES)] == AFTER_LEASE:
                    assert outcomes["old"] == "taken over", outcomes
                    refused_after_lease += 1
                expected = round_rows(number, "new")
                assert spend_rows(con) == sorted(
                    ("act_1", r.ad_id, r.day, r.spend, r.impressions, r.clicks, r.conversations)
                    for r in expected
                )
                assert_site_spend_exact(con)
        assert refused_after_lease == len(range(1, ROUNDS, len(MODES)))
    finally:
        _stop(writers)


# -- eight writers of eight accounts ---------------------------------------------------

ACCOUNTS = [f"act_{number}" for number in range(1, 9)]
ADS = [f"ad{index:03d}" for index in range(150)]
WRITES_EACH = 3


def account_rows(account: str, write: int) -> list[InsightRow]:
    return reads(ADS, DAYS, 1000 * int(account.removeprefix("act_")) + write)


def account_writer(url: str, account: str, start, results) -> None:
    """Write the account's days `WRITES_EACH` times, each read's figures a little different."""
    warehouse = PostgresWarehouse(url)
    try:
        start.wait(WAIT_SECONDS)
        for write in range(WRITES_EACH):
            with warehouse.connect() as con:
                [answer] = write_spend_many(
                    con,
                    [SpendWrite(account, DAYS, insight_table(account_rows(account, write)), DAYS)],
                    synced_at=AT + timedelta(minutes=write),
                )
            results.put((write, account, outcome_of(answer)))
    except Exception as exc:  # noqa: BLE001 - the test reports it
        results.put((-1, account, f"{type(exc).__name__}: {exc}"))
    finally:
        warehouse.close()


def test_eight_writers_of_eight_accounts_are_exact(shared):
    warehouse, url = shared
    link(warehouse, ACCOUNTS)
    start, results = _SPAWN.Barrier(len(ACCOUNTS)), _SPAWN.Queue()
    writers = [
        _SPAWN.Process(target=account_writer,
                       args=(url, account, start, results))
        for account in ACCOUNTS
    ]
    for writer in writers:
        writer.start()
    try:
        outcomes = _results(results, len(ACCOUNTS) * WRITES_EACH, None)
        assert {outcome for _, outcome in outcomes} == {"written"}, outcomes
        last = [row for account in ACCOUNTS for row in account_rows(account, WRITES_EACH - 1)]
        with warehouse.connect() as con:
            stored = con.execute(
                "SELECT ad_account_id, count(*), sum(spend), sum(impressions) FROM ad_spend_daily"
                " GROUP BY ad_account_id ORDER BY ad_account_id"
            ).fetchall()
            assert stored == [
                (account, len(ADS) * len(DAYS),
                 sum(r.spend for r in account_rows(account, WRITES_EACH - 1)),
                 sum(r.impressions for r in account_rows(account, WRITES_EACH - 1)))
                for account in ACCOUNTS
            ]
            assert len(spend_rows(con)) == len(last)
            assert_site_spend_exact(con)
    finally:
        _stop(writers)


def _results(results, count: int, number: int | None) -> list[tuple[str, str]]:
    found = []
    for _ in range(count):
        try:
            got, who, outcome = results.get(timeout=WAIT_SECONDS)
        except queue.Empty:
            pytest.fail(f"a writer said nothing for {WAIT_SECONDS} s; so far {found}")
        assert number is None or got == number, (got, who, outcome)
        found.append((who, outcome))
    return found


def _stop(processes) -> None:
    for process in processes:
        process.join(WAIT_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()


# -- two runs naming one account's new ads -------------------------------------------

def test_two_runs_naming_the_same_new_ads_take_turns(shared):
    """The second merge waits for the first and then finds its ads: no duplicate key."""
    warehouse, _ = shared
    link(warehouse, ["act_1"])
    names = insight_table([
        dataclasses.replace(row, ad_name=f"Ad {row.ad_id}")
        for row in reads([f"ad{index}" for index in range(20)], DAYS[:1], 100)
    ])
    errors: list[BaseException] = []
    with warehouse.connect() as first, warehouse.connect() as second:
        def name_too() -> None:
            try:
                upsert_spend_names(second, [("act_1", names)], AT)
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)

        with transaction(first):
            upsert_spend_names(first, [("act_1", names)], AT)
            other = threading.Thread(target=name_too)
            other.start()
            _wait_until_blocked(warehouse, _Pid(second.raw.info.backend_pid))
        other.join(WAIT_SECONDS)
        assert not errors, errors
        assert first.execute("SELECT count(*) FROM ad_catalog").fetchone()[0] == 20


@dataclasses.dataclass
class _Pid:
    value: int
