"""Small worlds shared by the tests: a warehouse file, a secrets key, a linked account."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from rastro_assets.meta.pacing import reset_default_pacer
from rastro_assets.vault import ENV_VAR, Vault, generate_key
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import PIPELINE_DIR_MODE, PIPELINE_FILE_MODE, Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets.warehouse.runs import (
    SyncRunEnd,
    SyncRunStart,
    finish_sync_runs,
    start_sync_runs,
)
from rastro_assets_tests.postgres_server import WarehouseServer, postgres_server

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fresh_pacer() -> Iterator[None]:
    """Each test starts with the process's pacer knowing nothing: a hold or a reading of the
    app's load left by another test's fake Graph is no fact of this one's."""
    reset_default_pacer()
    yield
    reset_default_pacer()


@pytest.fixture
def now() -> datetime:
    return NOW


@pytest.fixture
def duckdb_path(tmp_path: Path) -> Path:
    """A warehouse file that does not exist yet, in a directory that does not either."""
    return tmp_path / "data" / "rastro.duckdb"


@pytest.fixture
def secrets_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh RASTRO_SECRETS_KEY, set in the environment for the test."""
    key = generate_key()
    monkeypatch.setenv(ENV_VAR, key)
    return key


@pytest.fixture
def vault(secrets_key: str) -> Vault:
    return Vault.from_env()


ENGINE_PARAMETRISED = ("warehouse", "sync", "planner")
"""The test packages whose tests run once on each warehouse engine; elsewhere DuckDB only,
unless a test names its engines (`@pytest.mark.engines`)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" not in metafunc.fixturenames:
        return
    package = Path(str(metafunc.definition.fspath)).parent.name
    marker = metafunc.definition.get_closest_marker("engines")
    if marker is not None:
        engines = list(marker.args)
    elif package in ENGINE_PARAMETRISED:
        engines = ["duckdb", "postgres"]
    else:
        engines = ["duckdb"]
    metafunc.parametrize("engine", engines, indirect=True, scope="function")


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> str:
    """The warehouse's engine for this test: `duckdb`, or `postgres` on the suite's server."""
    return getattr(request, "param", "duckdb")


@pytest.fixture
def warehouse(engine: str, duckdb_path: Path, request: pytest.FixtureRequest):
    """A migrated, empty warehouse: a DuckDB file (a copy of one migrated once) that gives up
    on a foreign lock after 5 s, or a schema of its own on the suite's PostgreSQL server."""
    if engine == "postgres":
        server = request.getfixturevalue("warehouse_server")
        warehouse = PostgresWarehouse(server.migrated_schema_url())
        warehouse.migrate()
        yield warehouse
        warehouse.close()
        return
    template = request.getfixturevalue("migrated_duckdb_file")
    duckdb_path.parent.mkdir(mode=PIPELINE_DIR_MODE, parents=True)
    shutil.copyfile(template, duckdb_path)
    duckdb_path.chmod(PIPELINE_FILE_MODE)
    warehouse = Warehouse(duckdb_path, lock_wait_seconds=5.0)
    warehouse.migrate()
    yield warehouse


@pytest.fixture(scope="session")
def migrated_duckdb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse file migrated once for this worker, closed: each test's `warehouse` starts
    as a copy of it, which costs a fraction of migrating a new file."""
    path = tmp_path_factory.mktemp("migrated") / "rastro.duckdb"
    Warehouse(path).migrate()
    # A cleanly closed file holds everything: a write-ahead log beside it would go uncopied.
    assert not path.with_name(path.name + ".wal").exists()
    return path


@pytest.fixture(scope="session")
def warehouse_server() -> Iterator[WarehouseServer]:
    """One PostgreSQL server for this worker's tests; each test takes a schema of its own."""
    with postgres_server("warehouse") as server:
        shared = WarehouseServer(server)
        yield shared
        shared.close()


