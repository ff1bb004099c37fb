"""`rastro sync-now`, `rastro status` and `rastro plan` over a pinned clock."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from rastro_assets.cli.cadence import parse_instant
from rastro_assets.meta.models import Ad, InsightRow, insight_table
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.ad_spend_table import write_spend
from rastro_assets.warehouse.catalog import upsert_catalog
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.runs import SyncRunEnd
from rastro_assets_tests.cli.conftest import assert_usage_error
from rastro_assets_tests.conftest import record_sync_run

STATUS_KEYS = {
    "ad_account_id",
    "sites",
    "state",
    "last_sync_at",
    "next_sync_at",
    "backfill",
    "last_error",
    "rate_limit",
}
PLAN_KEYS = {
    "ad_account_id", "kind", "since", "until", "catalog", "due_at", "reason", "rate_limit"
}
STATUS_HEADER = ["ACCOUNT", "SITES", "STATE", "LAST SYNC", "NEXT SYNC", "BACKFILL", "LAST ERROR"]


def link(con, site: str, account: str, connection: str, timezone: str, at: datetime) -> None:
    if not site_store.site_exists(con, site):
        site_store.add_site(con, site, None, at)
    if registry.get_connection(con, connection) is None:
        registry.save_connection(con, connection, b"\0" * 40, at)
    link_store.link_account(con, site, account, connection, timezone, "USD", at)


def sync_run(
    con,
    run_id: str,
    account: str,
    since: date,
    until: date,
    started_at: datetime,
    outcome: str = "ok",
    error: str | None = None,
    kind: str = "backfill",
) -> None:
    record_sync_run(
        con, run_id, account, kind, since, until, started_at,
        outcome=outcome, error=error, catalog=True, took=timedelta(minutes=2),
        token_sealed_at=started_at - timedelta(days=10), api_calls=3,
    )


@pytest.fixture
def accounts(warehouse: Warehouse, now: datetime) -> dict[str, datetime]:
    """Four accounts, one per state; returns when each one's last good sync finished.

    act_1 (Sao Paulo) has read 30 of its 90 backfill days; act_2 (Tokyo, two
    sites) is live; act_3 failed its last sync; act_4's connection is dead.
    """
    linked = now - timedelta(hours=3)
    with warehouse.connect() as con:
        link(con, "s1", "act_1", "c1", "America/Sao_Paulo", linked)
        link(con, "s1", "act_2", "c1", "Asia/Tokyo", linked)
        link(con, "s2", "act_2", "c1", "Asia/Tokyo", linked)
        link(con, "s2", "act_3", "c1", "UTC", linked)
        link(con, "s2", "act_4", "c2", "UTC", linked)
        # act_1: the first 30-day block of the backfill (local today 2026-11-30).
        sync_run(con, "r1", "act_1", date(2026, 9, 2), date(2026, 10, 1), now - timedelta(hours=2))
        # act_2: the whole backfill, through today, after today's 04:00 in Tokyo.
        act_2_started = now - timedelta(minutes=20)
        sync_run(con, "r2", "act_2", date(2026, 9, 2), date(2026, 11, 30), act_2_started)
        # It delivers: its catalog holds an ACTIVE ad (an idle account is read less often).
        upsert_catalog(
            con, "act_2", [Ad("a2", effective_status="ACTIVE")], act_2_started, refile=True
        )
        # act_3: a good backfill, then a failed live sync.
        sync_run(con, "r3", "act_3", date(2026, 9, 2), date(2026, 11, 30), now - timedelta(hours=2))
        sync_run(
            con,
            "r4",
            "act_3",
            date(2026, 11, 29),
            date(2026, 11, 30),
            now - timedelta(minutes=10),
            outcome="other",
            error="META_UNAVAILABLE: Meta answered 503 " + "x" * 100,
            kind="live",
        )
        registry.mark_connection_invalid(
            con, "c2", "Error validating access token", now, token_sealed_at=linked
        )
    return {
        "act_1": now - timedelta(hours=2) + timedelta(minutes=2),
        "act_2": act_2_started + timedelta(minutes=2),
        "act_3": now - timedelta(hours=2) + timedelta(minutes=2),
    }


# sync-now -------------------------------------------------------------------


def test_sync_now_records_the_request(rastro, warehouse: Warehouse, linked_account, now):
    code, out, err = rastro("sync-now", "1")
    assert (code, err) == (0, "")
    assert out.startswith("act_1: sync requested")
    assert "backfill 2026-09-02..2026-11-30 (90 days)" in out
    with warehouse.connect(read_only=True) as con:
        account = registry.get_account(con, "act_1")
    assert account.sync_requested_at == now
    code, out, _ = rastro("plan", "--json")
    [plan] = json.loads(out)
    assert plan["reason"].endswith("sync requested")


def test_sync_now_on_a_paused_account_says_what_to_do(rastro, warehouse: Warehouse, accounts):
    code, out, err = rastro("sync-now", "act_4")
    assert (code, err) == (0, "")
    assert "paused" in out and "rastro connect c2" in out


@pytest.mark.parametrize(
    ("account", "fragment"),
    [("act_999", "act_999 is not linked"), ("act_x", "not act_<digits>"), ("", "not act_")],
)
def test_sync_now_refuses_unknown_accounts(
    rastro, warehouse: Warehouse, linked_account, account, fragment
):
    with warehouse.connect(read_only=True) as con:
        before = con.execute("SELECT * FROM meta_ad_accounts ORDER BY ALL").fetchall()
    assert_usage_error(rastro("sync-now", account), fragment)
    with warehouse.connect(read_only=True) as con:
        assert con.execute("SELECT * FROM meta_ad_accounts ORDER BY ALL").fetchall() == before


def test_sync_now_without_a_warehouse_creates_none(rastro, duckdb_path: Path):
    assert_usage_error(rastro("sync-now", "act_1"), "act_1 is not linked")
    assert not duckdb_path.exists()


# status ---------------------------------------------------------------------


def test_status_json_has_the_contract_shape(rastro, accounts, now):
    code, out, err = rastro("status", "--json")
    assert (code, err) == (0, "")
    entries = json.loads(out)
    assert [entry["ad_account_id"] for entry in entries] == ["act_1", "act_2", "act_3", "act_4"]
    for entry in entries:
        assert set(entry) == STATUS_KEYS
    act_1, act_2, act_3, act_4 = entries
    assert act_1["state"] == "backfilling"
    assert act_1["backfill"] == {"done": 30, "total": 90}
    assert act_1["sites"] == ["s1"]
    assert act_1["last_error"] is None
    assert datetime.fromisoformat(act_1["last_sync_at"]) == accounts["act_1"]
    assert act_1["last_sync_at"].endswith("-03:00")

    assert act_2["state"] == "live"
    assert act_2["sites"] == ["s1", "s2"]
    assert act_2["backfill"] is None
    assert act_2["last_sync_at"].endswith("+09:00")
    next_sync = datetime.fromisoformat(act_2["next_sync_at"])
    assert next_sync == now + timedelta(minutes=25)

    assert act_3["state"] == "error"
    assert act_3["last_error"].startswith("META_UNAVAILABLE: Meta answered 503")
    assert datetime.fromisoformat(act_3["next_sync_at"]) > now

    assert act_4["state"] == "paused"
    assert act_4["next_sync_at"] is None
    assert act_4["last_error"].startswith("META_TOKEN_INVALID: ")


def test_status_and_plan_say_which_limit_holds_an_account_and_until_when(
    rastro, accounts, warehouse: Warehouse, now
):
    """act_2 was refused by its own ads_insights limit, Meta's regain time 12 minutes away;
    act_3's last sync went well with the app's load at 93 %, its own share at 8 %. Both
    after their live read came due again."""
    at = now + timedelta(minutes=30)
    ended = at - timedelta(minutes=1)
    with warehouse.connect() as con:
        for run_id, account, end in (
            ("r5", "act_2", SyncRunEnd(
                ended, "throttled", error="RATE_LIMITED: (#80000) too many calls",
                usage_pct=100.0, regain_at=ended + timedelta(minutes=12),
                rate_limit="ads_insights", account_usage_pct=100.0)),
            ("r6", "act_3", SyncRunEnd(ended, "ok", usage_pct=93.0, account_usage_pct=8.0)),
        ):
            record_sync_run(con, run_id, account, "live", date(2026, 11, 29),
                            date(2026, 11, 30), at - timedelta(minutes=2), end=end)
    code, out, err = rastro("status", "--json", at=at)
    assert (code, err) == (0, "")
    by_account = {entry["ad_account_id"]: entry for entry in json.loads(out)}
    held = by_account["act_2"]["rate_limit"]
    assert held["limit"] == "ads_insights"
    until = datetime.fromisoformat(held["held_until"])
    assert ended + timedelta(minutes=12) <= until <= ended + timedelta(minutes=15)
    assert until == datetime.fromisoformat(by_account["act_2"]["next_sync_at"])
    assert held["held_until"].endswith("+09:00")  # Tokyo, as the account's other instants
    assert held["reason"] == (
        f"RATE_LIMITED: held until {until:%Y-%m-%d %H:%M} Asia/Tokyo by its ads_insights"
        " business use case (calls an hour); usage 100%"
    )
    assert by_account["act_2"]["last_error"] == "RATE_LIMITED: (#80000) too many calls"
    slowed = by_account["act_3"]
    assert (slowed["state"], slowed["last_error"], slowed["rate_limit"]) == ("live", None, None)
    # Idle (no ACTIVE ad): read every 3 hours, the app's load never moving that.
    assert datetime.fromisoformat(slowed["next_sync_at"]) == ended + timedelta(hours=3, minutes=-1)

    code, out, _ = rastro("status", at=at)
    row = next(line for line in out.splitlines() if line.startswith("act_2"))
    assert "in 1" in row and ", held by ads_insights" in row
    code, out, _ = rastro("plan", "--json", "--at", at.isoformat())
    plans = {entry["ad_account_id"]: entry for entry in json.loads(out)}
    assert plans["act_2"]["rate_limit"] == held and held["reason"] in plans["act_2"]["reason"]
    assert plans["act_3"]["rate_limit"] is None and "RATE_LIMITED" not in out.split("act_3")[1]
    code, out, _ = rastro("plan", "--at", at.isoformat())
    row = next(line for line in out.splitlines() if line.startswith("act_2"))
    assert row.endswith(held["reason"])


def test_status_table_is_aligned_and_readable(rastro, accounts):
    code, out, err = rastro("status")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split("  ")[0] == "ACCOUNT"
    starts = [header.index(name) for name in STATUS_HEADER]
    assert starts == sorted(starts)
    by_account = {row.split()[0]: row for row in rows}
    assert list(by_account) == ["act_1", "act_2", "act_3", "act_4"]
    for row in rows:
        # Every column starts where its header does.
        for start in starts[1:]:
            assert row[start - 2 : start] == "  " and row[start] != " ", (header, row)
    assert "backfilling" in by_account["act_1"] and "30/90 days" in by_account["act_1"]
    assert "1 h 58 min ago" in by_account["act_1"]
    assert "s1,s2" in by_account["act_2"] and "in 25 min" in by_account["act_2"]
    assert "error" in by_account["act_3"] and "META_UNAVAILABLE: Meta answered 503" in out
    assert "..." in by_account["act_3"] and "x" * 100 not in out
    assert by_account["act_4"].split()[2:4] == ["paused", "never"]


def test_status_and_plan_of_an_empty_warehouse(rastro, duckdb_path: Path):
    Warehouse(duckdb_path).migrate()
    for command in ("status", "plan"):
        assert rastro(command, "--json") == (0, "[]\n", "")
        code, out, err = rastro(command)
        assert (code, err) == (0, "")
        assert out.splitlines()[0].startswith("ACCOUNT")
        assert "no linked accounts" in out


def test_status_and_plan_of_no_warehouse_say_no_file(rastro, duckdb_path: Path):
    no_file = f"no warehouse at {duckdb_path}: nothing has been linked there yet"
    for command in ("status", "plan"):
        code, out, err = rastro(command, "--json")
        assert (code, out) == (0, "[]\n")
        assert err.startswith(f"rastro: warning: {no_file}")
        code, out, err = rastro(command)
        assert (code, err) == (0, "")
        assert out.startswith(no_file) and "no linked accounts" not in out
    assert_usage_error(rastro("sync-now", "act_1"), "not linked", no_file)
    assert not duckdb_path.exists()


# plan -----------------------------------------------------------------------


def test_plan_of_a_new_account_is_its_backfill(rastro, linked_account, now):
    at = "2026-11-30T13:30:00Z"
    code, out, err = rastro("plan", "--at", at, "--json")
    assert (code, err) == (0, "")
    [plan] = json.loads(out)
    assert set(plan) == PLAN_KEYS
    linked_day = date(2026, 11, 30)  # 09:00 in Sao Paulo at `now`
    assert plan["ad_account_id"] == "act_1"
    assert plan["kind"] == "backfill"
    assert plan["since"] == (linked_day - timedelta(days=89)).isoformat() == "2026-09-02"
    assert plan["until"] == "2026-11-30"
    assert plan["catalog"] is True
    assert plan["due_at"] == "2026-11-30T10:30:00-03:00"
    assert "0 of 90 days" in plan["reason"]


def test_plan_table(rastro, accounts):
    code, out, err = rastro("plan", "--at", "2026-11-30T12:00:00+00:00")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == ["ACCOUNT", "KIND", "DAYS", "(LOCAL)", "CATALOG", "DUE", "REASON"]
    by_account = {row.split()[0]: row for row in rows}
    assert "backfill  2026-10-02..2026-11-30 (60 days)" in by_account["act_1"]
    assert " now " in by_account["act_1"]
    assert by_account["act_2"].split()[1] == "live"
    assert "in 25 min (2026-11-30 21:25 local)" in by_account["act_2"]
    assert by_account["act_4"].split()[1:3] == ["paused", "-"]


def test_plan_at_another_instant(rastro, accounts, now):
    """Tomorrow 04:05 in Tokyo, act_2 is owed its daily re-sync; the clock does not matter."""
    code, out, _ = rastro("plan", "--json", "--at", "2026-12-01T04:05:00+09:00")
    assert code == 0
    plans = {plan["ad_account_id"]: plan for plan in json.loads(out)}
    daily = plans["act_2"]
    assert (daily["kind"], daily["since"], daily["until"], daily["catalog"]) == (
        "daily",
        "2026-11-25",
        "2026-12-01",
        True,
    )
    assert daily["due_at"] == "2026-12-01T04:00:00+09:00"
    assert plans["act_4"] == {
        "ad_account_id": "act_4",
        "kind": "paused",
        "since": None,
        "until": None,
        "catalog": False,
        "due_at": None,
        "reason": plans["act_4"]["reason"],
        "rate_limit": None,
    }


def test_plan_defaults_to_now(rastro, linked_account, now):
    code, out, _ = rastro("plan", "--json", at=now + timedelta(hours=1))
    [plan] = json.loads(out)
    assert datetime.fromisoformat(plan["due_at"]) == now + timedelta(hours=1)


def test_plan_says_an_idle_account_is_read_every_3_hours_until_its_first_spend(
    rastro, warehouse: Warehouse, now
):
    backfilled = now - timedelta(minutes=30)
    with warehouse.connect() as con:
        link(con, "s1", "act_5", "c1", "UTC", now - timedelta(hours=1))
        sync_run(con, "r5", "act_5", date(2026, 9, 2), date(2026, 11, 30), backfilled)
    code, out, err = rastro("plan", "--json")
    assert (code, err) == (0, "")
    [idle] = json.loads(out)
    assert set(idle) == PLAN_KEYS
    assert idle["kind"] == "live"
    assert idle["reason"] == (
        "idle: no spend today or yesterday and no ACTIVE ad; live read every 3 h"
    )
    assert datetime.fromisoformat(idle["due_at"]) == backfilled + timedelta(hours=3)
    _, table, _ = rastro("plan")
    assert "in 2 h 30 min" in table and "idle: no spend today or yesterday" in table

    with warehouse.connect() as con:
        rows = insight_table([InsightRow("a5", date(2026, 11, 30), Decimal("3.2100"), 40, 1, 0)])
        write_spend(con, "act_5", days=[date(2026, 11, 30)], rows=rows,
                    complete_days=[date(2026, 11, 30)], synced_at=backfilled + timedelta(minutes=1))
    [woke] = json.loads(rastro("plan", "--json")[1])
    assert woke["reason"] == "live read of today and yesterday every 45 min"
    assert datetime.fromisoformat(woke["due_at"]) == backfilled + timedelta(minutes=45)


@pytest.mark.parametrize(
    ("at", "fragment"),
    [
        ("garbage", "not an ISO 8601 instant"),
        ("2026-11-30T25:00:00Z", "not an ISO 8601 instant"),
        ("", "not an ISO 8601 instant"),
        ("2026-11-30T12:00:00", "no UTC offset"),
        ("2026-11-30", "no UTC offset"),
    ],
)
def test_plan_refuses_a_bad_instant(rastro, linked_account, at, fragment):
    assert_usage_error(rastro("plan", "--at", at), "--at", fragment)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-11-30T12:00:00Z", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30t12:00z", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30T09:00:00-03:00", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30 21:00+09:00", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30T12:00:00.250000+00:00", datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=UTC)),
    ],
)
def test_parse_instant(raw, expected):
    parsed = parse_instant(raw)
    assert parsed == expected and parsed.tzinfo is UTC


def test_help_lists_the_cadence_commands(rastro, capsys: pytest.CaptureFixture[str]):
    code, _, _ = rastro("--help")
    out = capsys.readouterr().out
    assert code == 0
    for name in ("sync-now", "status", "plan"):
        assert name in out


# a dead token replaced ------------------------------------------------------

NEW_TOKEN = "EAAnewTOKENq4Wc82NsYpT7rLm05"


def test_status_after_connect_replaced_a_dead_token_waits_for_a_first_good_sync(
    rastro, fake_world, fake_graph, fake_clock, secrets_key, warehouse: Warehouse, now
):
    """Over the fake Graph: both accounts synced, the token dies on their next syncs, and
    `rastro connect` seals a new one: waiting (not live) until a sync with it succeeds."""
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.planner.cadence import split_blocks
    from rastro_assets.sync.syncer import Syncer
    from rastro_assets.sync.types import SyncRequest
    from rastro_assets_tests.conftest import TOKEN
    from rastro_fake_graph.app import FakeGraphTransport

    environ = {"RASTRO_META_GRAPH_URL": fake_graph.base_url, "RASTRO_SECRETS_KEY": secrets_key}

    def cli(*args: str, at: datetime, stdin: str = "") -> tuple[int, str, str]:
        code, out, err = rastro(*args, stdin=stdin, at=at, environ=environ)
        assert TOKEN not in out + err and NEW_TOKEN not in out + err
        return code, out, err

    def client(token: str) -> MetaClient:
        return MetaClient(
            token, base_url="https://graph.facebook.com/v25.0",
            transport=FakeGraphTransport(fake_world), sleep=lambda seconds: None,
            async_poll_seconds=0, page_size=10,
        )

    syncer = Syncer(warehouse, client, clock=fake_clock)

    def planned(at: datetime, *accounts: str) -> list[SyncRequest]:
        """The accounts' reads as `rastro plan` says them at `at`, in blocks."""
        fake_clock.set(at)
        requests = []
        for owed in json.loads(cli("plan", "--json", at=at)[1]):
            if owed["ad_account_id"] not in accounts:
                continue
            first, last = date.fromisoformat(owed["since"]), date.fromisoformat(owed["until"])
            requests += [
                SyncRequest(
                    owed["ad_account_id"], since, until, kind=owed["kind"],
                    run_id=f"{owed['kind']}-{at:%H%M}", catalog=owed["catalog"] and until == last,
                )
                for since, until in split_blocks(first, last)
            ]
        return requests

    def sync_as_planned(at: datetime, *accounts: str) -> list[str]:
        return [syncer.sync(request).outcome for request in planned(at, *accounts)]

    def status_json(at: datetime) -> dict[str, dict]:
        code, out, err = cli("status", "--json", at=at)
        assert (code, err) == (0, "")
        entries = json.loads(out)
        assert all(set(entry) == STATUS_KEYS for entry in entries)
        return {entry["ad_account_id"]: entry for entry in entries}

    assert cli("site", "add", "s1", at=now)[0] == 0
    assert cli("connect", "c1", stdin=TOKEN, at=now)[0] == 0
    assert cli("link", "s1", "act_101", "act_202", "--connection", "c1", at=now)[0] == 0
    assert set(sync_as_planned(now + timedelta(minutes=1), "act_101", "act_202")) == {"ok"}
    assert {e["state"] for e in status_json(now + timedelta(minutes=10)).values()} == {"live"}

    fake_world.kill_token(TOKEN)
    # One wave, one account at a time: act_101 asks Meta and is refused; act_202 is
    # refused before asking, the wave having seen the token die.
    wave_at = now + timedelta(minutes=50)
    syncer.sync_wave(planned(wave_at, "act_101", "act_202"), synced_at=wave_at, concurrency=1)
    with warehouse.connect(read_only=True) as con:
        errors = dict(con.execute(
            "SELECT ad_account_id, error FROM meta_sync_runs WHERE outcome = 'token'"
        ).fetchall())
        [(connection_error,)] = con.execute(
            "SELECT last_error FROM meta_connections WHERE connection_id = 'c1'"
        ).fetchall()
    own_error = errors["act_101"]
    assert "fbtrace_id" in own_error and own_error in errors["act_202"]
    paused = status_json(now + timedelta(minutes=55))
    assert {entry["state"] for entry in paused.values()} == {"paused"}
    assert paused["act_101"]["last_error"] == own_error
    assert paused["act_202"]["last_error"] == (
        f"{connection_error} (seen by another request on connection c1)"
    )

    for account in ("act_101", "act_202"):
        fake_world.grant(NEW_TOKEN, account)
    connected = now + timedelta(hours=1)
    assert cli("connect", "c1", stdin=NEW_TOKEN, at=connected)[0] == 0

    looked = connected + timedelta(minutes=5)
    waiting = status_json(looked)
    for entry in waiting.values():
        assert (entry["state"], entry["last_error"], entry["backfill"]) == ("waiting", None, None)
        assert datetime.fromisoformat(entry["next_sync_at"]) == looked
    code, out, err = cli("status", at=looked)
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split("  ")[0] == "ACCOUNT"
    for row in rows:
        cells = re.split(r" {2,}", row)
        assert cells[2:] == [
            "waiting", "1 h 4 min ago", "now", "-", "new token 5 min ago; no sync finished since",
        ]
    assert "META_TOKEN_INVALID" not in out

    assert sync_as_planned(looked + timedelta(minutes=1), "act_101") == ["ok"]
    after = status_json(looked + timedelta(minutes=10))
    assert (after["act_101"]["state"], after["act_101"]["last_error"]) == ("live", None)
    assert after["act_202"]["state"] == "waiting"
