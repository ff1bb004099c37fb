"""Worlds for the reliability tests: a bigger act_101, a Syncer that never waits, and the
warehouse on either engine, reachable from the processes the tests start.

`fake_world` is overridden here, so `linked_world`, `fake_graph` and the
package's syncers see twelve ads in act_101: enough rows that a week is read
in several chunks and pages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.reliability.helpers import (
    build_world,
    make_syncer,
    open_warehouse_of,
    warehouse_env_for,
)


@pytest.fixture
def fake_world(fake_clock):
    """act_101 (Sao Paulo, BRL, 12 ads) and act_202 (Tokyo, JPY, 4 ads), read by TOKEN."""
    return build_world(fake_clock, TOKEN)


@pytest.fixture
def warehouse_env(engine: str, duckdb_path: Path, request: pytest.FixtureRequest):
    """What a process is given to reach this test's warehouse: RASTRO_DUCKDB_PATH, or
    RASTRO_WAREHOUSE_URL of a schema of its own on the suite's PostgreSQL server.

    The URL carries the password, so it lives only here: `warehouse.path` is redacted.
    """
    server = request.getfixturevalue("warehouse_server") if engine == "postgres" else None
    return warehouse_env_for(engine, duckdb_path, server)


@pytest.fixture
def warehouse(warehouse_env: dict[str, str]):
    """A migrated, empty warehouse (a DuckDB file giving up on a foreign lock after 5 s, or
    a PostgreSQL schema): the one `warehouse_env` names."""
    warehouse = open_warehouse_of(warehouse_env, lock_wait_seconds=5.0)
    warehouse.migrate()
    yield warehouse
    if warehouse.engine == "postgres":
        warehouse.close()


@pytest.fixture
def rsyncer(warehouse, linked_world, fake_clock, secrets_key):
    """A Syncer on the fake in-process: 4 rows a page, retries and polls without sleeping."""
    return make_syncer(warehouse, linked_world, fake_clock)
