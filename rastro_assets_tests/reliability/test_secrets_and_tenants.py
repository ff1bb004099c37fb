"""No token leaks, a missing key fails closed, and tenants stay apart.

- After Dagster runs that fail (throttling, a dead token) and succeed, the
  token appears nowhere: not in the Dagster home, the DuckDB file (its bytes
  and every value of every table), the event log, any log record, stdout or
  stderr — neither as text nor in any base64 spelling.
- Without the secrets key nothing syncs, nothing reaches Meta and no token is
  written in clear.
- Site A never sees site B's accounts; each connection's token is sent only
  for its own accounts (the fake records every request's credential).
"""

from __future__ import annotations

import io
import logging
import sys
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from rastro_assets import cli, shards
from rastro_assets.defs.catalog import build_catalog_assets
from rastro_assets.defs.partitions import spend_partition_key
from rastro_assets.defs.spend.assets import build_meta_spend
from rastro_assets.sync.catalog import CatalogSyncer
from rastro_assets.sync.types import SyncRequest
from rastro_assets.vault import ENV_VAR, Vault
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.pinned import pinned
from rastro_assets_tests.reliability.helpers import (
    check_integrity,
    client_factory,
    find_secret,
    make_syncer,
    scan_tree,
)
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.world import FakeWorld, MutableClock

ad_catalog, ad_thumbnails = build_catalog_assets(1)
meta_spend = build_meta_spend(0, 1)

TODAY = date(2026, 11, 30)
WEEK = (TODAY - timedelta(days=6), TODAY)
TOKEN_B = "EAAsecondTOKENq81ZrW0pLx3Tm5Yc"


def scan_tables(warehouse: Warehouse, secret: str) -> list[str]:
    """Every value of every column of every table, as text and as bytes."""
    hits = []
    with warehouse.connect(read_only=True) as con:
        tables = [row[0] for row in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()]
        for table in tables:
            for row in con.execute(f"SELECT * FROM {table}").fetchall():
                for value in row:
                    blob = value if isinstance(value, bytes) else str(value).encode()
                    hits += [f"{table}: {form}" for form in find_secret(blob, secret)]
    return hits


def scan_warehouse_files(warehouse: Warehouse, secret: str) -> list[str]:
    path = Path(warehouse.path)
    return [
        f"{candidate}: {form}"
        for candidate in (path, path.with_name(path.name + ".wal"))
        if candidate.exists()
        for form in find_secret(candidate.read_bytes(), secret)
    ]


# -- secrets after failing runs ------------------------------------------------------


@pytest.mark.engines("duckdb")  # scans the DuckDB file's bytes
def test_no_token_anywhere_after_dagster_runs_with_failures(
    tmp_path, warehouse, linked_world, fake_graph, secrets_key, caplog, capfd, monkeypatch
):
    caplog.set_level(logging.DEBUG)
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(warehouse.path))
    monkeypatch.setenv("RASTRO_META_GRAPH_URL", fake_graph.base_url)
    monkeypatch.delenv("RASTRO_META_FAKE", raising=False)
    monkeypatch.delenv("RASTRO_ANALYTICS_PATH", raising=False)
    rastro = pinned(NOW)
    results = {}
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202"])

        def spend(account: str, name: str):
            results[name] = dg.materialize(
                [meta_spend], instance=instance, resources={"rastro": rastro},
                partition_key=str(spend_partition_key(account, TODAY)), raise_on_error=False,
            )

        def catalog(name: str):
            results[name] = dg.materialize(
                [ad_catalog, ad_thumbnails], instance=instance, resources={"rastro": rastro},
                partition_key="act_101", raise_on_error=False,
            )

        spend("act_202", "ok")
        linked_world.fail("insights", "throttled", account="act_101", regain_minutes=30)
        spend("act_101", "throttled")
        linked_world.fail("insights", "transient", account="act_101")  # retried: recovers
        spend("act_101", "retried")
        linked_world.fail("thumbnail", "token", times=2)  # the CDN refuses two pictures
        catalog("catalog")
        linked_world.kill_token(TOKEN, subcode=460)
        spend("act_202", "token")
        catalog("paused")
        event_text = "\n".join(
            repr(record)
            for run in instance.get_runs()
            for record in instance.all_logs(run.run_id)
        )
    assert [name for name, result in results.items() if result.success] == [
        "ok", "retried", "catalog"
    ]
    with warehouse.connect() as con:
        connection = registry.get_connection(con, "c1")
        errors = [row[0] for row in con.execute(
            "SELECT error FROM meta_sync_runs WHERE error IS NOT NULL"
        ).fetchall()]
        [[sealed]] = con.execute("SELECT sealed_token FROM meta_connections").fetchall()
    assert connection.status == "invalid"
    assert {error.split(":")[0] for error in errors} == {"RATE_LIMITED", "META_TOKEN_INVALID"}
    assert "RATE_LIMITED" in event_text and "META_TOKEN_INVALID" in event_text

    out, err = capfd.readouterr()
    records = "\n".join(
        f"{record.getMessage()} {record.exc_text or ''} {record.args!r}"
        for record in caplog.records
    )
    assert records  # the runs did log
    # The runs that wrote published the analysts' snapshot beside the warehouse.
    snapshot = Path(warehouse.path).with_name("analytics.duckdb").read_bytes()
    places = {
        "analytics snapshot": find_secret(snapshot, TOKEN)
        + (["the sealed token"] if bytes(sealed)[-24:] in snapshot else []),
        "dagster home": scan_tree(home, TOKEN),
        "everything under the test's directory": scan_tree(tmp_path, TOKEN),
        "duckdb file": scan_warehouse_files(warehouse, TOKEN),
        "duckdb tables": scan_tables(warehouse, TOKEN),
        "event log": find_secret(event_text.encode(), TOKEN),
        "log records": find_secret((caplog.text + records).encode(), TOKEN),
        "stdout/stderr": find_secret((out + err).encode(), TOKEN),
    }
    assert places == {place: [] for place in places}