@pytest.fixture
def con(warehouse: Warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    with warehouse.connect() as connection:
        yield connection


@pytest.fixture
def linked_account(con: duckdb.DuckDBPyConnection, now: datetime) -> str:
    """`act_1` (America/Sao_Paulo, BRL) linked to site `s1` through connection `c1`."""
    site_store.add_site(con, "s1", "Site one", now)
    registry.save_connection(con, "c1", b"\0" * 40, now)
    link_store.link_account(con, "s1", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    return "act_1"


# -- Small Meta worlds: the fake Graph, a linked warehouse, a Syncer -----------

TOKEN = "EAAtestTOKENx7Qv93LmZpR2sKd81"
"""A distinctive token, so scans for leaks find it if it leaks anywhere."""


@pytest.fixture
def fake_clock():
    from rastro_fake_graph.world import MutableClock

    return MutableClock(NOW)


@pytest.fixture
def fake_world(fake_clock):
    """Two accounts on both sides of UTC: act_101 (Sao Paulo, BRL), act_202 (Tokyo, JPY)."""
    from rastro_fake_graph.world import FakeWorld

    world = FakeWorld(clock=fake_clock, seed=7)
    world.add_account("act_101", timezone="America/Sao_Paulo", currency="BRL", n_ads=6, token=TOKEN)
    world.add_account("act_202", timezone="Asia/Tokyo", currency="JPY", n_ads=4, token=TOKEN)
    return world


@pytest.fixture
def fake_graph(fake_world):
    """The fake Graph on a loopback server: real sockets, real HTTP."""
    from rastro_fake_graph.server import serve

    with serve(fake_world) as server:
        yield server


@pytest.fixture
def linked_world(warehouse: Warehouse, vault: Vault, fake_world, now: datetime):
    """Site s1 links both fake accounts through connection c1; site s2 shares act_202."""
    with warehouse.connect() as connection:
        site_store.add_site(connection, "s1", "Site one", now)
        site_store.add_site(connection, "s2", "Site two", now)
        registry.save_connection(connection, "c1", vault.seal("c1", TOKEN), now)
        for site, account in (("s1", "act_101"), ("s1", "act_202"), ("s2", "act_202")):
            fake = fake_world.accounts[account]
            link_store.link_account(
                connection, site, account, "c1", fake.timezone, fake.currency, now
            )
    return fake_world


@pytest.fixture
def syncer(warehouse: Warehouse, linked_world, fake_clock, secrets_key):
    """A Syncer reaching the fake in-process, with retries that do not sleep."""
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.sync.syncer import Syncer
    from rastro_fake_graph.app import FakeGraphTransport

    def client(token: str) -> MetaClient:
        return MetaClient(
            token,
            base_url="https://graph.facebook.com/v25.0",
            transport=FakeGraphTransport(linked_world),
            sleep=lambda seconds: None,
            async_poll_seconds=0,
            page_size=10,
        )

    return Syncer(warehouse, client, clock=fake_clock)


def record_sync_run(
    con,
    run_id: str,
    account: str,
    kind: str,
    since: date,
    until: date,
    started_at: datetime,
    *,
    outcome: str = "ok",
    error: str | None = None,
    catalog: bool = False,
    took: timedelta = timedelta(seconds=5),
    token_sealed_at: datetime | None = None,
    api_calls: int = 0,
    end: SyncRunEnd | None = None,
) -> None:
    """A finished `meta_sync_runs` row, written as a sync writes it (start, then finish);
    `end`, when given, is how it finished, in place of the keywords before it."""
    start = SyncRunStart(
        run_id=run_id,
        ad_account_id=account,
        kind=kind,
        since=since,
        until=until,
        started_at=started_at,
        catalog=catalog,
        token_sealed_at=token_sealed_at,
    )
    start_sync_runs(con, [start])
    end = end or SyncRunEnd(
        finished_at=started_at + took, outcome=outcome, error=error, api_calls=api_calls
    )
    finish_sync_runs(con, [((run_id, account, since), end)])
