"""What the Dagster tests share: an instance and the resource on the loopback fake Graph."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from datetime import date, datetime
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets import shards
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.pinned import PinnedRastroResource, pinned

TODAY = date(2026, 11, 30)  # local today of both fake accounts at NOW


@pytest.fixture
def account_partitions() -> list[str]:
    """The `meta_ad_account` partitions the instance starts with; a module may override it."""
    return ["act_101", "act_202"]


@pytest.fixture(scope="session")
def empty_dagster_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Dagster home whose storages were created once for this worker, closed and empty:
    each test's `instance` starts as a copy of it, which costs a fraction of creating them."""
    home = tmp_path_factory.mktemp("empty_dagster_home")
    with dg.instance_for_test(temp_dir=str(home)):
        pass
    return home


@pytest.fixture
def instance(
    tmp_path, account_partitions: list[str], empty_dagster_home: Path
) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance whose home is `tmp_path / "dagster_home"`."""
    home = tmp_path / "dagster_home"
    shutil.copytree(empty_dagster_home, home)
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        if account_partitions:
            instance.add_dynamic_partitions(shards.accounts_name(0), account_partitions)
        yield instance


@pytest.fixture
def rastro_env(monkeypatch, duckdb_path, fake_graph) -> None:
    """The code location's environment: the linked warehouse and the loopback fake Graph,
    which the resource reads as the daemon's runs do."""
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(duckdb_path))
    monkeypatch.setenv("RASTRO_META_GRAPH_URL", fake_graph.base_url)
    monkeypatch.delenv("RASTRO_META_FAKE", raising=False)
    monkeypatch.delenv("RASTRO_ANALYTICS_PATH", raising=False)


@pytest.fixture
def rastro_at(
    rastro_env, linked_world, secrets_key
) -> Callable[[datetime], PinnedRastroResource]:
    """The resource in `rastro_env`, its clock pinned at an instant."""
    return pinned


@pytest.fixture
def rastro(rastro_at) -> PinnedRastroResource:
    """`rastro_at(NOW)`."""
    return rastro_at(NOW)