# -- no key ----------------------------------------------------------------------------


@pytest.mark.engines("duckdb")  # scans the DuckDB file's bytes
def test_without_a_key_nothing_syncs_and_nothing_is_written_in_clear(
    tmp_path, warehouse, linked_world, fake_clock, secrets_key, monkeypatch, capsys
):
    requests = linked_world.record_requests()
    monkeypatch.delenv(ENV_VAR)
    outcome = make_syncer(warehouse, linked_world, fake_clock).sync(
        SyncRequest("act_101", *WEEK, run_id="no-key", catalog=True)
    )
    assert outcome.outcome == "key"
    assert outcome.error.startswith("SECRETS_KEY_MISSING: ") and ENV_VAR in outcome.error
    catalog = CatalogSyncer(warehouse, client_factory(linked_world), clock=fake_clock)
    assert catalog.sync_catalog("act_101", full=True, run_id="no-key").outcome == "key"
    assert catalog.sync_thumbnails("act_101", run_id="no-key").outcome == "key"
    assert requests == [], "Meta was asked without a key"
    with warehouse.connect() as con:
        assert con.execute("SELECT count(*) FROM ad_spend_daily").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM ad_catalog").fetchone() == (0,)

    # Connecting without a key refuses before anything is stored.
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", warehouse.path)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN_B + "\n"))
    code = cli.main(["connect", "c2", "--no-verify"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and ENV_VAR in err, err
    assert TOKEN_B not in out + err
    with warehouse.connect() as con:
        assert registry.get_connection(con, "c2") is None

    # And a fresh CLI home without a key never even creates the file.
    fresh = tmp_path / "fresh" / "rastro.duckdb"
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(fresh))
    monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN_B + "\n"))
    assert cli.main(["connect", "c2", "--no-verify"]) == 2
    capsys.readouterr()
    assert not fresh.exists()

    for secret in (TOKEN, TOKEN_B):
        assert scan_warehouse_files(warehouse, secret) == []
        assert scan_tables(warehouse, secret) == []


def test_a_sealed_token_copied_to_another_connection_does_not_open(
    warehouse, linked_world, fake_clock, vault, secrets_key
):
    """The ciphertext is bound to its connection id: moving it moves no access."""
    linked_world.add_token(TOKEN_B)
    with warehouse.connect() as con:
        registry.save_connection(con, "c2", vault.seal("c2", TOKEN_B), NOW)
        stolen = registry.get_connection(con, "c1").sealed_token
        con.execute("UPDATE meta_connections SET sealed_token = ? WHERE connection_id = 'c2'",
                    [stolen])
        site_store.add_site(con, "s3", "Site three", NOW)
        con.execute("UPDATE meta_ad_accounts SET connection_id = 'c2'"
                    " WHERE ad_account_id = 'act_202'")
    requests = linked_world.record_requests()
    outcome = make_syncer(warehouse, linked_world, fake_clock).sync(
        SyncRequest("act_202", *WEEK, run_id="stolen")
    )
    assert outcome.outcome == "key" and "does not open" in outcome.error
    assert requests == []


# -- tenants -----------------------------------------------------------------------------


