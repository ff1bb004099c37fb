"""What the Dagster tests share: an instance and the resource on the loopback fake Graph."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date, datetime

import dagster as dg
import pytest

from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME
from rastro_assets.defs.resources import RastroResource
from rastro_assets_tests.conftest import NOW

TODAY = date(2026, 11, 30)  # local today of both fake accounts at NOW


@pytest.fixture
def account_partitions() -> list[str]:
    """The `meta_ad_account` partitions the instance starts with; a module may override it."""
    return ["act_101", "act_202"]


@pytest.fixture
def instance(tmp_path, account_partitions: list[str]) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance whose home is `tmp_path / "dagster_home"`."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        if account_partitions:
            instance.add_dynamic_partitions(ACCOUNT_PARTITIONS_NAME, account_partitions)
        yield instance


@pytest.fixture
def rastro_at(
    duckdb_path, fake_graph, linked_world, secrets_key
) -> Callable[[datetime], RastroResource]:
    """The resource on the linked warehouse and the loopback fake Graph, its clock pinned."""

    def at(instant: datetime) -> RastroResource:
        return RastroResource(
            duckdb_path=str(duckdb_path),
            graph_url=fake_graph.base_url,
            use_fake_graph=False,
            fixed_now=instant.isoformat(),
        )

    return at


@pytest.fixture
def rastro(rastro_at) -> RastroResource:
    """`rastro_at(NOW)`."""
    return rastro_at(NOW)