@pytest.fixture
def tenants(tmp_path, secrets_key):
    """Site sa links act_101 through connection ca (TOKEN); site sb links act_202 through
    cb (TOKEN_B). Each token reads only its own account at Meta."""
    clock = MutableClock(NOW)
    world = FakeWorld(clock=clock, seed=7)
    world.add_account("act_101", timezone="America/Sao_Paulo", currency="BRL", n_ads=12,
                      token=TOKEN)
    world.add_account("act_202", timezone="Asia/Tokyo", currency="JPY", n_ads=6, token=TOKEN_B)
    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    vault = Vault.from_env()
    with warehouse.connect() as con:
        for site in ("sa", "sb"):
            site_store.add_site(con, site, f"Site {site}", NOW)
        registry.save_connection(con, "ca", vault.seal("ca", TOKEN), NOW)
        registry.save_connection(con, "cb", vault.seal("cb", TOKEN_B), NOW)
        link_store.link_account(con, "sa", "act_101", "ca", "America/Sao_Paulo", "BRL", NOW)
        link_store.link_account(con, "sb", "act_202", "cb", "Asia/Tokyo", "JPY", NOW)
    return world, warehouse, clock


def add_leads(warehouse: Warehouse, site: str, ad_ids: list[str]) -> None:
    with warehouse.connect() as con:
        for ad_id in ad_ids:
            con.execute("INSERT INTO lead_daily_rollups VALUES (?, ?, ?, 3)",
                        [site, ad_id, TODAY - timedelta(days=1)])


def silent_ads(world: FakeWorld, account: str) -> list[str]:
    """Ads without a row in the week: only a by-id lookup can name them."""
    delivering = {row.ad_id for day in range(7)
                  for row in world.truth(account, TODAY - timedelta(days=day))}
    return sorted(set(world.accounts[account].ads) - delivering)


def test_each_site_sees_only_its_accounts_and_each_token_only_its_own(tenants):
    world, warehouse, clock = tenants
    requests = world.record_requests()
    syncer = make_syncer(warehouse, world, clock)
    add_leads(warehouse, "sa", silent_ads(world, "act_101")[:2])
    add_leads(warehouse, "sb", silent_ads(world, "act_202")[:2])
    for account in ("act_101", "act_202"):
        # A live sync (unnamed ads looked up by id), then the daily with the catalog.
        live = syncer.sync(SyncRequest(account, TODAY - timedelta(days=1), TODAY, run_id="l"))
        assert live.ok and live.catalog is not None and live.catalog.asked_by_id == 2
        daily = syncer.sync(SyncRequest(account, *WEEK, run_id="d", catalog=True))
        assert daily.ok and daily.catalog_error is None, daily.catalog_error

    own = {"act_101": TOKEN, "act_202": TOKEN_B}
    endpoints = {request.endpoint for request in requests}
    assert {"insights", "ads", "ads_by_id", "thumbnail"} <= endpoints, endpoints
    for request in requests:
        if request.endpoint == "thumbnail":
            assert request.token is None, "a token was sent to the CDN"
        else:
            assert request.token == own[request.account], request
    check_integrity(warehouse)
    with warehouse.connect() as con:
        assert_site_spend_exact(con)
        sites = dict(con.execute(
            "SELECT site_id, list(DISTINCT ad_account_id) FROM site_spend_daily GROUP BY ALL"
        ).fetchall())
        filed = dict(con.execute(
            "SELECT ad_account_id, list(ad_id ORDER BY ad_id) FROM ad_catalog GROUP BY ALL"
        ).fetchall())
        for account in own:
            assert_equals_truth(con, world, account, *WEEK)
    assert sites == {"sa": ["act_101"], "sb": ["act_202"]}
    assert {account: set(ads) for account, ads in filed.items()} == {
        account: set(world.accounts[account].ads) for account in own
    }


def test_a_lead_for_another_tenant_s_ad_names_nothing_across(tenants):
    """Site sa's rollups mention an ad of act_202 (site sb's): act_101's by-id lookup
    sends act_101's token, Meta refuses it, and nothing of act_202 reaches sa."""
    world, warehouse, clock = tenants
    foreign = silent_ads(world, "act_202")[0]
    add_leads(warehouse, "sa", [foreign])
    requests = world.record_requests()
    outcome = make_syncer(warehouse, world, clock).sync(
        SyncRequest("act_101", TODAY - timedelta(days=1), TODAY, run_id="live")
    )
    assert outcome.ok and outcome.catalog.ok and outcome.catalog.named_ids == []
    assert {request.token for request in requests if request.endpoint != "thumbnail"} == {TOKEN}
    with warehouse.connect() as con:
        assert con.execute("SELECT count(*) FROM ad_catalog WHERE ad_id = ?",
                           [foreign]).fetchone() == (0,)
        assert con.execute("SELECT DISTINCT site_id FROM site_spend_daily").fetchall() == [
            ("sa",)
        ]
    with duckdb.connect(warehouse.path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM site_spend_daily WHERE ad_account_id ="
                           " 'act_202'").fetchone() == (0,)
